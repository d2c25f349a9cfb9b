//! The fixed window ([`COUNT`], table `fixed_window`): at most `limit` hits per window, each
//! window counted on its own.
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

use super::window::{Count, Quota, Window, WindowCount};
use super::word;
use crate::clock::Nanos;
use crate::error::Refused;
use crate::sync::AtomicU64;

/// The fixed window: each window counts on its own, refused hits too.
pub const COUNT: Count = Count::new(&FixedWindow);

struct FixedWindow;

const HITS: u64 = u32::MAX as u64;

/// The hits `word` holds for the window `number`.
#[inline]
fn hits(word: u64, number: u64) -> u64 {
    if word >> 32 == number & HITS {
        word & HITS
    } else {
        0
    }
}

/// Raises the count of the window `now` falls in to `floor`, unless it is already there.
fn hold_to(window: &Window, word: &AtomicU64, floor: u64, now: Nanos) {
    let (number, _) = window.at(now);
    let _ = word::update(word, |current| {
        if hits(current, number) >= floor {
            return Err(());
        }
        Ok(((number & HITS) << 32 | floor, ()))
    });
}

impl WindowCount for FixedWindow {
    fn name(&self) -> &'static str {
        "fixed_window"
    }

    fn max_limit(&self) -> u64 {
        HITS
    }

    fn limit_range(&self) -> &'static str {
        "between 1 and 4294967295"
    }

    fn counts_refused(&self) -> bool {
        true
    }

    fn windows_a_hit_counts_in(&self) -> u64 {
        1
    }

    /// A later window, or more hits in the same one, is a larger word.
    fn word_grows_as_it_fills(&self) -> bool {
        true
    }

    /// Admits the hits if the window's count stays within the limit; counts them either way.
    #[inline]
    fn hit(
        &self,
        window: &Window,
        word: &AtomicU64,
        cost: u64,
        now: Nanos,
    ) -> Result<Quota, Refused> {
        let (number, left) = window.at(now);
        // The word keeps at most 2³² − 1 hits; the decision sees the whole sum, so a window at
        // the largest limit still refuses once it is full.
        let after = word::apply(word, |current| {
            let after = hits(current, number).saturating_add(cost);
            ((number & HITS) << 32 | after.min(HITS), after)
        });
        let reset_after = Duration::from_nanos(left);
        if after <= window.limit {
            Ok(Quota {
                used: after,
                remaining: window.limit - after,
                reset_after,
            })
        } else {
            Err(Refused::RetryAfter {
                retry_after: reset_after,
            })
        }
    }

    /// Only within the window they were counted in.
    fn give_back(&self, window: &Window, word: &AtomicU64, cost: u64, at: Nanos) {
        let (number, _) = window.at(at);
        let _ = word::update(word, |current| {
            if current >> 32 != number & HITS {
                return Err(());
            }
            Ok((current - (current & HITS).min(cost), ()))
        });
    }

    fn quota(&self, window: &Window, word: u64, now: Nanos) -> Quota {
        let (number, left) = window.at(now);
        let used = hits(word, number);
        Quota {
            used,
            remaining: window.limit.saturating_sub(used),
            reset_after: Duration::from_nanos(left),
        }
    }

    /// Only a count of the window in force here: one whose end is within half a window of
    /// this one's (the nodes' clocks differ a little; a count of the window before does not
    /// carry into this one).
    fn take_on(&self, window: &Window, word: &AtomicU64, handed: Quota, now: Nanos) {
        let (_, left) = window.at(now);
        if Duration::from_nanos(left).abs_diff(handed.reset_after)
            < Duration::from_nanos(window.length / 2)
        {
            hold_to(
                window,
                word,
                window.limit.saturating_sub(handed.remaining),
                now,
            );
        }
    }

    /// A window begun before the tenure is full until it ends.
    fn hold_for_tenure(&self, window: &Window, word: &AtomicU64, held_for: Nanos, now: Nanos) {
        let (_, left) = window.at(now);
        if window.length - left > held_for {
            hold_to(window, word, window.limit, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::window::WindowConfig;
    use std::sync::atomic::Ordering;

    const SECOND: u64 = 1_000_000_000;

    fn window(limit: u64, seconds: u64) -> Window {
        Window::of_seconds(COUNT, limit, seconds)
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
        let limit = WindowConfig {
            count: COUNT,
            limit: 0,
            window: Duration::from_secs(1),
        };
        assert!(limit.validate().unwrap_err().to_string().contains("limit"));
        let window = WindowConfig {
            count: COUNT,
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
