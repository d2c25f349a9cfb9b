//! `FixedWindow { limit, window }`: at most `limit` hits per window, windows aligned to the
//! calendar.
//!
//! The counting most rate limit services use, the reference Envoy rate limit server among
//! them: time is cut into windows of one `window` each, starting at the Unix epoch (a minute
//! window starts on the minute, a day window at midnight UTC), and each window counts the hits
//! of its key. A hit that takes the count above `limit` is refused — and still counted, as an
//! `INCRBY`-then-compare counter counts it: a migration from such a server answers exactly as
//! it did. A new window starts from zero.
//!
//! It is the cheapest limiter to explain and the least exact: a client can spend `limit` at the
//! end of one window and `limit` again at the start of the next, twice the rate for an instant.
//! A token bucket has no such edge; a fixed window is here for parity with servers that count
//! this way.
//!
//! A key's whole state is one word: the window's number (modulo 2³²) in the high half, its
//! hits in the low half. A window of a number other than the current one holds nothing.
//! Windows are at least a millisecond long, so a key would have to stay idle for exactly 2³²
//! windows (49 days of millisecond windows, 136 years of second windows) to meet its old count.

use std::time::Duration;

use super::word;
use crate::clock::{Nanos, duration_to_nanos};
use crate::error::{ConfigError, Refused};
use crate::sync::AtomicU64;

/// The parameters of a fixed window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowConfig {
    /// The most hits a window admits: 1 to 2³² − 1.
    pub limit: u64,
    /// A window's length: at least a millisecond.
    pub window: Duration,
}

/// The shortest window.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

impl FixedWindowConfig {
    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.limit == 0 || self.limit > u64::from(u32::MAX) {
            return Err(ConfigError::OutOfRange {
                field: "limit",
                allowed: "between 1 and 4294967295",
                got: self.limit.to_string(),
            });
        }
        if self.window < MIN_WINDOW {
            return Err(ConfigError::OutOfRange {
                field: "window",
                allowed: "at least 1ms",
                got: format!("{:?}", self.window),
            });
        }
        Ok(())
    }
}

/// A fixed window's shape, with where the calendar's windows start on the clock in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// A window's length in nanoseconds (≥ 1 ms).
    pub(crate) length: u64,
    /// The most hits a window admits (≤ 2³² − 1).
    pub(crate) limit: u64,
    /// The Unix time of the clock's instant 0 ([`Clock::unix_offset`](crate::Clock)).
    pub(crate) unix_offset: Nanos,
}

const HITS: u64 = u32::MAX as u64;

/// What a window says after a hit, or when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// What the key has spent: the window's hits (refused ones included, so it may exceed the
    /// limit), a bucket's tokens in use, a concurrency key's permits in flight.
    pub used: u64,
    /// What the key may still spend before it is refused.
    pub remaining: u64,
    /// How long until the key is whole again: the window's end for a fixed window, the time
    /// until a bucket is full for a token bucket.
    pub reset_after: Duration,
}

impl Window {
    /// The window `now` falls in, and how long until it ends.
    #[inline]
    fn at(&self, now: Nanos) -> (u64, u64) {
        let unix = now.wrapping_add(self.unix_offset);
        (unix / self.length, self.length - unix % self.length)
    }

    /// The hits `word` holds for the window `number`.
    #[inline]
    fn hits(word: u64, number: u64) -> u64 {
        if word >> 32 == number & HITS {
            word & HITS
        } else {
            0
        }
    }

    /// Counts `cost` hits now; admits them if the window's count stays within the limit. A
    /// refused hit is counted too (see the module docs), unless it is larger than any window.
    #[inline]
    pub(crate) fn hit(&self, word: &AtomicU64, cost: u64, now: Nanos) -> Result<Quota, Refused> {
        // No window can ever hold it: refused without being counted, and without a time to
        // retry at.
        if cost > self.limit {
            return Err(Refused::ExceedsCapacity {
                cost,
                capacity: self.limit,
            });
        }
        let (number, left) = self.at(now);
        // The word keeps at most 2³² − 1 hits; the decision sees the whole sum, so a window at
        // the largest limit still refuses once it is full.
        let after = word::apply(word, |current| {
            let after = Window::hits(current, number).saturating_add(cost);
            ((number & HITS) << 32 | after.min(HITS), after)
        });
        let reset_after = Duration::from_nanos(left);
        if after <= self.limit {
            Ok(Quota {
                used: after,
                remaining: self.limit - after,
                reset_after,
            })
        } else {
            Err(Refused::RetryAfter {
                retry_after: reset_after,
            })
        }
    }

    /// Counts hits in the current window until at most `remaining` are left before the limit,
    /// as though they had been admitted here: how a bucket's new owner takes on what another
    /// node counted. A window already that full is left alone.
    pub(crate) fn hold_to(&self, word: &AtomicU64, remaining: u64, now: Nanos) {
        let (number, _) = self.at(now);
        let floor = self.limit.saturating_sub(remaining);
        let _ = word::update(word, |current| {
            let hits = Window::hits(current, number);
            if hits >= floor {
                return Err(());
            }
            Ok(((number & HITS) << 32 | floor, ()))
        });
    }

    /// Takes back `cost` hits counted at `at`, if their window is still the current one.
    pub(crate) fn give_back(&self, word: &AtomicU64, cost: u64, at: Nanos) {
        let (number, _) = self.at(at);
        let _ = word::update(word, |current| {
            if current >> 32 != number & HITS {
                return Err(());
            }
            Ok((current - (current & HITS).min(cost), ()))
        });
    }

    /// What the key has left now.
    pub(crate) fn quota(&self, word: u64, now: Nanos) -> Quota {
        let (number, left) = self.at(now);
        let used = Window::hits(word, number);
        Quota {
            used,
            remaining: self.limit.saturating_sub(used),
            reset_after: Duration::from_nanos(left),
        }
    }

    /// Whether the key counts nothing now (a fresh key would be the same).
    pub(crate) fn is_empty(&self, word: u64, now: Nanos) -> bool {
        Window::hits(word, self.at(now).0) == 0
    }
}

impl From<FixedWindowConfig> for Window {
    fn from(config: FixedWindowConfig) -> Self {
        Window {
            length: duration_to_nanos(config.window).max(1),
            limit: config.limit,
            unix_offset: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    const SECOND: u64 = 1_000_000_000;

    fn window(limit: u64, seconds: u64) -> Window {
        Window {
            length: seconds * SECOND,
            limit,
            unix_offset: 0,
        }
    }

    #[test]
    fn a_window_admits_its_limit_then_refuses_until_it_ends() {
        let w = window(3, 60);
        let word = AtomicU64::new(0);
        let at = 120 * SECOND + 15 * SECOND; // 15 s into a minute
        for remaining in [2, 1, 0] {
            let quota = w.hit(&word, 1, at).unwrap();
            assert_eq!(quota.remaining, remaining);
            assert_eq!(quota.reset_after, Duration::from_secs(45));
        }
        assert_eq!(
            w.hit(&word, 1, at + SECOND),
            Err(Refused::RetryAfter {
                retry_after: Duration::from_secs(44)
            })
        );
        // The next minute starts from zero.
        assert_eq!(w.hit(&word, 1, 180 * SECOND).unwrap().remaining, 2);
    }

    #[test]
    fn refused_hits_are_counted_as_an_incrementing_counter_counts_them() {
        let w = window(10, 1);
        let word = AtomicU64::new(0);
        assert_eq!(w.hit(&word, 8, 0).unwrap().remaining, 2);
        assert!(w.hit(&word, 5, 0).is_err()); // 13 > 10
        assert!(w.hit(&word, 1, 0).is_err()); // 14: still over
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 0).remaining, 0);
    }

    #[test]
    fn windows_follow_the_calendar_on_the_clock_in_use() {
        // A clock whose instant 0 is 10 s past a minute: the minute ends 50 s later.
        let w = Window {
            unix_offset: 70 * SECOND,
            ..window(1, 60)
        };
        let word = AtomicU64::new(0);
        assert_eq!(
            w.hit(&word, 1, 0).unwrap().reset_after,
            Duration::from_secs(50)
        );
        assert!(w.hit(&word, 1, 49 * SECOND).is_err());
        assert!(w.hit(&word, 1, 50 * SECOND).is_ok());
    }

    #[test]
    fn giving_back_counts_only_in_the_same_window() {
        let w = window(2, 1);
        let word = AtomicU64::new(0);
        w.hit(&word, 2, 0).unwrap();
        w.give_back(&word, 1, 0);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 0).remaining, 1);
        w.hit(&word, 1, SECOND).unwrap();
        w.give_back(&word, 5, 0); // the old window's: nothing to do
        assert_eq!(w.quota(word.load(Ordering::Relaxed), SECOND).remaining, 1);
    }

    #[test]
    fn the_count_saturates_instead_of_wrapping() {
        let w = window(u64::from(u32::MAX), 1);
        let word = AtomicU64::new(0);
        assert!(w.hit(&word, u64::from(u32::MAX), 0).is_ok());
        // Full at the largest limit: one more is refused, though the word cannot count it.
        assert!(w.hit(&word, 1, 0).is_err());
        assert!(w.hit(&word, u64::MAX, 0).is_err());
        assert_eq!(
            w.quota(word.load(Ordering::Relaxed), 0).used,
            u64::from(u32::MAX)
        );
        assert!(w.is_empty(word.load(Ordering::Relaxed), SECOND));
    }

    #[test]
    fn bad_parameters_name_their_field() {
        let limit = FixedWindowConfig {
            limit: 0,
            window: Duration::from_secs(1),
        };
        assert!(limit.validate().unwrap_err().to_string().contains("limit"));
        let window = FixedWindowConfig {
            limit: 1,
            window: Duration::from_micros(10),
        };
        assert!(
            window
                .validate()
                .unwrap_err()
                .to_string()
                .contains("window")
        );
    }
}
