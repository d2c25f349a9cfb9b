//! The sliding window counter ([`COUNT`], table `sliding_window`): at most `limit` hits in any
//! `window`, estimated from two calendar windows' counts.
//!
//! The counting Cloudflare, Upstash and Kong users know. A fixed window lets a client spend
//! `limit` at the end of one window and `limit` again at the start of the next. An exact
//! sliding log (every hit's time kept) never does, but costs memory per hit. The sliding
//! window counter keeps two counts, the current calendar window's and the one before, and
//! reads the hits of the last `window` as
//!
//! ```text
//! estimate = before × (time left in this window / window) + this window's hits
//! ```
//!
//! that is, as though the window before's hits were spread evenly over it. A hit is admitted
//! if the estimate plus its cost stays within `limit`; a refused hit is not counted, so a
//! client that keeps knocking is not kept out longer for it. The weighted count is rounded up,
//! so the estimate never reads lower than that formula. Its accuracy against an exact sliding
//! log on bursty load is measured in `docs/benchmarks.md` ("Window limiters against an exact
//! sliding log").
//!
//! A key's whole state is one word: the window's number (modulo 2²⁰), the window before's
//! count and this window's (22 bits each, so `limit` is at most 4 194 303). Counts of windows
//! older than the one before hold nothing. A key would have to stay idle for exactly 2²⁰
//! windows (12 days of second windows, two years of minute windows) for its old counts to be
//! read again: the estimate would then be too high, never too low, for at most two windows.
//!
//! The word does not grow as the window fills (a later window may hold fewer hits than an
//! earlier one's pair), so keys past a policy's `max_keys` share one overflow window rather
//! than a sketch.

use std::time::Duration;

use super::window::{Count, Quota, Window, WindowCount};
use super::word;
use crate::clock::Nanos;
use crate::error::Refused;
use crate::sync::AtomicU64;

/// The sliding window counter.
pub const COUNT: Count = Count::new(&SlidingWindow);

struct SlidingWindow;

const COUNT_BITS: u32 = 22;
const HITS: u64 = (1 << COUNT_BITS) - 1;
const NUMBERS: u64 = (1 << (64 - 2 * COUNT_BITS)) - 1;

/// A key's counts seen from the window `number`: the window before's and this one's.
#[inline]
fn counts(word: u64, number: u64) -> (u64, u64) {
    let stored = word >> (2 * COUNT_BITS);
    let (before, this) = ((word >> COUNT_BITS) & HITS, word & HITS);
    if stored == number & NUMBERS {
        (before, this)
    } else if stored == number.wrapping_sub(1) & NUMBERS {
        (this, 0)
    } else {
        (0, 0)
    }
}

#[inline]
fn pack(number: u64, before: u64, this: u64) -> u64 {
    (number & NUMBERS) << (2 * COUNT_BITS) | before.min(HITS) << COUNT_BITS | this.min(HITS)
}

/// The window before's hits still in the sliding window, `left` of `length` from its end,
/// rounded up.
#[inline]
fn weighted(before: u64, left: u64, length: u64) -> u64 {
    (u128::from(before) * u128::from(left)).div_ceil(u128::from(length)) as u64
}

/// How long, with no other hit, until `cost` more fits: within this window if this window's
/// hits leave room, else into the next, where this window's hits weigh as the window before.
fn retry_after(window: &Window, (before, this): (u64, u64), cost: u64, left: u64) -> u64 {
    let length = window.length;
    // The largest weight, in nanoseconds left, at which `hits` weighted leaves `room`:
    // ceil(hits × w / length) ≤ room  ⇔  w ≤ room × length / hits.
    let fits_at = |hits: u64, room: u64| {
        (u128::from(room) * u128::from(length) / u128::from(hits.max(1))).min(u128::from(length))
            as u64
    };
    if this + cost <= window.limit {
        left - fits_at(before, window.limit - this - cost).min(left)
    } else {
        left + length - fits_at(this, window.limit - cost)
    }
}

/// Raises the counts seen from the window `now` falls in to at least these floors.
fn raise(window: &Window, word: &AtomicU64, floors: (u64, u64), now: Nanos) {
    let (number, _) = window.at(now);
    let _ = word::update(word, |current| {
        let (before, this) = counts(current, number);
        let raised = (before.max(floors.0), this.max(floors.1));
        if raised == (before, this) {
            return Err(());
        }
        Ok((pack(number, raised.0, raised.1), ()))
    });
}

impl WindowCount for SlidingWindow {
    fn name(&self) -> &'static str {
        "sliding_window"
    }

    fn max_limit(&self) -> u64 {
        HITS
    }

    fn limit_range(&self) -> &'static str {
        "between 1 and 4194303"
    }

    fn counts_refused(&self) -> bool {
        false
    }

    fn windows_a_hit_counts_in(&self) -> u64 {
        2
    }

    fn word_grows_as_it_fills(&self) -> bool {
        false
    }

    fn hit(
        &self,
        window: &Window,
        word: &AtomicU64,
        cost: u64,
        now: Nanos,
    ) -> Result<Quota, Refused> {
        let (number, left) = window.at(now);
        word::update(word, |current| {
            let (before, this) = counts(current, number);
            let used = weighted(before, left, window.length) + this + cost;
            if used > window.limit {
                let retry = retry_after(window, (before, this), cost, left);
                return Err(Refused::RetryAfter {
                    retry_after: Duration::from_nanos(retry),
                });
            }
            let quota = Quota {
                used,
                remaining: window.limit - used,
                reset_after: Duration::from_nanos(left + window.length),
            };
            Ok((pack(number, before, this + cost), quota))
        })
    }

    /// From this window's count if `at` is in it, from the window before's if `at` was there.
    fn give_back(&self, window: &Window, word: &AtomicU64, cost: u64, at: Nanos) {
        let (then, _) = window.at(at);
        let _ = word::update(word, |current| {
            let stored = current >> (2 * COUNT_BITS);
            let (before, this) = counts(current, stored);
            if stored == then & NUMBERS {
                Ok((pack(stored, before, this - this.min(cost)), ()))
            } else if stored == then.wrapping_add(1) & NUMBERS {
                Ok((pack(stored, before - before.min(cost), this), ()))
            } else {
                Err(())
            }
        });
    }

    fn quota(&self, window: &Window, word: u64, now: Nanos) -> Quota {
        let (number, left) = window.at(now);
        let (before, this) = counts(word, number);
        let used = weighted(before, left, window.length) + this;
        // Whole again once neither count weighs any more.
        let reset_after = match (before, this) {
            (_, 1..) => left + window.length,
            (1.., 0) => left,
            (0, 0) => 0,
        };
        Quota {
            used,
            remaining: window.limit.saturating_sub(used),
            reset_after: Duration::from_nanos(reset_after),
        }
    }

    /// The handed estimate as this window's hits: it then weighs for the rest of this window
    /// and through the next, never less than the hits behind it did on the other node.
    fn take_on(&self, window: &Window, word: &AtomicU64, handed: Quota, now: Nanos) {
        let (number, left) = window.at(now);
        let target = window.limit.saturating_sub(handed.remaining);
        let _ = word::update(word, |current| {
            let (before, this) = counts(current, number);
            let used = weighted(before, left, window.length) + this;
            if used >= target {
                return Err(());
            }
            Ok((pack(number, before, this + (target - used)), ()))
        });
    }

    /// Hits from before the tenure could have filled the window they were in: this window if
    /// the tenure began in it, so it is held full (and weighs as a full window before, next
    /// window); the window before if the tenure began there, so it weighs as full.
    fn hold_for_tenure(&self, window: &Window, word: &AtomicU64, held_for: Nanos, now: Nanos) {
        let (_, left) = window.at(now);
        let begun = window.length - left;
        let limit = window.limit;
        if held_for < begun {
            raise(window, word, (0, limit), now);
        } else if held_for < begun + window.length {
            raise(window, word, (limit, 0), now);
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

    fn retry(refused: Result<Quota, Refused>) -> Duration {
        match refused {
            Err(Refused::RetryAfter { retry_after }) => retry_after,
            other => panic!("expected a refusal with a time, got {other:?}"),
        }
    }

    #[test]
    fn the_window_before_weighs_by_its_overlap_with_the_last_window() {
        let w = window(10, 60);
        let word = AtomicU64::new(0);
        // 10 hits in the minute [0, 60).
        assert_eq!(w.hit(&word, 10, 30 * SECOND).unwrap().remaining, 0);
        // 15 s into the next minute, 45/60 of them still count: ceil(7.5) = 8, so 2 fit.
        let at = 75 * SECOND;
        assert_eq!(w.quota(word.load(Ordering::Relaxed), at).used, 8);
        assert_eq!(w.hit(&word, 2, at).unwrap().remaining, 0);
        // A third waits until the weight drops to 7: 42 s left, 18 s in (3 s from now).
        assert_eq!(retry(w.hit(&word, 1, at)), Duration::from_secs(3));
        assert!(w.hit(&word, 1, 78 * SECOND).is_ok());
    }

    #[test]
    fn no_double_burst_at_a_windows_edge() {
        // A fixed window would admit 10 at 59 s and 10 more at 60 s.
        let w = window(10, 60);
        let word = AtomicU64::new(0);
        assert!(w.hit(&word, 10, 59 * SECOND).is_ok());
        assert!(w.hit(&word, 1, 60 * SECOND).is_err());
        // Half a window later, half the window before still counts.
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 90 * SECOND).used, 5);
    }

    #[test]
    fn a_full_window_waits_into_the_next_until_its_weight_leaves_room() {
        let w = window(4, 10);
        let word = AtomicU64::new(0);
        assert!(w.hit(&word, 4, 2 * SECOND).is_ok());
        // Full: in the next window, 4 × w/10 + 1 ≤ 4 once w ≤ 7.5 s, i.e. 2.5 s into it.
        let wait = retry(w.hit(&word, 1, 5 * SECOND));
        assert_eq!(wait, Duration::from_millis(7_500));
        let at = 5 * SECOND + 7_500_000_000;
        assert!(w.hit(&word, 1, at - 1).is_err());
        assert!(w.hit(&word, 1, at).is_ok());
    }

    #[test]
    fn refused_hits_are_not_counted() {
        let w = window(3, 1);
        let word = AtomicU64::new(0);
        w.hit(&word, 3, 0).unwrap();
        for _ in 0..5 {
            assert!(w.hit(&word, 1, 0).is_err());
        }
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 0).used, 3);
    }

    #[test]
    fn windows_older_than_the_one_before_hold_nothing() {
        let w = window(5, 1);
        let word = AtomicU64::new(0);
        w.hit(&word, 5, 0).unwrap();
        let value = word.load(Ordering::Relaxed);
        assert!(!w.is_empty(value, SECOND + SECOND / 2));
        assert!(w.is_empty(value, 2 * SECOND));
        assert_eq!(w.hit(&word, 5, 2 * SECOND).unwrap().remaining, 0);
    }

    #[test]
    fn giving_back_finds_the_hits_in_this_window_or_the_one_before() {
        let w = window(4, 1);
        let word = AtomicU64::new(0);
        w.hit(&word, 4, 0).unwrap();
        w.give_back(&word, 1, 0);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 0).used, 3);
        // Now they are the window before's: 3 weighted by a half is 2 (rounded up).
        let half = SECOND + SECOND / 2;
        assert_eq!(w.quota(word.load(Ordering::Relaxed), half).used, 2);
        w.give_back(&word, 2, 0);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), half).used, 1);
        // Hits of a window that no longer counts: nothing to take back.
        w.give_back(&word, 1, 5 * SECOND);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), half).used, 1);
    }

    #[test]
    fn a_new_owner_takes_on_the_handed_estimate_and_never_lowers_its_own() {
        let w = window(10, 10);
        let word = AtomicU64::new(0);
        let handed = Quota {
            used: 6,
            remaining: 4,
            reset_after: Duration::from_secs(15),
        };
        w.take_on(&word, handed, 5 * SECOND);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 5 * SECOND).used, 6);
        // It still weighs in the next window, as the hits behind it would.
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 15 * SECOND).used, 3);
        w.hit(&word, 4, 5 * SECOND).unwrap();
        w.take_on(&word, handed, 5 * SECOND);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 5 * SECOND).used, 10);
    }

    #[test]
    fn a_new_owner_holds_what_hits_before_its_tenure_could_still_weigh() {
        let w = window(10, 10);
        // Owner for 2 s, 5 s into a window: this window could be full.
        let word = AtomicU64::new(0);
        w.hold_for_tenure(&word, 2 * SECOND, 5 * SECOND);
        assert_eq!(
            w.quota(word.load(Ordering::Relaxed), 5 * SECOND).remaining,
            0
        );
        // Owner for 8 s, 5 s in: only the window before could be full; it weighs a half.
        let word = AtomicU64::new(0);
        w.hold_for_tenure(&word, 8 * SECOND, 5 * SECOND);
        assert_eq!(w.quota(word.load(Ordering::Relaxed), 5 * SECOND).used, 5);
        // Owner since before the window before: nothing from then still weighs.
        let word = AtomicU64::new(0);
        w.hold_for_tenure(&word, 15 * SECOND, 5 * SECOND);
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_largest_limit_is_counted_in_full_and_a_larger_one_is_refused_by_name() {
        let w = window(HITS, 1);
        let word = AtomicU64::new(0);
        assert!(w.hit(&word, HITS, 0).is_ok());
        assert!(w.hit(&word, 1, 0).is_err());
        let too_many = WindowConfig {
            count: COUNT,
            limit: HITS + 1,
            window: Duration::from_secs(1),
        };
        let error = too_many.validate().unwrap_err().to_string();
        assert!(
            error.contains("limit") && error.contains("4194303"),
            "{error}"
        );
    }

    #[test]
    fn every_wait_it_names_is_exact() {
        // Whatever the counts and the time, a refused hit fits at its retry time and not a
        // nanosecond before (with no other hit between).
        let w = window(7, 3);
        for before in 0..=7 {
            for this in 0..=7 {
                for cost in 1..=7 {
                    for at in [0, 1, SECOND, 2 * SECOND + 999_999_999] {
                        let number = 40;
                        let now = number * w.length + at;
                        let start = pack(number, before, this);
                        let word = AtomicU64::new(start);
                        let Err(Refused::RetryAfter { retry_after }) = w.hit(&word, cost, now)
                        else {
                            continue;
                        };
                        let then = now + retry_after.as_nanos() as u64;
                        assert!(
                            w.hit(&AtomicU64::new(start), cost, then).is_ok(),
                            "{before} {this} {cost} {at}: not admitted after {retry_after:?}"
                        );
                        assert!(
                            w.hit(&AtomicU64::new(start), cost, then - 1).is_err(),
                            "{before} {this} {cost} {at}: admitted before {retry_after:?}"
                        );
                    }
                }
            }
        }
    }
}
