//! What the two algorithms read of a request, and what they answer: Gubernator's fields in
//! Weir's words, with no wire type in them.

/// The flags of a request's `behavior` that change how its bucket is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Behaviors(i32);

impl Behaviors {
    /// `NO_BATCHING`: Weir never holds a decision back to batch it, so it changes nothing.
    pub const NO_BATCHING: i32 = 1;
    /// `GLOBAL`.
    pub const GLOBAL: i32 = 2;
    /// `DURATION_IS_GREGORIAN`: `duration` names a calendar interval.
    pub const DURATION_IS_GREGORIAN: i32 = 4;
    /// `RESET_REMAINING`: the bucket starts again full.
    pub const RESET_REMAINING: i32 = 8;
    /// `MULTI_REGION`: accepted, and decided as without it.
    pub const MULTI_REGION: i32 = 16;
    /// `DRAIN_OVER_LIMIT`: a refused hit empties the bucket.
    pub const DRAIN_OVER_LIMIT: i32 = 32;

    /// The flags as sent.
    pub fn new(bits: i32) -> Self {
        Behaviors(bits)
    }

    /// Whether `flag` is set.
    pub fn has(self, flag: i32) -> bool {
        self.0 & flag != 0
    }

    /// Whether the duration is a calendar interval.
    pub fn gregorian(self) -> bool {
        self.has(Self::DURATION_IS_GREGORIAN)
    }
}

/// One request's hits against its bucket, with the time they are counted at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// What the request spends; 0 asks what is left, a negative count gives back.
    pub hits: i64,
    /// What a duration holds.
    pub limit: i64,
    /// In milliseconds, or a calendar interval (0 … 5) when `behaviors.gregorian()`.
    pub duration: i64,
    /// The leaky bucket's depth (0: `limit`).
    pub burst: i64,
    /// The request's flags.
    pub behaviors: Behaviors,
    /// When the hits happen, in epoch milliseconds (`created_at`, or the server's clock).
    pub now: i64,
}

/// Under or over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    /// Admitted.
    #[default]
    UnderLimit,
    /// Refused.
    OverLimit,
}

/// What a bucket answers a [`Hit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Under or over the limit.
    pub status: Status,
    /// The limit in force.
    pub limit: i64,
    /// What is left after this request.
    pub remaining: i64,
    /// When the bucket is next whole (token bucket) or has room again (leaky bucket), in
    /// epoch milliseconds.
    pub reset_time: i64,
}
