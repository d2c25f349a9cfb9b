//! The HTTP API (axum): JSON in and out, `{error, detail}` on every error.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::{BytesRejection, FailedToBufferBody, JsonRejection};
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
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

/// `Json<T>` whose rejections are `{error, detail}` with a fitting status, read within the
/// body timeout, and refused from its `Content-Length` when too large.
///
/// The timeout costs nothing in the common case: `tokio::time::timeout` polls the read first,
/// and a small body that came with its headers is read at once, without arming a timer (a
/// tower body-timeout layer armed one per request: about 7 % of the throughput, measured).
struct ApiJson<T>(T);

impl<T> FromRequest<Arc<App>> for ApiJson<T>
where
    Json<T>: FromRequest<Arc<App>, Rejection = JsonRejection>,
{
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        if let Some(refusal) = refuse_oversized(&request) {
            return Err(drain_then(request, refusal, app.body_timeout()).await);
        }
        let read = tokio::time::timeout(app.body_timeout(), Json::<T>::from_request(request, app));
        let error = match read.await {
            Ok(Ok(Json(value))) => return Ok(ApiJson(value)),
            Err(_) => ApiError {
                status: 408,
                code: "body_timeout",
                detail: "the request body did not arrive in full within `server.body_timeout`"
                    .into(),
            },
            Ok(Err(JsonRejection::BytesRejection(BytesRejection::FailedToBufferBody(
                FailedToBufferBody::LengthLimitError(_),
            )))) => too_large(),
            Ok(Err(JsonRejection::BytesRejection(BytesRejection::FailedToBufferBody(_)))) => {
                ApiError::invalid("the request body could not be read in full")
            }
            Ok(Err(JsonRejection::MissingJsonContentType(_))) => {
                ApiError::invalid("send the body as JSON with `Content-Type: application/json`")
            }
            Ok(Err(rejection)) => ApiError::invalid(rejection.body_text()),
        };
        Err(error.into_response())
    }
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

/// The router for `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .route("/v1/renew", post(renew))
        .route("/v1/busy", post(busy))
        .route("/v1/policies", get(list_policies))
        .route(
            "/v1/policies/{name}",
            get(get_policy).put(put_policy).delete(delete_policy),
        )
        .route("/v1/throttles", get(throttles))
        .route("/v1/cluster", get(cluster))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), observe))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// Counts every answered request by route and status.
async fn observe(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    // The router's own routes, and the statuses this server answers: both small fixed sets.
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| crate::metrics::intern(p.as_str()));
    let start = Instant::now();
    let response = next.run(request).await;
    app.metrics().observe(
        "http",
        endpoint,
        crate::metrics::intern(response.status().as_str()),
        start.elapsed(),
    );
    response
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
        app.check_admin(header_str(&parts.headers, header::AUTHORIZATION))?;
        Ok(Admin)
    }
}

/// `RateLimit-Policy` (and, when refused, `RateLimit`) per the IETF draft: the quota is the
/// bucket's limit per one-second window; on a refusal the remaining quota is 0 and the reset is
/// the retry-after. Remaining quota on admission is not reported: reading it would cost every
/// decision a second lookup.
fn rate_limit_headers(
    headers: &mut HeaderMap,
    policy: &str,
    limit: Option<f64>,
    retry: Option<Duration>,
) {
    if let Some(limit) = limit {
        if let Ok(value) = HeaderValue::from_str(&format!("\"{policy}\";q={};w=1", limit.floor())) {
            headers.insert("ratelimit-policy", value);
        }
        if let Some(retry) = retry {
            let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
            if let Ok(value) = HeaderValue::from_str(&format!("\"{policy}\";r=0;t={seconds}")) {
                headers.insert("ratelimit", value);
            }
        }
    }
}

async fn acquire(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<AcquireBody>,
) -> Result<Response, ApiError> {
    let policy = body.policy.clone();
    let outcome = app
        .acquire(AcquireInput {
            policy: body.policy,
            key: body.key,
            kind: body.kind,
            cost: body.cost,
            max_wait_ms: body.max_wait_ms,
        })
        .await?;
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
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<Released>, ApiError> {
    app.release(&body.lease)?;
    Ok(Json(Released { released: true }))
}

async fn renew(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    let left = app.renew(&body.lease, body.ttl_ms).await?;
    Ok(Json(Renewed {
        expires_in_ms: left.as_millis() as u64,
    }))
}

async fn busy(
    State(app): State<Arc<App>>,
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
    if app.is_ready() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        ApiError {
            status: 503,
            code: "not_ready",
            detail: "starting up or shutting down".into(),
        }
        .into_response()
    }
}
