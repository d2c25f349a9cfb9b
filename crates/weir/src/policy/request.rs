//! What a policy is asked, and how it says no: [`Request`], [`Rejection`] and its typed
//! [`RejectReason`].

use std::fmt;
use std::time::Duration;

/// A request asking to be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The bucket: a tenant, a user, an RPC type and table.
    pub key: &'a str,
    /// The kind of work (task kind, RPC type). `None`: no kind — only policies that apply to
    /// every kind see it.
    pub kind: Option<&'a str>,
    /// Tokens (or permits) it costs.
    pub cost: u64,
    /// The longest this request is willing to wait (the policy's `max_wait` still caps it).
    pub max_wait: Option<Duration>,
}

impl<'a> Request<'a> {
    /// A request of cost 1 and no kind for `key`.
    pub fn new(key: &'a str) -> Self {
        Request {
            key,
            kind: None,
            cost: 1,
            max_wait: None,
        }
    }

    /// The same request with a kind.
    pub fn kind(self, kind: &'a str) -> Self {
        Request {
            kind: Some(kind),
            ..self
        }
    }

    /// The same request with a cost.
    pub fn cost(self, cost: u64) -> Self {
        Request { cost, ..self }
    }

    /// The same request, waiting at most `max_wait`.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        Request {
            max_wait: Some(max_wait),
            ..self
        }
    }
}

/// Why a policy refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The policy that refused.
    pub policy: String,
    /// Why.
    pub reason: RejectReason,
}

/// The reason behind a [`Rejection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// A rate limiter's bucket is exhausted; it could admit after `retry_after`.
    Limited {
        /// When asking again could succeed.
        retry_after: Duration,
    },
    /// Every in-flight permit of the key is taken: only a release makes room, so there is no
    /// time to give.
    InFlightFull,
    /// The request waited `max_wait` without getting its turn.
    WaitedTooLong {
        /// The policy's `max_wait`.
        max_wait: Duration,
    },
    /// The policy tracks `max_keys` keys, none idle, and refuses new ones.
    KeysExhausted {
        /// The cap.
        max_keys: usize,
    },
    /// The request costs more than a bucket ever holds. Without waiting it can never be
    /// admitted, however long the caller waits before asking again (a waiting acquire drains
    /// the full bucket and waits for the rest).
    ExceedsCapacity {
        /// What was asked.
        cost: u64,
        /// The most a bucket holds (`burst` or `max`).
        capacity: u64,
    },
    /// The request costs more than the policy allows one request to.
    CostTooLarge {
        /// What was asked.
        cost: u64,
        /// The most one request may cost.
        max: u64,
    },
}

impl Rejection {
    /// When asking again could succeed, where the limiter knows.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.reason {
            RejectReason::Limited { retry_after } => Some(retry_after),
            RejectReason::InFlightFull
            | RejectReason::WaitedTooLong { .. }
            | RejectReason::KeysExhausted { .. }
            | RejectReason::ExceedsCapacity { .. }
            | RejectReason::CostTooLarge { .. } => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy `{}`: ", self.policy)?;
        match self.reason {
            RejectReason::Limited { retry_after } => {
                write!(f, "rate limited; retry after {retry_after:?}")
            }
            RejectReason::InFlightFull => write!(f, "concurrency limit reached"),
            RejectReason::WaitedTooLong { max_wait } => {
                write!(f, "still limited after waiting the maximum of {max_wait:?}")
            }
            RejectReason::KeysExhausted { max_keys } => write!(
                f,
                "tracks its maximum of {max_keys} keys, none idle, and refuses new keys"
            ),
            RejectReason::ExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the bucket's capacity of {capacity}: refused every time it is asked without waiting; lower the cost, raise the bucket's burst, or wait (`on_exhausted = \"wait\"`)"
            ),
            RejectReason::CostTooLarge { cost, max } => {
                write!(f, "cost {cost} exceeds the maximum of {max} per request")
            }
        }
    }
}

impl std::error::Error for Rejection {}
