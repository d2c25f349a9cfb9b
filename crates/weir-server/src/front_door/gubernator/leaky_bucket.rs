//! Gubernator's `LEAKY_BUCKET`: `burst` deep (the limit unless given), refilled at `limit` per
//! `duration`, one hit at a time.
//!
//! What is left is kept as a fraction and shown whole (rounded down); a refill is taken only
//! once it adds at least one whole hit, so the fraction is never lost. A refused request spends
//! nothing. `reset_time` is Gubernator's: the time `limit − remaining` hits take to refill —
//! the limit, not the burst, so with a burst above the limit it can lie in the past; clients
//! read it as Gubernator wrote it.

use super::gregorian::{self, GregorianError};
use super::hit::{Answer, Behaviors, Hit, Status};

/// One key's leaky bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct LeakyBucket {
    limit: i64,
    burst: i64,
    remaining: f64,
    /// When the last refill was taken.
    updated_at: i64,
    /// The last millisecond the bucket is kept without a hit.
    expire_at: i64,
}

/// `hit`'s burst: its own, or its limit.
fn burst_of(hit: &Hit) -> i64 {
    if hit.burst == 0 { hit.limit } else { hit.burst }
}

/// The milliseconds one hit takes to refill, and how long the bucket is kept after a hit.
fn pace(hit: &Hit) -> Result<(f64, i64), GregorianError> {
    if hit.behaviors.gregorian() {
        let length = gregorian::length(hit.now, hit.duration)?;
        let end = gregorian::expiration(hit.now, hit.duration)?;
        Ok((length as f64 / hit.limit as f64, end - hit.now))
    } else {
        Ok((hit.duration as f64 / hit.limit as f64, hit.duration))
    }
}

/// When `limit − remaining` hits will have refilled, from `now`.
fn reset_time(now: i64, limit: i64, remaining: i64, rate: f64) -> i64 {
    now.saturating_add(limit.saturating_sub(remaining).saturating_mul(rate as i64))
}

impl LeakyBucket {
    /// A new bucket for `hit`'s key, with `hit` counted in it.
    pub fn start(hit: &Hit) -> Result<(Self, Answer), GregorianError> {
        let burst = burst_of(hit);
        let (rate, kept_for) = pace(hit)?;
        let left = burst.saturating_sub(hit.hits);
        let mut bucket = LeakyBucket {
            limit: hit.limit,
            burst,
            remaining: left as f64,
            updated_at: hit.now,
            expire_at: hit.now.saturating_add(kept_for),
        };
        let mut answer = Answer {
            status: Status::UnderLimit,
            limit: hit.limit,
            remaining: left,
            reset_time: reset_time(hit.now, hit.limit, left, rate),
        };
        if hit.hits > burst {
            answer.status = Status::OverLimit;
            answer.remaining = 0;
            answer.reset_time = reset_time(hit.now, hit.limit, 0, rate);
            bucket.remaining = 0.0;
        }
        Ok((bucket, answer))
    }

    /// Whether the bucket has been idle past its keeping at `now`.
    pub fn expired(&self, now: i64) -> bool {
        self.expire_at < now
    }

    /// Counts `hit` in this bucket.
    pub fn hit(&mut self, hit: &Hit) -> Result<Answer, GregorianError> {
        let burst = burst_of(hit);
        if hit.behaviors.has(Behaviors::RESET_REMAINING) {
            self.remaining = burst as f64;
        }
        if self.burst != burst {
            if burst > self.remaining as i64 {
                self.remaining = burst as f64;
            }
            self.burst = burst;
        }
        self.limit = hit.limit;
        let (rate, kept_for) = pace(hit)?;
        if hit.hits != 0 {
            self.expire_at = hit.now.saturating_add(kept_for);
        }
        let leak = (hit.now - self.updated_at) as f64 / rate;
        if leak as i64 > 0 {
            self.remaining += leak;
            self.updated_at = hit.now;
        }
        if self.remaining as i64 > self.burst {
            self.remaining = self.burst as f64;
        }
        let left = self.remaining as i64;
        let mut answer = Answer {
            status: Status::UnderLimit,
            limit: self.limit,
            remaining: left,
            reset_time: reset_time(hit.now, self.limit, left, rate),
        };
        if left == 0 && hit.hits > 0 {
            answer.status = Status::OverLimit;
            return Ok(answer);
        }
        if left == hit.hits {
            self.remaining = 0.0;
            answer.remaining = 0;
            answer.reset_time = reset_time(hit.now, self.limit, 0, rate);
            return Ok(answer);
        }
        if hit.hits > left {
            answer.status = Status::OverLimit;
            if hit.behaviors.has(Behaviors::DRAIN_OVER_LIMIT) {
                self.remaining = 0.0;
                answer.remaining = 0;
            }
            return Ok(answer);
        }
        if hit.hits == 0 {
            return Ok(answer);
        }
        self.remaining -= hit.hits as f64;
        answer.remaining = self.remaining as i64;
        answer.reset_time = reset_time(hit.now, self.limit, answer.remaining, rate);
        Ok(answer)
    }
}
