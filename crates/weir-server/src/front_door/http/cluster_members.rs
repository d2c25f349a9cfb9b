//! `DELETE /v1/cluster/members/{id}`: a member gone for good forgotten as a voter of the
//! cluster's policy log, at an operator's command (`weir cluster forget`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use weir_api::http::MemberForgotten;

use crate::app::App;
use crate::error::{ApiError, ErrorKind};
use crate::policy_log::forget::ForgetRefusal;

use super::access::Admin;
use super::body::ErrorBody;

/// Forgets a voter gone for good, through the policy log's leader.
#[utoipa::path(
    delete,
    path = super::route::CLUSTER_MEMBER,
    tag = "observing",
    params(("id" = String, Path, description = "The member's node id.")),
    security(("bearer" = []), ()),
    responses(
        (status = 200, description = "Forgotten: it no longer counts in the majority; the voters left.", body = MemberForgotten),
        (status = 401, description = "The admin token is configured and was not sent (`unauthenticated`).", body = ErrorBody),
        (status = 403, description = "A wrong token (`forbidden`), or without an admin token a host the server does not answer for (`host_not_allowed`).", body = ErrorBody),
        (status = 404, description = "Not a voter of the policy log (`not_found`).", body = ErrorBody),
        (status = 409, description = "The member is alive, removing it would leave the live voters without a majority, or this node is not in cluster mode (`conflict`).", body = ErrorBody),
        (status = 503, description = "No leader of the policy log could make the change (`no_quorum`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds"))),
    )
)]
pub(super) async fn forget(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<MemberForgotten>, ApiError> {
    let Some(cluster) = app.cluster_mode() else {
        return Err(ApiError::conflict(
            "this node is not in cluster mode: it has no voters to forget",
        ));
    };
    let voters = cluster.policy_log().forget(&id).await.map_err(|refusal| {
        let kind = match refusal {
            ForgetRefusal::Alive(_) | ForgetRefusal::WouldLoseMajority(_) => ErrorKind::Conflict,
            ForgetRefusal::NotAVoter(..) => ErrorKind::NotFound,
            ForgetRefusal::NoLeader(_) => ErrorKind::NoQuorum,
        };
        ApiError::new(kind, refusal.to_string())
    })?;
    Ok(Json(MemberForgotten {
        forgotten: id,
        voters,
    }))
}
