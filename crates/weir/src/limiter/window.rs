//! Window limiters: at most `limit` hits per `window`, each key's count in one word.
//!
//! Time is cut into windows of one `window` each, aligned to the Unix epoch (a minute window
//! starts on the minute, a day window at midnight UTC). How a window *counts* is a
//! `WindowCount`: the fixed window ([`fixed_window`](super::fixed_window)) counts each
//! window on its own; other counts may weigh the window before. Whatever the count, a key's
//! whole state is one `u64` changed by one compare-and-swap, a window never queues (a request
//! it refuses is told when to retry), and the keyed limiter, the policies, the cluster handover
//! and every protocol treat all counts alike: they see a `Window` and call its methods.
//!
//! A new way of counting is one file: a unit struct implementing `WindowCount`, a
//! `pub const COUNT: Count` naming it, and its table in the policy config.

use std::fmt;
use std::time::Duration;

use crate::clock::{Nanos, duration_to_nanos};
use crate::error::{ConfigError, Refused};
use crate::sync::AtomicU64;

/// The shortest window.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// How a window limiter counts: one of the window counts, by the name its table has in config
/// (`fixed_window`).
#[derive(Clone, Copy)]
pub struct Count(&'static dyn WindowCount);

impl Count {
    /// The count behind `count`.
    pub(crate) const fn new(count: &'static dyn WindowCount) -> Count {
        Count(count)
    }

    /// The name of its table in config.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The largest `limit` its word can count.
    pub fn max_limit(&self) -> u64 {
        self.0.max_limit()
    }

    /// Whether a refused hit is counted too (as an increment-then-compare counter counts it).
    pub fn counts_refused(&self) -> bool {
        self.0.counts_refused()
    }

    /// In how many windows a hit still counts, its own included: how long a key takes to be
    /// whole again, in windows.
    pub fn windows_a_hit_counts_in(&self) -> u64 {
        self.0.windows_a_hit_counts_in()
    }
}

impl PartialEq for Count {
    fn eq(&self, other: &Count) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Count {}

impl fmt::Debug for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a window limiter counts a key's hits in one word. Every method gets the [`Window`] it
/// counts in (length, limit, where windows start) and the key's word; none reads a clock.
pub(crate) trait WindowCount: Send + Sync {
    /// The name of its table in config.
    fn name(&self) -> &'static str;

    /// The largest `limit` the word can count.
    fn max_limit(&self) -> u64;

    /// The limits allowed, as an error says them: "between 1 and" the largest.
    fn limit_range(&self) -> &'static str;

    /// Whether a refused hit is counted.
    fn counts_refused(&self) -> bool;

    /// In how many windows a hit still counts, its own included.
    fn windows_a_hit_counts_in(&self) -> u64;

    /// Whether a larger word is never an emptier window, so that keys past the map's cap can
    /// be counted in a max-sketch (`keyed/sketch.rs`). A count that is not is shared past the
    /// cap instead.
    fn word_grows_as_it_fills(&self) -> bool;

    /// Counts `cost` hits now, or refuses them. `cost` is at most the limit, unless the count
    /// counts refused hits (then it may be more, and is counted and refused).
    fn hit(
        &self,
        window: &Window,
        word: &AtomicU64,
        cost: u64,
        now: Nanos,
    ) -> Result<Quota, Refused>;

    /// Takes back `cost` hits counted at `at`, wherever they still count.
    fn give_back(&self, window: &Window, word: &AtomicU64, cost: u64, at: Nanos);

    /// What the key whose word is `word` has left now.
    fn quota(&self, window: &Window, word: u64, now: Nanos) -> Quota;

    /// Counts hits as though admitted now until at most `remaining` are left: how a bucket's
    /// new owner takes on what another node handed it (`handed`, that node's
    /// `quota` when it let go). Never makes the window emptier.
    fn take_on(&self, window: &Window, word: &AtomicU64, handed: Quota, now: Nanos);

    /// What a bucket's new owner, owner for `held_for`, allows while it cannot know what the
    /// previous owner counted: hits from before its tenure may still count, so it holds the
    /// window as full as they could have made it. Never makes the window emptier.
    fn hold_for_tenure(&self, window: &Window, word: &AtomicU64, held_for: Nanos, now: Nanos);
}

/// The parameters of a window limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    /// How the window counts.
    pub count: Count,
    /// The most hits a window admits: 1 to the count's [`max_limit`](Count::max_limit).
    pub limit: u64,
    /// A window's length: at least a millisecond.
    pub window: Duration,
}

impl WindowConfig {
    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.limit == 0 || self.limit > self.count.max_limit() {
            return Err(ConfigError::OutOfRange {
                field: "limit",
                allowed: self.count.0.limit_range(),
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

/// What a limiter says a key has left, after a hit or when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// What the key has spent: a window's hits (for a count of refused hits, beyond the limit
    /// too), a bucket's tokens in use, a concurrency key's permits in flight.
    pub used: u64,
    /// What the key may still spend before it is refused.
    pub remaining: u64,
    /// How long until the key is whole again: until no hit counts any more for a window, the
    /// time until a bucket is full for a token bucket.
    pub reset_after: Duration,
}

/// A window limiter's shape, with where the calendar's windows start on the clock in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// How the window counts.
    pub(crate) count: Count,
    /// A window's length in nanoseconds (≥ 1 ms).
    pub(crate) length: u64,
    /// The most hits a window admits (≤ the count's largest).
    pub(crate) limit: u64,
    /// The Unix time of the clock's instant 0 ([`Clock::unix_offset`](crate::Clock)).
    pub(crate) unix_offset: Nanos,
}

impl Window {
    /// The number of the window `now` falls in, and how long until it ends.
    #[inline]
    pub(crate) fn at(&self, now: Nanos) -> (u64, u64) {
        let unix = now.wrapping_add(self.unix_offset);
        (unix / self.length, self.length - unix % self.length)
    }

    /// Counts `cost` hits now, or refuses them. A cost above the limit is refused with no time
    /// to retry at (no window can ever hold it); a count of refused hits counts it all the
    /// same, as an increment-then-compare counter does.
    #[inline]
    pub(crate) fn hit(&self, word: &AtomicU64, cost: u64, now: Nanos) -> Result<Quota, Refused> {
        if cost > self.limit {
            if self.count.counts_refused() {
                let _ = self.count.0.hit(self, word, cost, now);
            }
            return Err(Refused::ExceedsCapacity {
                cost,
                capacity: self.limit,
            });
        }
        self.count.0.hit(self, word, cost, now)
    }

    /// Takes back `cost` hits counted at `at`.
    pub(crate) fn give_back(&self, word: &AtomicU64, cost: u64, at: Nanos) {
        self.count.0.give_back(self, word, cost, at)
    }

    /// What the key has left now.
    pub(crate) fn quota(&self, word: u64, now: Nanos) -> Quota {
        self.count.0.quota(self, word, now)
    }

    /// Whether the key counts nothing now (a fresh key would be the same).
    pub(crate) fn is_empty(&self, word: u64, now: Nanos) -> bool {
        self.quota(word, now).used == 0
    }

    /// See [`WindowCount::take_on`].
    pub(crate) fn take_on(&self, word: &AtomicU64, handed: Quota, now: Nanos) {
        self.count.0.take_on(self, word, handed, now)
    }

    /// See [`WindowCount::hold_for_tenure`].
    pub(crate) fn hold_for_tenure(&self, word: &AtomicU64, held_for: Nanos, now: Nanos) {
        self.count.0.hold_for_tenure(self, word, held_for, now)
    }

    /// See [`WindowCount::word_grows_as_it_fills`].
    pub(crate) fn word_grows_as_it_fills(&self) -> bool {
        self.count.0.word_grows_as_it_fills()
    }
}

impl From<WindowConfig> for Window {
    fn from(config: WindowConfig) -> Self {
        Window {
            count: config.count,
            length: duration_to_nanos(config.window).max(1),
            limit: config.limit,
            unix_offset: 0,
        }
    }
}

#[cfg(test)]
impl Window {
    /// A window of `count`, `limit` hits per `seconds`, windows starting at instant 0: for the
    /// counts' tests.
    pub(crate) fn of_seconds(count: Count, limit: u64, seconds: u64) -> Window {
        Window {
            count,
            length: seconds * 1_000_000_000,
            limit,
            unix_offset: 0,
        }
    }
}
