//! Gubernator's `TOKEN_BUCKET`: `limit` hits for `duration` from the bucket's first hit, whole
//! again when the duration ends.
//!
//! Despite its name it is a window that opens at the first hit (not at a boundary of the
//! clock, as Weir's `fixed_window` does) and refuses without counting: a request for more than
//! is left is refused and spends nothing, so smaller ones after it still pass. A limit changed
//! by a later request moves what is left by the difference; a duration changed moves the end.
//! The answers here are Gubernator's, case for case, so that its clients read the same numbers.

use super::gregorian::{self, GregorianError};
use super::hit::{Answer, Behaviors, Hit, Status};

/// One key's token bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    /// Set when a hit found the bucket empty; answered until the bucket ends.
    status: Status,
    limit: i64,
    duration: i64,
    remaining: i64,
    created_at: i64,
    /// The last millisecond the bucket holds; after it, the key starts a new bucket.
    expire_at: i64,
}

impl TokenBucket {
    /// A new bucket for `hit`'s key, with `hit` counted in it.
    pub fn start(hit: &Hit) -> Result<(Self, Answer), GregorianError> {
        let expire_at = if hit.behaviors.gregorian() {
            gregorian::expiration(hit.now, hit.duration)?
        } else {
            hit.now.saturating_add(hit.duration)
        };
        let mut bucket = TokenBucket {
            status: Status::UnderLimit,
            limit: hit.limit,
            duration: hit.duration,
            remaining: hit.limit.saturating_sub(hit.hits),
            created_at: hit.now,
            expire_at,
        };
        let mut answer = Answer {
            status: Status::UnderLimit,
            limit: hit.limit,
            remaining: bucket.remaining,
            reset_time: expire_at,
        };
        if hit.hits > hit.limit {
            answer.status = Status::OverLimit;
            answer.remaining = hit.limit;
            bucket.remaining = hit.limit;
        }
        Ok((bucket, answer))
    }

    /// What `RESET_REMAINING` answers: the bucket is dropped, its hits not counted.
    pub fn reset(hit: &Hit) -> Answer {
        Answer {
            status: Status::UnderLimit,
            limit: hit.limit,
            remaining: hit.limit,
            reset_time: 0,
        }
    }

    /// Whether the bucket has ended at `now`.
    pub fn expired(&self, now: i64) -> bool {
        self.expire_at < now
    }

    /// Counts `hit` in this bucket.
    pub fn hit(&mut self, hit: &Hit) -> Result<Answer, GregorianError> {
        if self.limit != hit.limit {
            self.remaining = (self.remaining + hit.limit - self.limit).max(0);
            self.limit = hit.limit;
        }
        let mut answer = Answer {
            status: self.status,
            limit: hit.limit,
            remaining: self.remaining,
            reset_time: self.expire_at,
        };
        if self.duration != hit.duration {
            let mut expire = if hit.behaviors.gregorian() {
                gregorian::expiration(hit.now, hit.duration)?
            } else {
                self.created_at.saturating_add(hit.duration)
            };
            // Already past its new end: a new window, whole, from this hit.
            if expire <= hit.now {
                expire = hit.now.saturating_add(hit.duration);
                self.created_at = hit.now;
                self.remaining = self.limit;
            }
            self.expire_at = expire;
            self.duration = hit.duration;
            answer.reset_time = expire;
        }
        if hit.hits == 0 {
            return Ok(answer);
        }
        // Gubernator reads what was left before a duration change here, and remembers the
        // refusal (a later query answers OVER_LIMIT until the bucket ends).
        if answer.remaining == 0 && hit.hits > 0 {
            answer.status = Status::OverLimit;
            self.status = Status::OverLimit;
            return Ok(answer);
        }
        if self.remaining == hit.hits {
            self.remaining = 0;
            answer.remaining = 0;
            return Ok(answer);
        }
        if hit.hits > self.remaining {
            answer.status = Status::OverLimit;
            if hit.behaviors.has(Behaviors::DRAIN_OVER_LIMIT) {
                self.remaining = 0;
                answer.remaining = 0;
            }
            return Ok(answer);
        }
        self.remaining -= hit.hits;
        answer.remaining = self.remaining;
        Ok(answer)
    }
}
