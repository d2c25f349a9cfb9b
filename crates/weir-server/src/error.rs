//! API errors: one type for HTTP and gRPC, `{error, detail}` on the wire.

use std::fmt;

/// An error an API call answers with. `code` is a stable machine-readable word; `detail` says
/// what is wrong in a sentence that names the field or the thing at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// A stable word: `invalid_request`, `unknown_policy`, …
    pub code: &'static str,
    /// What is wrong.
    pub detail: String,
}

impl ApiError {
    /// 400: the request is malformed or a field is out of range.
    pub fn invalid(detail: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            code: "invalid_request",
            detail: detail.into(),
        }
    }

    /// 404: no such policy.
    pub fn unknown_policy(name: &str) -> Self {
        ApiError {
            status: 404,
            code: "unknown_policy",
            detail: format!("no policy named `{name}`"),
        }
    }

    /// 404: no such lease (never issued, released, or expired).
    pub fn unknown_lease() -> Self {
        ApiError {
            status: 404,
            code: "unknown_lease",
            detail: "no such lease: it was never issued, was released, or has expired".into(),
        }
    }

    /// 409: the request does not fit the policy's kind.
    pub fn conflict(detail: impl Into<String>) -> Self {
        ApiError {
            status: 409,
            code: "conflict",
            detail: detail.into(),
        }
    }

    /// 412: `If-Match` did not match.
    pub fn precondition_failed(detail: impl Into<String>) -> Self {
        ApiError {
            status: 412,
            code: "precondition_failed",
            detail: detail.into(),
        }
    }

    /// 401: an admin call without a token.
    pub fn unauthenticated() -> Self {
        ApiError {
            status: 401,
            code: "unauthenticated",
            detail: "this call changes policies: send `Authorization: Bearer <admin token>`".into(),
        }
    }

    /// 403: an admin call with the wrong token.
    pub fn forbidden() -> Self {
        ApiError {
            status: 403,
            code: "forbidden",
            detail: "the admin token does not match".into(),
        }
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError {
            status: 503,
            code: "shutting_down",
            detail: "the server is shutting down; retry on another node or later".into(),
        }
    }

    /// 500: something on the server's side failed (a write to the data dir).
    pub fn internal(detail: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            code: "internal",
            detail: detail.into(),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.detail)
    }
}

impl std::error::Error for ApiError {}
