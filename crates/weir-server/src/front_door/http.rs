//! The HTTP API (axum): JSON in and out, `{error, detail}` on every error.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::json;
use weir::policy::PolicyConfig;
use weir_api::http::{
    AcquireBody, Admission, BusyBody, Refusal, ReleaseBody, Released, RenewBody, Renewed, Tightened,
};

use crate::app::{AcquireInput, AcquireOutcome, App, MAX_BODY_BYTES, ThrottleQuery};
use crate::error::ApiError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            Json(json!({ "error": self.code, "detail": self.detail })),
        )
            .into_response()
    }
}

/// A JSON body whose rejections are `{error, detail}` with a fitting status, read within the
/// body timeout and at most [`MAX_BODY_BYTES`] of it, and refused from its `Content-Length`
/// when too large.
///
/// The timeout costs nothing in the common case: `tokio::time::timeout` polls the read first,
/// and a small body that came with its headers is read at once, without arming a timer (a
/// tower body-timeout layer armed one per request: about 7 % of the throughput, measured).
/// The size limit is enforced here too, where the body is read, rather than by axum's
/// `DefaultBodyLimit` layer: a layer on the router wraps every route in one more boxed
/// service, cloned and called per request (about 2 000 instructions a request, measured).
struct ApiJson<T>(T);

impl<T> FromRequest<Arc<App>> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        if let Some(refusal) = refuse_oversized(&request) {
            return Err(drain_then(request, refusal, app.body_timeout()).await);
        }
        if !is_json(request.headers()) {
            let error =
                ApiError::invalid("send the body as JSON with `Content-Type: application/json`");
            return Err(error.into_response());
        }
        let read = tokio::time::timeout(app.body_timeout(), read_body(request.into_body()));
        let error = match read.await {
            Ok(Ok(bytes)) => match Json::<T>::from_bytes(&bytes) {
                Ok(Json(value)) => return Ok(ApiJson(value)),
                Err(rejection) => ApiError::invalid(rejection.body_text()),
            },
            Err(_) => ApiError {
                status: 408,
                code: "body_timeout",
                detail: "the request body did not arrive in full within `server.body_timeout`"
                    .into(),
            },
            Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => too_large(),
            Ok(Err(_)) => ApiError::invalid("the request body could not be read in full"),
        };
        Err(error.into_response())
    }
}

/// The whole of a body of at most [`MAX_BODY_BYTES`]: the one chunk most bodies arrive in,
/// as it arrived, or the chunks joined.
async fn read_body(body: axum::body::Body) -> Result<bytes::Bytes, axum::BoxError> {
    use http_body::Body as _;
    let mut body = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    let first = loop {
        match body.frame().await {
            None => return Ok(bytes::Bytes::new()),
            // Trailers are not part of the body.
            Some(frame) => match frame?.into_data() {
                Ok(data) => break data,
                Err(_) => continue,
            },
        }
    };
    if body.is_end_stream() {
        return Ok(first);
    }
    let mut joined = bytes::BytesMut::from(&first[..]);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            joined.extend_from_slice(&data);
        }
    }
    Ok(joined.freeze())
}

/// Whether the request says its body is JSON: `application/json`, or any `application/…+json`,
/// with or without parameters — what axum's `Json` accepts.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    // What nearly every client sends, without splitting and trimming.
    if value.as_bytes().eq_ignore_ascii_case(b"application/json") {
        return true;
    }
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.as_bytes();
    let ends_with_json =
        subtype.len() >= 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case(b"+json");
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case(b"json") || ends_with_json)
}

fn too_large() -> ApiError {
    ApiError {
        status: 413,
        code: "too_large",
        detail: format!("the body is larger than {MAX_BODY_BYTES} bytes"),
    }
}

/// How much of an over-limit body is read and thrown away before the 413 is sent.
const DRAIN_BYTES: usize = 1 << 20;

/// How to answer a body whose `Content-Length` is over the limit, decided before it is read:
/// `Some(true)` to read it away first, `Some(false)` to answer at once, `None` if it fits.
///
/// A client that asked `Expect: 100-continue` gets the 413 instead of the 100, and sends
/// nothing. One that sent its body straight away would, if the server answered and closed
/// with the body unread, see its connection reset and often never read the 413 (a broken
/// pipe); so, as nginx's lingering close does, up to [`DRAIN_BYTES`] of it are read and
/// dropped first (within the body timeout), and the connection closed after.
fn refuse_oversized(request: &Request) -> Option<bool> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())?;
    if declared <= MAX_BODY_BYTES as u64 {
        return None;
    }
    let expects_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Some(!expects_continue)
}

/// The 413 for an oversized body, after reading it away if `drain` (see [`refuse_oversized`]).
async fn drain_then(request: Request, drain: bool, within: Duration) -> Response {
    if drain {
        let body = request.into_body();
        let _ = tokio::time::timeout(within, axum::body::to_bytes(body, DRAIN_BYTES)).await;
    }
    let mut response = too_large().into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The HTTP API's routes: what the router matches, and what the `endpoint` label says.
mod route {
    pub const ACQUIRE: &str = "/v1/acquire";
    pub const RELEASE: &str = "/v1/release";
    pub const RENEW: &str = "/v1/renew";
    pub const BUSY: &str = "/v1/busy";
    pub const POLICIES: &str = "/v1/policies";
    pub const POLICY: &str = "/v1/policies/{name}";
    pub const THROTTLES: &str = "/v1/throttles";
    pub const CLUSTER: &str = "/v1/cluster";
    pub const STATS: &str = "/v1/stats";
    pub const UI: &str = "/ui";
    pub const UI_ASSET: &str = "/ui/{asset}";
    pub const METRICS: &str = "/metrics";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    /// The label of a path no route matches.
    pub const UNMATCHED: &str = "unmatched";
}

/// The route a request's path matches, as the router would match it (a test holds the two
/// together), or [`route::UNMATCHED`].
fn endpoint_of(path: &str) -> &'static str {
    match path {
        route::ACQUIRE => route::ACQUIRE,
        route::RELEASE => route::RELEASE,
        route::RENEW => route::RENEW,
        route::BUSY => route::BUSY,
        route::POLICIES => route::POLICIES,
        route::THROTTLES => route::THROTTLES,
        route::CLUSTER => route::CLUSTER,
        route::STATS => route::STATS,
        route::UI => route::UI,
        route::METRICS => route::METRICS,
        route::HEALTHZ => route::HEALTHZ,
        route::READYZ => route::READYZ,
        _ if one_segment_after(path, "/v1/policies/") => route::POLICY,
        _ if one_segment_after(path, "/ui/") => route::UI_ASSET,
        _ => route::UNMATCHED,
    }
}

/// Whether `path` is `prefix` and one non-empty segment after it: what a route ending in a
/// `{parameter}` matches.
fn one_segment_after(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// The router for `app`, counted: every answered request by route and status.
pub fn router(app: Arc<App>) -> HttpApi {
    HttpApi {
        router: routes(Arc::clone(&app)),
        app,
    }
}

fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route(route::ACQUIRE, post(acquire))
        .route(route::RELEASE, post(release))
        .route(route::RENEW, post(renew))
        .route(route::BUSY, post(busy))
        .route(route::POLICIES, get(list_policies))
        .route(
            route::POLICY,
            get(get_policy).put(put_policy).delete(delete_policy),
        )
        .route(route::THROTTLES, get(throttles))
        .route(route::CLUSTER, get(cluster))
        .route(route::STATS, get(stats))
        .route(route::UI, get(super::ui::page))
        .route(route::UI_ASSET, get(super::ui::asset))
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
/// middleware boxes each request's future too (together about 1 700 instructions a request,
/// measured). Outside the router, the route is found from the path by `endpoint_of`.
#[derive(Clone)]
pub struct HttpApi {
    router: Router,
    app: Arc<App>,
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
        let endpoint = endpoint_of(request.uri().path());
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
    ApiError {
        status: 404,
        code: "not_found",
        detail: "no such endpoint; see docs/configuration.md for the API".into(),
    }
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError {
        status: 405,
        code: "method_not_allowed",
        detail: format!(
            "{} is not allowed on {}; see docs/configuration.md for the API",
            request.method(),
            request.uri().path()
        ),
    }
}

/// Proof that an admin call carries the admin token (or that none is configured).
///
/// An extractor from the request's head, so it runs before the body is read or parsed: a caller
/// without the token learns nothing from how the server reads its body.
struct Admin;

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        app.check_admin(
            header_str(&parts.headers, header::AUTHORIZATION),
            host_of(parts),
        )?;
        Ok(Admin)
    }
}

/// Proof that a data-plane call (acquire, release, renew, busy) may be served: it carries the
/// data token if one is configured, and, on a server without an admin token, was sent to a
/// loopback or listed host.
struct DataPlane;

impl FromRequestParts<Arc<App>> for DataPlane {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        app.check_data(
            header_str(&parts.headers, header::AUTHORIZATION),
            host_of(parts),
        )?;
        Ok(DataPlane)
    }
}

/// The host a request was sent to: HTTP/2's authority, or HTTP/1's `Host` header.
fn host_of(parts: &axum::http::request::Parts) -> Option<&str> {
    parts
        .uri
        .authority()
        .map(|authority| authority.as_str())
        .or_else(|| header_str(&parts.headers, header::HOST))
}

/// `RateLimit-Policy` (and, when refused, `RateLimit`) per the IETF draft: the quota is the
/// bucket's limit per one-second window; on a refusal the remaining quota is 0 and the reset is
/// the retry-after. Remaining quota on admission is not reported: reading it would cost every
/// decision a second lookup.
///
/// Every admission carries `RateLimit-Policy`, so its value is made once per policy and limit
/// and remembered (see [`policy_header`]), and the headers' names are constants rather than
/// parsed per response.
fn rate_limit_headers(
    headers: &mut HeaderMap,
    policy: &str,
    limit: Option<f64>,
    retry: Option<Duration>,
) {
    const RATELIMIT_POLICY: header::HeaderName =
        header::HeaderName::from_static("ratelimit-policy");
    const RATELIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit");
    let Some(limit) = limit else {
        return;
    };
    if let Some(value) = policy_header(policy, limit.floor()) {
        headers.insert(RATELIMIT_POLICY, value);
    }
    if let Some(retry) = retry {
        let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
        let mut value = Vec::with_capacity(policy.len() + 32);
        value.push(b'"');
        value.extend_from_slice(policy.as_bytes());
        value.extend_from_slice(b"\";r=0;t=");
        value.extend_from_slice(itoa::Buffer::new().format(seconds).as_bytes());
        if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
            headers.insert(RATELIMIT, value);
        }
    }
}

/// The most `RateLimit-Policy` values a thread remembers.
const MAX_POLICY_HEADERS: usize = 64;

thread_local! {
    /// `RateLimit-Policy` values this thread has written, by policy and quota, the most
    /// recently used first: a server's traffic is mostly a few policies.
    static POLICY_HEADERS: std::cell::RefCell<Vec<(Box<str>, u64, HeaderValue)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `"policy";q=QUOTA;w=1`, made once per policy and quota per thread (a `HeaderValue`'s clone
/// shares its bytes).
fn policy_header(policy: &str, quota: f64) -> Option<HeaderValue> {
    let bits = quota.to_bits();
    let remembered = POLICY_HEADERS.with_borrow_mut(|values| {
        let at = values
            .iter()
            .position(|(name, q, _)| *q == bits && **name == *policy)?;
        values[..=at].rotate_right(1);
        Some(values[0].2.clone())
    });
    if remembered.is_some() {
        return remembered;
    }
    let mut value = Vec::with_capacity(policy.len() + 32);
    value.push(b'"');
    value.extend_from_slice(policy.as_bytes());
    value.extend_from_slice(b"\";q=");
    write_quota(&mut value, quota);
    value.extend_from_slice(b";w=1");
    let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()?;
    POLICY_HEADERS.with_borrow_mut(|values| {
        values.truncate(MAX_POLICY_HEADERS - 1);
        values.insert(0, (policy.into(), bits, value.clone()));
    });
    Some(value)
}

/// A whole quota as `f64`'s `Display` writes it: the integer's digits up to 2^53, where every
/// integer is exact and the two agree; past it, `Display` itself.
fn write_quota(out: &mut Vec<u8>, quota: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if quota.is_sign_positive() && quota <= EXACT {
        out.extend_from_slice(itoa::Buffer::new().format(quota as u64).as_bytes());
    } else {
        out.extend_from_slice(quota.to_string().as_bytes());
    }
}

async fn acquire(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<AcquireBody>,
) -> Result<Response, ApiError> {
    let input = AcquireInput {
        policy: body.policy,
        key: body.key,
        kind: body.kind,
        cost: body.cost,
        max_wait_ms: body.max_wait_ms,
    };
    let outcome = app.acquire(&input).await?;
    let policy = input.policy;
    Ok(match outcome {
        AcquireOutcome::Admitted {
            waited,
            lease,
            would_throttle,
            limit,
            tier,
        } => {
            let lease_ttl_ms = lease.as_ref().map(|(_, ttl)| ttl.as_millis() as u64);
            let body = Admission {
                admitted: true,
                waited_ms: waited.as_millis() as u64,
                tier: Cow::Borrowed(tier),
                lease: lease.map(|(lease, _)| Cow::Owned(lease)),
                lease_ttl_ms,
                would_throttle,
            };
            let mut response = Json(body).into_response();
            rate_limit_headers(response.headers_mut(), &policy, limit, None);
            response
        }
        AcquireOutcome::Refused {
            retry_after,
            reason,
            limit,
        } => {
            let body = Refusal {
                admitted: false,
                retry_after_ms: retry_after.map(|r| r.as_millis() as u64),
                reason: Cow::Owned(reason),
            };
            let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
            let headers = response.headers_mut();
            if let Some(retry) = retry_after {
                let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
                headers.insert(header::RETRY_AFTER, seconds.max(1).into());
            }
            rate_limit_headers(
                headers,
                &policy,
                limit,
                retry_after.or(Some(Duration::ZERO)),
            );
            response
        }
    })
}

async fn release(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<Released>, ApiError> {
    app.release(&body.lease)?;
    Ok(Json(Released { released: true }))
}

async fn renew(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    let left = app.renew(&body.lease, body.ttl_ms).await?;
    Ok(Json(Renewed {
        expires_in_ms: left.as_millis() as u64,
    }))
}

async fn busy(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<BusyBody>,
) -> Result<Json<Tightened>, ApiError> {
    let tightened = app.busy(&body.policy)?;
    Ok(Json(Tightened { tightened }))
}

async fn list_policies(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let policies: Vec<serde_json::Value> = app
        .all_policies()
        .into_iter()
        .map(|p| json!({ "policy": p.config, "etag": p.etag }))
        .collect();
    Json(json!({ "policies": policies }))
}

fn with_etag(body: serde_json::Value, status: StatusCode, etag: &str) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

async fn get_policy(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let tagged = app.policy(&name)?;
    let body =
        serde_json::to_value(&tagged.config).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(with_etag(body, StatusCode::OK, &tagged.etag))
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn put_policy(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(config): ApiJson<PolicyConfig>,
) -> Result<Response, ApiError> {
    let (created, stored) = app
        .put_policy(&name, config, header_str(&headers, header::IF_MATCH))
        .await?;
    let body =
        serde_json::to_value(&stored.config).map_err(|e| ApiError::internal(e.to_string()))?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_etag(body, status, &stored.etag))
}

async fn delete_policy(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let deleted = app
        .delete_policy(&name, header_str(&headers, header::IF_MATCH))
        .await?;
    let body =
        serde_json::to_value(&deleted.config).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(with_etag(body, StatusCode::OK, &deleted.etag))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThrottleParams {
    policy: Option<String>,
    node: Option<String>,
    sort: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    scope: Option<String>,
}

async fn throttles(
    State(app): State<Arc<App>>,
    query: Result<Query<ThrottleParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    match params.scope.as_deref() {
        None | Some("node") | Some("cluster") => {}
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`scope` must be `node` or `cluster`, got `{other}`"
            )));
        }
    }
    let query = ThrottleQuery {
        policy: params.policy,
        node: params.node,
        sort: params.sort,
        order: params.order,
        limit: params.limit,
    };
    let rows = if params.scope.as_deref() == Some("cluster") {
        app.cluster_throttles(&query).await?
    } else {
        app.throttles(&query)?
    };
    Ok(Json(json!({ "rows": rows })))
}

async fn cluster(State(app): State<Arc<App>>) -> Json<weir_api::http::ClusterView> {
    Json(app.cluster())
}

async fn stats(State(app): State<Arc<App>>) -> Json<crate::app::StatsView> {
    Json(app.stats())
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics().render(),
    )
        .into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.not_ready_because() {
        None => Json(json!({ "status": "ready" })).into_response(),
        Some(why) => ApiError {
            status: 503,
            code: "not_ready",
            detail: why,
        }
        .into_response(),
    }
}

#[cfg(test)]
mod tests;
