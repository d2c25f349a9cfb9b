//! One handler per route: the request read, the core asked, its answer written. Each
//! carries its OpenAPI description (`#[utoipa::path]`), gathered in `openapi.rs`: the
//! statuses it can answer, its bodies' types and the headers it sets.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use weir::policy::PolicyConfig;
use weir_api::http::{
    AcquireBody, Admission, BusyBody, Refusal, ReleaseBody, Released, RenewBody, Renewed, Tightened,
};

use crate::app::{
    AcquireInput, AcquireOutcome, App, ClusterStatsView, StatsView, ThrottleQuery, ThrottleRow,
};
use crate::error::{ApiError, ErrorKind};

use super::access::{Admin, DataPlane};
use super::body::ApiJson;
use super::body::ErrorBody;
use super::headers::{header_str, rate_limit_headers};

/// `GET /v1/policies`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct PolicyList {
    /// Every policy this node runs, each with its entity tag.
    policies: Vec<TaggedPolicyView>,
}

/// A policy with its entity tag, in [`PolicyList`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct TaggedPolicyView {
    /// The policy, as `GET /v1/policies/{name}` answers it.
    policy: PolicyConfig,
    /// Its `ETag`, for `If-Match`.
    etag: String,
    /// Where it comes from: `file` (the config file), `api` (made or changed over the API) or
    /// `rls` (the RLS rules).
    source: &'static str,
    /// Whether it was changed over the API in place of the config file's policy of its name
    /// (`DELETE /v1/policies/{name}/override` brings the file's back).
    overrides_file: bool,
}

/// `GET /v1/throttles`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ThrottleRows {
    /// The keys held back, most requests per second first.
    rows: Vec<ThrottleRow>,
}

/// `GET /healthz` and `GET /readyz` when all is well.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Status {
    /// `ok` (alive) or `ready`.
    status: &'static str,
    /// What a ready node does not do as it should (its kept buckets not written, its Redis
    /// unreachable): it serves, but an operator should know.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// `GET /v1/stats`: this node's, or with `scope=cluster` every member's.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(super) enum AnyStats {
    /// `scope=node` (the default).
    Node(StatsView),
    /// `scope=cluster`.
    Cluster(ClusterStatsView),
}

/// The answers every data-plane call (a JSON body, the data token) can be refused with, for
/// the OpenAPI document: described once here, never built (the errors are [`ApiError`]s).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum DataPlaneErrors {
    /// A malformed body, a missing field or one out of range (`invalid_request`).
    #[response(status = 400)]
    Invalid(ErrorBody<'static>),
    /// The data token is configured and was not sent (`unauthenticated`).
    #[response(status = 401)]
    Unauthenticated(ErrorBody<'static>),
    /// A wrong token, or a host the server does not answer for.
    #[response(
        status = 403,
        description = "A wrong token (`forbidden`), or a host a server without an admin token does not answer for (`host_not_allowed`)."
    )]
    Forbidden(ErrorBody<'static>),
    /// The body did not arrive in time (`body_timeout`).
    #[response(status = 408)]
    BodyTimeout(ErrorBody<'static>),
    /// The body is over the limit (`too_large`).
    #[response(status = 413)]
    TooLarge(ErrorBody<'static>),
}

/// Asks for admission under a policy: `200` admitted (after waiting, if the policy waits),
/// `429` refused.
#[utoipa::path(
    post,
    path = super::route::ACQUIRE,
    tag = "data plane",
    request_body = AcquireBody,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Admitted.", body = Admission,
            headers(("RateLimit-Policy" = String, description = "`\"policy\";q=LIMIT;w=1`: the bucket's limit per second (rate policies)"))),
        (status = 429, description = "Refused.", body = Refusal,
            headers(
                ("Retry-After" = u64, description = "Whole seconds until asking again could succeed (absent when only a release makes room)"),
                ("RateLimit" = String, description = "`\"policy\";r=0;t=SECONDS`"),
                ("RateLimit-Policy" = String, description = "As on an admission"),
            )),
        DataPlaneErrors,
        (status = 404, description = "No such policy (`unknown_policy`).", body = ErrorBody),
        (status = 503, description = "The server is shutting down (`shutting_down`).", body = ErrorBody),
    )
)]
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

/// Ends a lease a concurrency policy's admission returned.
#[utoipa::path(
    post,
    path = super::route::RELEASE,
    tag = "data plane",
    request_body = ReleaseBody,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Released.", body = Released),
        DataPlaneErrors,
        (status = 404, description = "No such lease: never issued, released, or expired (`unknown_lease`).", body = ErrorBody),
    )
)]
pub(super) async fn release(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<Released>, ApiError> {
    app.release(&body.lease)?;
    Ok(Json(Released { released: true }))
}

/// Extends a lease's time to live.
#[utoipa::path(
    post,
    path = super::route::RENEW,
    tag = "data plane",
    request_body = RenewBody,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Renewed.", body = Renewed),
        DataPlaneErrors,
        (status = 404, description = "No such lease (`unknown_lease`).", body = ErrorBody),
    )
)]
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

/// The backend behind an adaptive policy says it is overloaded: the policy's hottest keys are
/// throttled a step further.
#[utoipa::path(
    post,
    path = super::route::BUSY,
    tag = "data plane",
    request_body = BusyBody,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Taken.", body = Tightened),
        DataPlaneErrors,
        (status = 404, description = "No such policy (`unknown_policy`).", body = ErrorBody),
        (status = 409, description = "The policy is not adaptive (`conflict`).", body = ErrorBody),
    )
)]
pub(super) async fn busy(
    State(app): State<Arc<App>>,
    _: DataPlane,
    ApiJson(body): ApiJson<BusyBody>,
) -> Result<Json<Tightened>, ApiError> {
    let tightened = app.policy_admin().busy(&body.policy)?;
    Ok(Json(Tightened { tightened }))
}

/// Every policy this node runs.
#[utoipa::path(
    get,
    path = super::route::POLICIES,
    tag = "policies",
    responses((status = 200, description = "The policies.", body = PolicyList))
)]
pub(super) async fn list_policies(State(app): State<Arc<App>>) -> Json<PolicyList> {
    let admin = app.policy_admin();
    let policies = admin
        .all_policies()
        .into_iter()
        .map(|p| {
            let source = admin.source_of(&p.config);
            TaggedPolicyView {
                policy: p.config,
                etag: p.etag,
                source: source.name(),
                overrides_file: source.overrides_file(),
            }
        })
        .collect();
    Json(PolicyList { policies })
}

pub(super) fn with_etag(body: serde_json::Value, status: StatusCode, etag: &str) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// One policy.
#[utoipa::path(
    get,
    path = super::route::POLICY,
    tag = "policies",
    params(("name" = String, Path, description = "The policy's name.")),
    responses(
        (status = 200, description = "The policy.", body = PolicyConfig, headers(
            ("ETag" = String, description = "The policy's entity tag, for `If-Match`"),
            ("Weir-Policy-Source" = String, description = "Where it comes from: `file`, `rls`, `api`, or `api; overrides=file` when a change over the API stands in place of the config file's (`DELETE /v1/policies/{name}/override` brings the file's back)"),
        )),
        (status = 404, description = "No such policy (`unknown_policy`).", body = ErrorBody),
    )
)]
pub(super) async fn get_policy(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let admin = app.policy_admin();
    let tagged = admin.policy(&name)?;
    let source = admin.source_of(&tagged.config);
    let body =
        serde_json::to_value(&tagged.config).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut response = with_etag(body, StatusCode::OK, &tagged.etag);
    let source = match source.overrides_file() {
        true => format!("{}; overrides=file", source.name()),
        false => source.name().to_owned(),
    };
    if let Ok(value) = HeaderValue::from_str(&source) {
        response.headers_mut().insert(SOURCE_HEADER, value);
    }
    Ok(response)
}

/// The header `GET /v1/policies/{name}` says where the policy comes from in.
pub(crate) const SOURCE_HEADER: &str = "weir-policy-source";

/// Creates or replaces a policy, live (in a cluster, through the cluster's policy log).
#[utoipa::path(
    put,
    path = super::route::POLICY,
    tag = "policies",
    params(
        ("name" = String, Path, description = "The policy's name (the body's `name`, if given, must be the same)."),
        ("If-Match" = Option<String>, Header, description = "Change only if the policy's `ETag` is this (`*`: only if it exists)."),
    ),
    request_body = PolicyConfig,
    security(("bearer" = []), ()),
    responses(
        (status = 200, description = "Replaced.", body = PolicyConfig, headers(("ETag" = String, description = "The policy's entity tag, for `If-Match`"))),
        (status = 201, description = "Created.", body = PolicyConfig, headers(("ETag" = String, description = "The policy's entity tag, for `If-Match`"))),
        (status = 400, description = "The policy is not valid: the field at fault is named (`invalid_request`).", body = ErrorBody),
        (status = 401, description = "The admin token is configured and was not sent (`unauthenticated`).", body = ErrorBody),
        (status = 403, description = "A wrong token (`forbidden`), or without an admin token a host the server does not answer for (`host_not_allowed`).", body = ErrorBody),
        (status = 408, description = "The body did not arrive in time (`body_timeout`).", body = ErrorBody),
        (status = 409, description = "The change does not fit the running policy (`conflict`).", body = ErrorBody),
        (status = 412, description = "`If-Match` did not match (`precondition_failed`).", body = ErrorBody),
        (status = 413, description = "The body is over the limit (`too_large`).", body = ErrorBody),
        (status = 500, description = "The change could not be written to the data dir (`internal`).", body = ErrorBody),
        (status = 503, description = "In a cluster, no majority of the members could be reached (`no_quorum`): nothing was written, and the change will not apply; answered with `Retry-After`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds"))),
        (status = 504, description = "In a cluster, the leader wrote the change but a majority did not confirm it in time (`outcome_unknown`): it applies if a majority takes it later, and not otherwise; the detail gives the entity tag it has if it does.", body = ErrorBody),
    )
)]
pub(super) async fn put_policy(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(config): ApiJson<PolicyConfig>,
) -> Result<Response, ApiError> {
    let (created, stored) = app
        .policy_admin()
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

/// Removes a policy, live.
#[utoipa::path(
    delete,
    path = super::route::POLICY,
    tag = "policies",
    params(
        ("name" = String, Path, description = "The policy's name."),
        ("If-Match" = Option<String>, Header, description = "Change only if the policy's `ETag` is this (`*`: only if it exists)."),
    ),
    security(("bearer" = []), ()),
    responses(
        (status = 200, description = "Removed: the policy as it was.", body = PolicyConfig, headers(("ETag" = String, description = "The policy's entity tag, for `If-Match`"))),
        (status = 401, description = "The admin token is configured and was not sent (`unauthenticated`).", body = ErrorBody),
        (status = 403, description = "A wrong token (`forbidden`), or without an admin token a host the server does not answer for (`host_not_allowed`).", body = ErrorBody),
        (status = 404, description = "No such policy (`unknown_policy`).", body = ErrorBody),
        (status = 409, description = "The policy cannot be removed live (`conflict`).", body = ErrorBody),
        (status = 412, description = "`If-Match` did not match (`precondition_failed`).", body = ErrorBody),
        (status = 500, description = "The change could not be written to the data dir (`internal`).", body = ErrorBody),
        (status = 503, description = "In a cluster, no majority of the members could be reached (`no_quorum`): nothing was written, and the policy stays.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds"))),
        (status = 504, description = "In a cluster, the leader wrote the deletion but a majority did not confirm it in time (`outcome_unknown`): it applies if a majority takes it later, and not otherwise.", body = ErrorBody),
    )
)]
pub(super) async fn delete_policy(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let deleted = app
        .policy_admin()
        .delete_policy(&name, header_str(&headers, header::IF_MATCH))
        .await?;
    let body =
        serde_json::to_value(&deleted.config).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(with_etag(body, StatusCode::OK, &deleted.etag))
}

/// `GET /v1/throttles`' query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ThrottleParams {
    /// Only this policy.
    policy: Option<String>,
    /// Only this node.
    node: Option<String>,
    /// Sort by `current_qps` (the default), `throttled_qps`, `qps_limit`, `in_flight`,
    /// `waiters`, `key`, `policy` or `kind`.
    #[param(pattern = "^(current_qps|throttled_qps|qps_limit|in_flight|waiters|key|policy|kind)$")]
    sort: Option<String>,
    /// `desc` (the default for numbers) or `asc` (for names).
    #[param(pattern = "^(asc|desc)$")]
    order: Option<String>,
    /// At most this many rows (default 100).
    #[param(value_type = Option<u64>, maximum = 4294967295_u64)]
    limit: Option<u32>,
    /// `node` (the default): this node's rows; `cluster`: every live member's.
    #[param(pattern = "^(node|cluster)$")]
    scope: Option<String>,
}

/// Who is throttled: the keys the policies hold back now.
#[utoipa::path(
    get,
    path = super::route::THROTTLES,
    tag = "observing",
    params(ThrottleParams),
    responses(
        (status = 200, description = "The rows.", body = ThrottleRows),
        (status = 400, description = "An unknown parameter or value (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such policy (`unknown_policy`).", body = ErrorBody),
    )
)]
pub(super) async fn throttles(
    State(app): State<Arc<App>>,
    query: Result<Query<ThrottleParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ThrottleRows>, ApiError> {
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
        limit: params.limit.map(|limit| limit as usize),
    };
    let rows = if params.scope.as_deref() == Some("cluster") {
        app.cluster_throttles(&query).await?
    } else {
        app.throttles(&query)?
    };
    Ok(Json(ThrottleRows { rows }))
}

/// The cluster as this node sees it (the same shape on a single node).
#[utoipa::path(
    get,
    path = super::route::CLUSTER,
    tag = "observing",
    responses((status = 200, description = "Members, ring, counters.", body = weir_api::http::ClusterView))
)]
pub(super) async fn cluster(State(app): State<Arc<App>>) -> Json<weir_api::http::ClusterView> {
    let mut view = app.cluster();
    if !view.config_differs.is_empty() {
        view.config_drift = app.config_drift().await;
    }
    Json(view)
}

/// `GET /v1/stats`' query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct StatsParams {
    /// `node` (the default) or `cluster`.
    #[param(pattern = "^(node|cluster)$")]
    scope: Option<String>,
}

/// `GET /v1/stats`: this node's; with `scope=cluster`, every member's and their totals.
#[utoipa::path(
    get,
    path = super::route::STATS,
    tag = "observing",
    params(StatsParams),
    responses(
        (status = 200, description = "Counters and gauges.", body = AnyStats),
        (status = 400, description = "An unknown `scope` (`invalid_request`).", body = ErrorBody),
    )
)]
pub(super) async fn stats(
    State(app): State<Arc<App>>,
    query: Result<Query<StatsParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(match params.scope.as_deref() {
        None | Some("node") => Json(AnyStats::Node(app.stats())).into_response(),
        Some("cluster") => Json(AnyStats::Cluster(app.cluster_stats().await)).into_response(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`scope` must be `node` or `cluster`, got `{other}`"
            )));
        }
    })
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = super::route::METRICS,
    tag = "observing",
    responses((status = 200, description = "The Prometheus text format 0.0.4.", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"))
)]
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

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = super::route::HEALTHZ,
    tag = "observing",
    responses((status = 200, description = "Alive.", body = Status))
)]
pub(super) async fn healthz() -> Json<Status> {
    Json(Status {
        status: "ok",
        warnings: Vec::new(),
    })
}

/// Readiness: the node serves decisions.
#[utoipa::path(
    get,
    path = super::route::READYZ,
    tag = "observing",
    responses(
        (status = 200, description = "Ready.", body = Status),
        (status = 503, description = "Not ready yet, or shutting down (`not_ready`); `detail` says why.", body = ErrorBody),
    )
)]
pub(super) async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.health().not_ready_because() {
        None => Json(Status {
            status: "ready",
            warnings: app.health().warnings(),
        })
        .into_response(),
        Some(why) => ApiError::new(ErrorKind::NotReady, why).into_response(),
    }
}
