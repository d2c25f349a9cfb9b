//! One handler per route: the request read, the core asked, its answer written.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use weir::policy::PolicyConfig;
use weir_api::http::{
    AcquireBody, Admission, BusyBody, Refusal, ReleaseBody, Released, RenewBody, Renewed, Tightened,
};

use crate::app::{AcquireInput, AcquireOutcome, App, ThrottleQuery};
use crate::error::{ApiError, ErrorKind};

use super::access::{Admin, DataPlane};
use super::body::ApiJson;
use super::headers::rate_limit_headers;

pub(super) async fn acquire(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<AcquireBody>,
) -> Result<Response, ApiError> {
    let input = AcquireInput {
        policy: body.policy,
        key: body.key,
        kind: (!body.kind.is_empty()).then_some(body.kind),
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
                tier: Cow::Borrowed(tier.name()),
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

pub(super) async fn release(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<Released>, ApiError> {
    app.release(&body.lease)?;
    Ok(Json(Released { released: true }))
}

pub(super) async fn renew(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    let left = app.renew(&body.lease, body.ttl_ms).await?;
    Ok(Json(Renewed {
        expires_in_ms: left.as_millis() as u64,
    }))
}

pub(super) async fn busy(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<BusyBody>,
) -> Result<Json<Tightened>, ApiError> {
    let tightened = app.busy(&body.policy)?;
    Ok(Json(Tightened { tightened }))
}

pub(super) async fn list_policies(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let policies: Vec<serde_json::Value> = app
        .all_policies()
        .into_iter()
        .map(|p| json!({ "policy": p.config, "etag": p.etag }))
        .collect();
    Json(json!({ "policies": policies }))
}

pub(super) fn with_etag(body: serde_json::Value, status: StatusCode, etag: &str) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

pub(super) async fn get_policy(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let tagged = app.policy(&name)?;
    let body =
        serde_json::to_value(&tagged.config).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(with_etag(body, StatusCode::OK, &tagged.etag))
}

pub(super) fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(super) async fn put_policy(
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

pub(super) async fn delete_policy(
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
pub(super) struct ThrottleParams {
    policy: Option<String>,
    node: Option<String>,
    sort: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    scope: Option<String>,
}

pub(super) async fn throttles(
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

pub(super) async fn cluster(State(app): State<Arc<App>>) -> Json<weir_api::http::ClusterView> {
    Json(app.cluster())
}

#[derive(Debug, Deserialize)]
pub(super) struct StatsParams {
    scope: Option<String>,
}

/// `GET /v1/stats`: this node's; with `scope=cluster`, every member's and their totals.
pub(super) async fn stats(
    State(app): State<Arc<App>>,
    query: Result<Query<StatsParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(match params.scope.as_deref() {
        None | Some("node") => Json(app.stats()).into_response(),
        Some("cluster") => Json(app.cluster_stats().await).into_response(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`scope` must be `node` or `cluster`, got `{other}`"
            )));
        }
    })
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics().render(),
    )
        .into_response()
}

pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.not_ready_because() {
        None => Json(json!({ "status": "ready" })).into_response(),
        Some(why) => ApiError::new(ErrorKind::NotReady, why).into_response(),
    }
}
