//! Who may call what: the admin token for policy changes, the data token for the data plane,
//! and the `Host` check of a server without an admin token.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;

use crate::app::App;
use crate::error::ApiError;

use super::handlers::header_str;

/// Proof that an admin call carries the admin token (or that none is configured).
///
/// An extractor from the request's head, so it runs before the body is read or parsed: a caller
/// without the token learns nothing from how the server reads its body.
pub(super) struct Admin;

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
pub(super) struct DataPlane;

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
pub(super) fn host_of(parts: &axum::http::request::Parts) -> Option<&str> {
    parts
        .uri
        .authority()
        .map(|authority| authority.as_str())
        .or_else(|| header_str(&parts.headers, header::HOST))
}
