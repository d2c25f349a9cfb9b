//! The server-side `PolicyLayer`: a Weir policy in front of a service.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxFuture, ready_then_call};
use crate::clock::Clock;
use crate::policy::{Policy, Rejection, Request};

/// What the extractor takes from a request to decide on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The bucket (tenant, user, …).
    pub key: String,
    /// The kind of work, if it has one.
    pub kind: Option<String>,
    /// What the request costs (usually 1).
    pub cost: u64,
}

impl Extracted {
    /// A request of cost 1 and no kind for `key`.
    pub fn key(key: impl Into<String>) -> Self {
        Extracted {
            key: key.into(),
            kind: None,
            cost: 1,
        }
    }
}

/// Puts `policy` in front of a service; see the [module docs](super).
///
/// `extract` names each request's key (`None`: the request has no key and passes, counted as
/// unkeyed). The policy's own `on_exhausted` decides between waiting and shedding at once.
pub struct PolicyLayer<C: Clock + Clone, F> {
    policy: Arc<Policy<C>>,
    extract: Arc<F>,
}

impl<C: Clock + Clone, F> Clone for PolicyLayer<C, F> {
    fn clone(&self) -> Self {
        PolicyLayer {
            policy: Arc::clone(&self.policy),
            extract: Arc::clone(&self.extract),
        }
    }
}

impl<C: Clock + Clone, F> PolicyLayer<C, F> {
    /// A layer applying `policy` to requests keyed by `extract`.
    pub fn new(policy: Arc<Policy<C>>, extract: F) -> Self {
        PolicyLayer {
            policy,
            extract: Arc::new(extract),
        }
    }
}

impl<S, C: Clock + Clone, F> Layer<S> for PolicyLayer<C, F> {
    type Service = PolicyService<S, C, F>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`PolicyLayer`].
pub struct PolicyService<S, C: Clock + Clone, F> {
    inner: S,
    layer: PolicyLayer<C, F>,
}

impl<S: Clone, C: Clock + Clone, F> Clone for PolicyService<S, C, F> {
    fn clone(&self) -> Self {
        PolicyService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, C, F, ReqBody, ResBody> Service<http::Request<ReqBody>> for PolicyService<S, C, F>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    C: Clock + Clone,
    F: Fn(&http::Request<ReqBody>) -> Option<Extracted> + Send + Sync + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<ResBody>, S::Error>>;

    /// Always ready: the decision needs the request, so it is made inside the call's future,
    /// and only an admitted request drives the inner service to readiness (see the
    /// [module docs](super)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let extracted = (self.layer.extract)(&request);
        let policy = Arc::clone(&self.layer.policy);
        Box::pin(async move {
            let Some(extracted) = extracted else {
                policy.pass_unkeyed(None);
                return ready_then_call(inner, request).await;
            };
            let grpc = is_grpc(&request);
            let decided = policy
                .acquire(&Request {
                    key: &extracted.key,
                    kind: extracted.kind.as_deref(),
                    cost: extracted.cost,
                    max_wait: None,
                })
                .await;
            match decided {
                Ok(admission) => {
                    let response = ready_then_call(inner, request).await;
                    // Held until here: a dropped response future releases it too.
                    drop(admission);
                    response
                }
                Err(rejection) => Ok(shed(&rejection, grpc)),
            }
        })
    }
}

impl<S, C: Clock + Clone, F> PolicyService<S, C, F> {
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

fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

/// The answer to a shed request: 429 with `Retry-After` (whole seconds, rounded up), or for
/// gRPC a trailers-only `RESOURCE_EXHAUSTED` carrying the same hint.
fn shed<B: Default>(rejection: &Rejection, grpc: bool) -> http::Response<B> {
    let mut response = http::Response::new(B::default());
    let headers = response.headers_mut();
    if let Some(after) = rejection.retry_after() {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        headers.insert(http::header::RETRY_AFTER, seconds.max(1).into());
    }
    if grpc {
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        let message = rejection.to_string().replace('%', "%25");
        if let Ok(value) = http::HeaderValue::from_str(&message) {
            headers.insert("grpc-message", value);
        }
    } else {
        *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    }
    response
}
