//! tower layers (feature `tower`): Weir around a client or in front of a server.
//!
//! - [`ThrottleLayer`] wraps a *client* of a shared server (say, a meta service's): each
//!   call waits for its RPC type's host-level token and its key's backpressure slot, is recorded
//!   after it completes, and a "busy" answer (by default HTTP 429 or 503, or gRPC
//!   `RESOURCE_EXHAUSTED`; optionally also an answer slower than a threshold) tightens the
//!   hottest keys.
//! - [`PolicyLayer`] puts a [`Policy`](crate::policy::Policy) in front of a *server*: requests are
//!   keyed by an extractor and admitted, made to wait (if the policy says `wait`), or shed with
//!   429 (gRPC:
//!   `RESOURCE_EXHAUSTED`) and a retry-after. The admission — and any concurrency permit — is
//!   released when the response future completes or is dropped.
//!
//! Both hold their state behind `Arc`s: clones of a layer or a service share one set of limits
//! (tower's own `RateLimit` gives each clone its own budget, which surprises its users).
//!
//! Both services are always ready and decide inside the call's future, because the decision
//! needs the request. The inner service is driven to readiness only after the request has been
//! admitted: whatever readiness reserves (a `ConcurrencyLimit` permit, a pooled connection) is
//! never held by a request that is still waiting for its turn, and a shed request reserves
//! nothing at all.

mod client;
mod server;

pub use client::{BusyWhen, HttpBusy, IsBusy, ThrottleLayer, ThrottleService};
pub use server::{Extracted, PolicyLayer, PolicyService};

/// Drives `service` to readiness, then calls it with `request`.
async fn ready_then_call<S, R>(mut service: S, request: R) -> Result<S::Response, S::Error>
where
    S: tower_service::Service<R>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(request).await
}

/// A boxed, sendable future: what the services here return.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
