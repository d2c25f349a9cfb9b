//! The HTTP API (axum): JSON in and out, `{error, detail}` on every error.

mod access;
mod body;
mod cluster_members;
mod handlers;
mod headers;
mod openapi;
mod policy_override;
mod ui;

pub(crate) use body::ErrorBody;

use handlers::{
    acquire, busy, cluster, delete_policy, get_policy, healthz, list_policies, metrics, put_policy,
    readyz, release, renew, stats, throttles,
};
use openapi::openapi;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{delete, get, post};

use crate::app::App;
use crate::error::{ApiError, ErrorKind};

/// The HTTP API's routes: what the router matches, and what the `endpoint` label says.
mod route {
    pub const ACQUIRE: &str = "/v1/acquire";
    pub const RELEASE: &str = "/v1/release";
    pub const RENEW: &str = "/v1/renew";
    pub const BUSY: &str = "/v1/busy";
    pub const POLICIES: &str = "/v1/policies";
    pub const POLICY: &str = "/v1/policies/{name}";
    pub const POLICY_OVERRIDE: &str = "/v1/policies/{name}/override";
    pub const THROTTLES: &str = "/v1/throttles";
    pub const CLUSTER: &str = "/v1/cluster";
    pub const CLUSTER_MEMBER: &str = "/v1/cluster/members/{id}";
    pub const STATS: &str = "/v1/stats";
    pub const OPENAPI: &str = "/v1/openapi.json";
    pub const UI: &str = "/ui";
    pub const UI_ASSET: &str = "/ui/{asset}";
    pub const METRICS: &str = "/metrics";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    /// Every route the router has.
    #[cfg(test)]
    pub const ALL: [&str; 17] = [
        ACQUIRE,
        RELEASE,
        RENEW,
        BUSY,
        POLICIES,
        POLICY,
        POLICY_OVERRIDE,
        THROTTLES,
        CLUSTER,
        CLUSTER_MEMBER,
        STATS,
        OPENAPI,
        UI,
        UI_ASSET,
        METRICS,
        HEALTHZ,
        READYZ,
    ];
    /// The label of a path no route matches.
    pub const UNMATCHED: &str = "unmatched";
}

/// Routes another front door serves on the HTTP port, and their paths (each its own
/// `endpoint` label).
pub struct OtherRoutes {
    /// The routes.
    pub router: Router<Arc<App>>,
    /// Their paths, exact (no parameters).
    pub paths: Vec<&'static str>,
}

impl OtherRoutes {
    /// No routes.
    pub fn none() -> Self {
        OtherRoutes {
            router: Router::new(),
            paths: Vec::new(),
        }
    }

    /// These routes and `other`'s.
    pub fn merge(mut self, other: OtherRoutes) -> Self {
        self.paths.extend(other.paths);
        OtherRoutes {
            router: self.router.merge(other.router),
            paths: self.paths,
        }
    }
}

/// The route a request's path matches, as the router would match it (a test holds the two
/// together), or another front door's path among `others`, or [`route::UNMATCHED`].
fn endpoint_of(path: &str, others: &[&'static str]) -> &'static str {
    match path {
        route::ACQUIRE => route::ACQUIRE,
        route::RELEASE => route::RELEASE,
        route::RENEW => route::RENEW,
        route::BUSY => route::BUSY,
        route::POLICIES => route::POLICIES,
        route::THROTTLES => route::THROTTLES,
        route::CLUSTER => route::CLUSTER,
        route::STATS => route::STATS,
        route::OPENAPI => route::OPENAPI,
        route::UI => route::UI,
        route::METRICS => route::METRICS,
        route::HEALTHZ => route::HEALTHZ,
        route::READYZ => route::READYZ,
        _ if one_segment_after(path, "/v1/policies/") => route::POLICY,
        _ if path
            .strip_suffix("/override")
            .is_some_and(|policy| one_segment_after(policy, "/v1/policies/")) =>
        {
            route::POLICY_OVERRIDE
        }
        _ if one_segment_after(path, "/v1/cluster/members/") => route::CLUSTER_MEMBER,
        _ if one_segment_after(path, "/ui/") => route::UI_ASSET,
        _ => others
            .iter()
            .find(|other| **other == path)
            .copied()
            .unwrap_or(route::UNMATCHED),
    }
}

/// Whether `path` is `prefix` and one non-empty segment after it: what a route ending in a
/// `{parameter}` matches.
fn one_segment_after(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// Serves the HTTP API (and the live page) on `listener`, over `tls` if given, until the drain;
/// `others` are the routes other front doors serve on the HTTP port (the registered doors').
pub fn start(
    app: &Arc<App>,
    listener: tokio::net::TcpListener,
    limits: crate::connections::HttpLimits,
    tls: Option<Arc<crate::tls::Tls>>,
    others: OtherRoutes,
) -> tokio::task::JoinHandle<()> {
    let app = Arc::clone(app);
    let router = HttpApi {
        router: routes(Arc::clone(&app), others.router),
        app: Arc::clone(&app),
        others: others.paths.into(),
    };
    tokio::spawn(async move {
        crate::connections::serve_http(listener, router, limits, tls, async move {
            app.health().shutting_down().await
        })
        .await
    })
}

fn routes(app: Arc<App>, others: Router<Arc<App>>) -> Router {
    Router::new()
        .merge(others)
        .route(route::ACQUIRE, post(acquire))
        .route(route::RELEASE, post(release))
        .route(route::RENEW, post(renew))
        .route(route::BUSY, post(busy))
        .route(route::POLICIES, get(list_policies))
        .route(
            route::POLICY,
            get(get_policy).put(put_policy).delete(delete_policy),
        )
        .route(route::POLICY_OVERRIDE, delete(policy_override::revert))
        .route(route::THROTTLES, get(throttles))
        .route(route::CLUSTER, get(cluster))
        .route(route::CLUSTER_MEMBER, delete(cluster_members::forget))
        .route(route::STATS, get(stats))
        .route(route::OPENAPI, get(openapi))
        .route(route::UI, get(ui::page))
        .route(route::UI_ASSET, get(ui::asset))
        .route(route::METRICS, get(metrics))
        .route(route::HEALTHZ, get(healthz))
        .route(route::READYZ, get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

/// The HTTP API: the router, with every answered request counted by route and status.
///
/// Counted around the router rather than by a layer on its routes: `Router::layer` wraps
/// every route in one more boxed service, cloned and called per request, and `from_fn`
/// middleware boxes each request's future too (measured: `docs/benchmarks.md`). Outside the router, the route is found from the path by `endpoint_of`.
#[derive(Clone)]
pub struct HttpApi {
    router: Router,
    app: Arc<App>,
    /// Other front doors' paths.
    others: Arc<[&'static str]>,
}

impl<B> tower::Service<axum::http::Request<B>> for HttpApi
where
    Router: tower::Service<axum::http::Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Counted<<Router as tower::Service<axum::http::Request<B>>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<axum::http::Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let endpoint = endpoint_of(request.uri().path(), &self.others);
        Counted {
            start: Instant::now(),
            answer: self.router.call(request),
            app: Arc::clone(&self.app),
            endpoint,
        }
    }
}

pin_project_lite::pin_project! {
    /// An answer of the HTTP API; counted when it is ready.
    pub struct Counted<F> {
        #[pin]
        answer: F,
        app: Arc<App>,
        endpoint: &'static str,
        start: Instant,
    }
}

impl<F> Future for Counted<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(response) = std::task::ready!(this.answer.poll(cx));
        this.app.metrics().observe(
            "http",
            this.endpoint,
            status_label(response.status()),
            this.start.elapsed(),
        );
        Poll::Ready(Ok(response))
    }
}

/// A status code as the label `code` shows: the common ones without a lookup.
fn status_label(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 => "200",
        201 => "201",
        429 => "429",
        _ => crate::metrics::intern(status.as_str()),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        "no such endpoint; see docs/configuration.md for the API",
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        format!(
            "{} is not allowed on {}; see docs/configuration.md for the API",
            request.method(),
            request.uri().path()
        ),
    )
}

thread_local! {
    /// `RateLimit-Policy` values this thread has written, by policy and quota, the most
    /// recently used first: a server's traffic is mostly a few policies.
    static POLICY_HEADERS: std::cell::RefCell<Vec<(Box<str>, u64, HeaderValue)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests;
