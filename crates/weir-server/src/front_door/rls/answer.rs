//! What `ShouldRateLimit` asks and is answered, as the decision reads and writes it; and why a
//! request is refused whole.

use std::time::Duration;

use super::config::Unit;

/// The longest counter key accepted (all of a descriptor's entries together), in bytes.
pub const MAX_DESCRIPTOR_BYTES: usize = 4096;
/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Its entries, in order.
    pub entries: Vec<(&'a str, &'a str)>,
    /// A limit sent instead of the configured one: hits per unit.
    pub limit: Option<(u32, Option<Unit>)>,
    /// Its own hits, overriding the request's (0: only look).
    pub hits: Option<u64>,
}

/// What a descriptor is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within its limit (or not limited).
    Ok,
    /// Over its limit.
    OverLimit,
}

/// The limit a descriptor was decided by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// Hits per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's limit's name, if it has one.
    pub name: Option<String>,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// OK or over.
    pub code: Code,
    /// The limit that decided, if one did.
    pub current_limit: Option<CurrentLimit>,
    /// Hits left before the key is over (`u32::MAX` for an unlimited rule).
    pub limit_remaining: u32,
    /// Whole seconds until the key is whole again, rounded up, if a limit decided.
    pub reset_after: Option<Duration>,
    /// Its limit is in quota mode (its rule's `quota_mode`, or `[rls] quota_mode`): over alone,
    /// it makes the request over only if every quota-mode descriptor is.
    pub quota_mode: bool,
}

impl Status {
    pub(super) fn unlimited(remaining: u32) -> Status {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: remaining,
            reset_after: None,
            quota_mode: false,
        }
    }
}

/// The answer to a whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Over if any descriptor not in quota mode is, or every one in quota mode is.
    pub overall: Code,
    /// One status per descriptor, in order.
    pub statuses: Vec<Status>,
    /// Header fields for the client's response, when `response_headers` is on.
    pub headers: Vec<(&'static str, String)>,
}

/// Why a request cannot be answered: it is malformed. Each names the descriptor and entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No domain.
    #[error("`domain` must not be empty")]
    NoDomain,
    /// No descriptors.
    #[error("`descriptors` must not be empty")]
    NoDescriptors,
    /// A descriptor too long to be a key.
    #[error("descriptor {index} is {bytes} bytes long; the most is {MAX_DESCRIPTOR_BYTES}")]
    TooLong {
        /// The descriptor's index.
        index: usize,
        /// Its length.
        bytes: usize,
    },
    /// More hits than any window can count.
    #[error(
        "descriptor {index} adds {hits} hits; one call may add at most 4294967295 (2^32 - 1), the most a window counts"
    )]
    HitsTooMany {
        /// The descriptor's index.
        index: usize,
        /// The hits asked for.
        hits: u64,
    },
    /// More descriptors than one call may carry.
    #[error("the call carries {count} descriptors; the most is {max} (`[rls] max_descriptors`)")]
    TooManyDescriptors {
        /// Descriptors in the call.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// A limit override with no unit.
    #[error("descriptor {index}: the `limit` override needs a unit (SECOND to YEAR)")]
    OverrideUnit {
        /// The descriptor's index.
        index: usize,
    },
}

/// `duration` rounded up to whole seconds, as the reference server answers (a window's end is
/// never reported early).
pub(super) fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds)
}
