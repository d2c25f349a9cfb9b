//! The client-side `ThrottleLayer`: host-level limits and adaptive backpressure around calls.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxFuture, ready_then_call};
use crate::backpressure::Backpressure;
use crate::backpressure::host::HostLimiter;
use crate::clock::Clock;

/// Says whether a call's outcome means "the server is busy".
pub trait IsBusy<T> {
    /// True if `outcome` is a busy answer.
    fn is_busy(&self, outcome: &T) -> bool;
}

/// The default classifier: HTTP 429 or 503, or a gRPC status `RESOURCE_EXHAUSTED` (8) in the
/// response headers (a trailers-only response, which is how servers shed load).
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpBusy;

impl<B, E> IsBusy<Result<http::Response<B>, E>> for HttpBusy {
    fn is_busy(&self, outcome: &Result<http::Response<B>, E>) -> bool {
        let Ok(response) = outcome else {
            return false;
        };
        matches!(
            response.status(),
            http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE
        ) || response
            .headers()
            .get("grpc-status")
            .is_some_and(|status| status.as_bytes() == b"8")
    }
}

/// A classifier from a closure.
#[derive(Debug, Clone, Copy)]
pub struct BusyWhen<F>(pub F);

impl<T, F: Fn(&T) -> bool> IsBusy<T> for BusyWhen<F> {
    fn is_busy(&self, outcome: &T) -> bool {
        (self.0)(outcome)
    }
}

/// Wraps a client so that every call is throttled by Weir; see the [module docs](super).
///
/// `target` names each call's RPC type and key (`None`: the call is not throttled or recorded).
pub struct ThrottleLayer<C: Clock + Clone, F, P = HttpBusy> {
    backpressure: Arc<Backpressure<C>>,
    host: Option<Arc<HostLimiter<C>>>,
    target: Arc<F>,
    busy: P,
    /// A call that took at least this long (on the controller's clock) is a busy signal too.
    slow: Option<Duration>,
}

impl<C: Clock + Clone, F, P: Clone> Clone for ThrottleLayer<C, F, P> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            backpressure: Arc::clone(&self.backpressure),
            host: self.host.clone(),
            target: Arc::clone(&self.target),
            busy: self.busy.clone(),
            slow: self.slow,
        }
    }
}

impl<C: Clock + Clone, F> ThrottleLayer<C, F, HttpBusy> {
    /// A layer feeding `backpressure`, naming calls with `target`, classifying HTTP/gRPC
    /// responses as busy with [`HttpBusy`].
    pub fn new(backpressure: Arc<Backpressure<C>>, target: F) -> Self {
        ThrottleLayer {
            backpressure,
            host: None,
            target: Arc::new(target),
            busy: HttpBusy,
            slow: None,
        }
    }
}

impl<C: Clock + Clone, F, P> ThrottleLayer<C, F, P> {
    /// Also waits for the RPC type's host-level token before each call.
    pub fn host_limits(mut self, host: Arc<HostLimiter<C>>) -> Self {
        self.host = Some(host);
        self
    }

    /// Classifies outcomes with `busy` instead. (An error rate as the busy signal:
    /// `BusyWhen(|outcome: &Result<_, _>| outcome.is_err())`.)
    pub fn busy_when<Q>(self, busy: Q) -> ThrottleLayer<C, F, Q> {
        ThrottleLayer {
            backpressure: self.backpressure,
            host: self.host,
            target: self.target,
            busy,
            slow: self.slow,
        }
    }

    /// Also takes a call that ran for `threshold` or longer as a busy signal, whatever its
    /// answer: a backend that slows down before it sheds is overloaded already. The time runs
    /// from when the call is sent (after any wait for its slot and for the inner service to be
    /// ready, which are the client's queueing, not the backend's) to its answer, on the
    /// controller's clock. A slow answer that is not also a busy answer was accepted: it is
    /// passed on as [`Backpressure::on_slow_for`], not counted as a refused call.
    pub fn busy_when_slower_than(mut self, threshold: Duration) -> Self {
        self.slow = Some(threshold);
        self
    }
}

impl<S, C: Clock + Clone, F, P: Clone> Layer<S> for ThrottleLayer<C, F, P> {
    type Service = ThrottleService<S, C, F, P>;

    fn layer(&self, inner: S) -> Self::Service {
        ThrottleService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`ThrottleLayer`].
pub struct ThrottleService<S, C: Clock + Clone, F, P> {
    inner: S,
    layer: ThrottleLayer<C, F, P>,
}

impl<S: Clone, C: Clock + Clone, F, P: Clone> Clone for ThrottleService<S, C, F, P> {
    fn clone(&self) -> Self {
        ThrottleService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, C, F, P, Req> Service<Req> for ThrottleService<S, C, F, P>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Req: Send + 'static,
    C: Clock + Clone,
    F: Fn(&Req) -> Option<(String, String)> + Send + Sync + 'static,
    P: IsBusy<Result<S::Response, S::Error>> + Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    /// Always ready: the call's future waits for the host limit and the backpressure throttle
    /// first, and only then drives the inner service to readiness (see the
    /// [module docs](super)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let inner = self.inner.clone();
        let target = (self.layer.target)(&request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let Some((rpc, key)) = target else {
                return ready_then_call(inner, request).await;
            };
            if let Some(host) = &layer.host {
                host.acquire(&rpc).await;
            }
            layer.backpressure.before_call(&rpc, &key).await;
            let mut inner = inner;
            let ready = std::future::poll_fn(|cx| inner.poll_ready(cx)).await;
            let sent = layer.backpressure.now();
            let outcome = match ready {
                Ok(()) => inner.call(request).await,
                Err(e) => Err(e),
            };
            layer.backpressure.after_call(&rpc, &key);
            if layer.busy.is_busy(&outcome) {
                layer.backpressure.on_busy_for(&rpc);
            } else if layer.slow.is_some_and(|threshold| {
                let took = layer.backpressure.now().saturating_sub(sent);
                took >= crate::clock::duration_to_nanos(threshold)
            }) {
                layer.backpressure.on_slow_for(&rpc);
            }
            outcome
        })
    }
}

impl<S, C: Clock + Clone, F, P> ThrottleService<S, C, F, P> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}
