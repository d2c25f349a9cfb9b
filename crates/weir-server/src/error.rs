//! API errors: one type for HTTP and gRPC, `{error, detail}` on the wire.

use std::fmt;

/// What kind of error an API call answers with: its HTTP status and its stable word both
/// follow from it, so the two never disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 400 `invalid_request`: the request is malformed or a field is out of range.
    InvalidRequest,
    /// 401 `unauthenticated`: a call that needs a token came without one.
    Unauthenticated,
    /// 403 `forbidden`: the token does not match.
    Forbidden,
    /// 403 `host_not_allowed`: a state-changing call to a host a server without an admin
    /// token does not answer for.
    HostNotAllowed,
    /// 404 `not_found`: no such endpoint or asset.
    NotFound,
    /// 404 `unknown_policy`: no such policy.
    UnknownPolicy,
    /// 404 `unknown_lease`: no such lease.
    UnknownLease,
    /// 405 `method_not_allowed`.
    MethodNotAllowed,
    /// 408 `body_timeout`: the body did not arrive in time.
    BodyTimeout,
    /// 409 `conflict`: the request does not fit the policy.
    Conflict,
    /// 412 `precondition_failed`: `If-Match` did not match.
    PreconditionFailed,
    /// 413 `too_large`: the body is over the limit.
    TooLarge,
    /// 500 `internal`: something on the server's side failed.
    Internal,
    /// 503 `not_ready`: the node is not ready yet.
    NotReady,
    /// 503 `shutting_down`.
    ShuttingDown,
    /// 503 `no_quorum`: in a cluster, a policy change that could not be committed (no
    /// majority of the members reachable); nothing was written, so it will not apply.
    /// Answered with `Retry-After`.
    NoQuorum,
    /// 504 `outcome_unknown`: in a cluster, a policy change the leader wrote but a majority
    /// did not confirm in time: it applies if a majority takes it later, and not otherwise.
    OutcomeUnknown,
}

impl ErrorKind {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Unauthenticated => 401,
            ErrorKind::Forbidden | ErrorKind::HostNotAllowed => 403,
            ErrorKind::NotFound | ErrorKind::UnknownPolicy | ErrorKind::UnknownLease => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::BodyTimeout => 408,
            ErrorKind::Conflict => 409,
            ErrorKind::PreconditionFailed => 412,
            ErrorKind::TooLarge => 413,
            ErrorKind::Internal => 500,
            ErrorKind::NotReady | ErrorKind::ShuttingDown | ErrorKind::NoQuorum => 503,
            ErrorKind::OutcomeUnknown => 504,
        }
    }

    /// The stable word clients match on (`{"error": …}`).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::HostNotAllowed => "host_not_allowed",
            ErrorKind::NotFound => "not_found",
            ErrorKind::UnknownPolicy => "unknown_policy",
            ErrorKind::UnknownLease => "unknown_lease",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::BodyTimeout => "body_timeout",
            ErrorKind::Conflict => "conflict",
            ErrorKind::PreconditionFailed => "precondition_failed",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Internal => "internal",
            ErrorKind::NotReady => "not_ready",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::NoQuorum => "no_quorum",
            ErrorKind::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// An error an API call answers with: its [`ErrorKind`] (status and stable word), and `detail`,
/// what is wrong in a sentence that names the field or the thing at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    kind: ErrorKind,
    detail: String,
}

impl ApiError {
    /// An error of `kind`, saying `detail`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        ApiError {
            kind,
            detail: detail.into(),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The stable word.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// What is wrong.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// What is wrong, taken out.
    pub fn into_detail(self) -> String {
        self.detail
    }

    /// 400: the request is malformed or a field is out of range.
    pub fn invalid(detail: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::InvalidRequest, detail)
    }

    /// 404: no such policy.
    pub fn unknown_policy(name: &str) -> Self {
        ApiError::new(
            ErrorKind::UnknownPolicy,
            format!("no policy named `{name}`"),
        )
    }

    /// 404: no such lease (never issued, released, or expired).
    pub fn unknown_lease() -> Self {
        ApiError::new(
            ErrorKind::UnknownLease,
            "no such lease: it was never issued, was released, or has expired",
        )
    }

    /// 409: the request does not fit the policy's kind.
    pub fn conflict(detail: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Conflict, detail)
    }

    /// 412: `If-Match` did not match.
    pub fn precondition_failed(detail: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::PreconditionFailed, detail)
    }

    /// 401: an admin call without a token.
    pub fn unauthenticated() -> Self {
        ApiError::new(
            ErrorKind::Unauthenticated,
            "this call changes policies: send `Authorization: Bearer <admin token>`",
        )
    }

    /// 403: an admin call with the wrong token.
    pub fn forbidden() -> Self {
        ApiError::new(ErrorKind::Forbidden, "the admin token does not match")
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError::new(
            ErrorKind::ShuttingDown,
            "the server is shutting down; retry on another node or later",
        )
    }

    /// 500: something on the server's side failed (a write to the data dir).
    pub fn internal(detail: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Internal, detail)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code(), self.status(), self.detail)
    }
}

impl std::error::Error for ApiError {}
