//! `DELETE /v1/policies/{name}/override`: the changes made over the API to a policy dropped,
//! so that the config file's version applies again (`weir config revert`). Without it, a file
//! policy changed or deleted over the API stays so for good, whatever the file says later.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use weir::policy::PolicyConfig;

use crate::app::App;
use crate::error::ApiError;

use super::access::Admin;
use super::body::ErrorBody;
use super::handlers::with_etag;

/// Drops the changes made over the API to a policy (in a cluster, through its policy log).
#[utoipa::path(
    delete,
    path = super::route::POLICY_OVERRIDE,
    tag = "policies",
    params(("name" = String, Path, description = "The policy's name.")),
    security(("bearer" = []), ()),
    responses(
        (status = 200, description = "Reverted: the config file's version of the policy, now in force.", body = PolicyConfig, headers(("ETag" = String, description = "The policy's entity tag, for `If-Match`"))),
        (status = 204, description = "Reverted: the config file has no policy of that name, so none runs now."),
        (status = 401, description = "The admin token is configured and was not sent (`unauthenticated`).", body = ErrorBody),
        (status = 403, description = "A wrong token (`forbidden`), or without an admin token a host the server does not answer for (`host_not_allowed`).", body = ErrorBody),
        (status = 404, description = "No change made over the API holds the name (`unknown_policy`).", body = ErrorBody),
        (status = 409, description = "An RLS rule's policy, or in a cluster a member that cannot apply a revert yet (`conflict`).", body = ErrorBody),
        (status = 500, description = "The change could not be written to the data dir (`internal`).", body = ErrorBody),
        (status = 503, description = "In a cluster, no majority of the members could be reached (`no_quorum`): nothing was written.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds"))),
        (status = 504, description = "In a cluster, the leader wrote the revert but a majority did not confirm it in time (`outcome_unknown`).", body = ErrorBody),
    )
)]
pub(super) async fn revert(
    State(app): State<Arc<App>>,
    _: Admin,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(match app.policy_admin().revert_policy(&name).await? {
        Some(tagged) => {
            let body = serde_json::to_value(&tagged.config)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            with_etag(body, StatusCode::OK, &tagged.etag)
        }
        None => StatusCode::NO_CONTENT.into_response(),
    })
}
