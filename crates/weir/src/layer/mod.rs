//! tower layers (feature `tower`): Weir around a client or in front of a server.
//!
//! - [`ThrottleLayer`] wraps a *client* of a shared server (say, a meta service's): each
//!   call waits for its RPC type's host-level token and its key's backpressure slot, is recorded
//!   after it completes, and a "busy" answer (by default HTTP 429 or 503, or gRPC
//!   `RESOURCE_EXHAUSTED`) tightens the hottest keys.
//! - [`PolicyLayer`] puts a [`Policy`](crate::policy::Policy) in front of a *server*: requests are
//!   keyed by an extractor and admitted, made to wait (if the policy says `wait`), or shed with
//!   429 (gRPC:
//!   `RESOURCE_EXHAUSTED`) and a retry-after. The admission — and any concurrency permit — is
//!   released when the response future completes or is dropped.
//!
//! Both hold their state behind `Arc`s: clones of a layer or a service share one set of limits
//! (tower's own `RateLimit` gives each clone its own budget, which surprises its users).

mod client;
mod server;

pub use client::{BusyWhen, HttpBusy, IsBusy, ThrottleLayer, ThrottleService};
pub use server::{Extracted, PolicyLayer, PolicyService};

/// A boxed, sendable future: what the services here return.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
