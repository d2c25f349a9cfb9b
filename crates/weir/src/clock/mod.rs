//! Where limiters get the time from.
//!
//! No limiter in Weir reads the system time itself. Each one is generic over a [`Clock`], a
//! source of monotonic nanoseconds, so the same decision code runs against:
//!
//! - [`SystemClock`] — real monotonic time, the default;
//! - [`TokioClock`] (feature `tokio`) — tokio's clock, which follows a *paused* runtime in tests
//!   (`#[tokio::test(start_paused = true)]`), so async waiting can be tested exactly;
//! - [`ManualClock`] — time that moves only when a test says so, for synchronous tests;
//! - [`CoarseClock`] — real time read from memory, refreshed by a background thread: a third of
//!   a decision's cost, for a bounded loss of precision (see [`coarse`]).
//!
//! Timestamps are plain [`Nanos`]: nanoseconds since the clock's own origin. Only differences
//! between two readings of the same clock mean anything. `Nanos` is only ever an *instant*: every
//! length of time in Weir's API is a [`Duration`] (a lease's TTL, a window, a wait), and inside
//! the limiters a length kept as a nanosecond count is a `u64` named for what it measures
//! (`interval`, `span`, `window_ns`), never a `Nanos`.

pub mod coarse;
#[cfg(feature = "tokio")]
mod tokio_clock;

pub use coarse::CoarseClock;
#[cfg(feature = "tokio")]
pub use tokio_clock::TokioClock;

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// An instant: nanoseconds since a clock's origin. Never a length of time (that is a
/// [`Duration`]).
pub type Nanos = u64;

/// A source of monotonic time for limiters.
///
/// `now` must never go backwards. Limiters tolerate a clock that stands still, but a clock that
/// jumps back would let them admit early.
pub trait Clock: Send + Sync + 'static {
    /// The current time in nanoseconds since this clock's origin.
    fn now(&self) -> Nanos;

    /// The Unix time, in nanoseconds, of this clock's instant 0: `now() + unix_offset()` is
    /// the time of day. Windows aligned to the calendar (a one-minute fixed window starts on
    /// the minute, as every server counting the same keys expects) need it; nothing else does.
    ///
    /// The default, 0, says the clock's instants already are Unix times: a [`ManualClock`]
    /// in a test starts wherever the test puts it.
    fn unix_offset(&self) -> Nanos {
        0
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }

    fn unix_offset(&self) -> Nanos {
        (**self).unix_offset()
    }
}

/// Converts a duration to nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `by` after `at` (saturating at the end of a clock's time).
pub fn after(at: Nanos, by: Duration) -> Nanos {
    at.saturating_add(duration_to_nanos(by))
}

/// The time from `earlier` to `later`; zero if `later` is not later.
pub fn between(earlier: Nanos, later: Nanos) -> Duration {
    Duration::from_nanos(later.saturating_sub(earlier))
}

/// Real monotonic time.
///
/// Backed by [`quanta`], which reads the CPU's time-stamp counter where that is reliable and
/// falls back to the OS monotonic clock elsewhere: a reading costs a fraction of
/// what `std::time::Instant::now()` does, which matters on a limiter's hot path. All
/// `SystemClock`s in a process share one origin, so their readings are comparable and advance at
/// the same rate as [`std::time::Instant`] (and therefore as tokio's timer).
#[derive(Debug, Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    /// A raw counter reading taken once per process; readings are scaled relative to it.
    origin: u64,
}

impl SystemClock {
    /// A clock reading real monotonic time.
    pub fn new() -> Self {
        let (clock, origin, _) = system_origin();
        SystemClock {
            clock: clock.clone(),
            origin: *origin,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Scaling the raw delta directly skips a round trip through `Duration`, a measurable
        // share of a decision.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }

    fn unix_offset(&self) -> Nanos {
        system_origin().2
    }
}

/// The process-wide origin of [`SystemClock`] (and [`CoarseClock`]): the counter, its reading
/// at instant 0, and the Unix time of instant 0 (read once: the wall clock may be stepped
/// later, the monotonic one may not).
fn system_origin() -> &'static (quanta::Clock, u64, Nanos) {
    static ORIGIN: OnceLock<(quanta::Clock, u64, Nanos)> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, duration_to_nanos);
        (clock, origin, unix)
    })
}

/// Time that moves only when told to: for exact, synchronous tests.
///
/// Clones share the same time, so a test can hand one clone to a limiter and advance another.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_to_nanos(by), Ordering::AcqRel);
    }

    /// Sets the time. Moving it backwards is a bug in the test and panics.
    pub fn set(&self, to: Nanos) {
        let previous = self.now.swap(to, Ordering::AcqRel);
        assert!(
            previous <= to,
            "ManualClock moved backwards from {previous} to {to}"
        );
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(5);
        let other = clock.clone();
        assert_eq!(clock.now(), 5);
        other.advance(Duration::from_millis(1));
        assert_eq!(clock.now(), 1_000_005);
        clock.set(2_000_000);
        assert_eq!(other.now(), 2_000_000);
    }

    #[test]
    #[should_panic(expected = "moved backwards")]
    fn manual_clock_refuses_to_go_back() {
        let clock = ManualClock::new(10);
        clock.set(9);
    }

    #[test]
    fn system_clocks_share_an_origin_and_do_not_go_back() {
        let a = SystemClock::new();
        let first = a.now();
        let b = SystemClock::new();
        let second = b.now();
        assert!(second >= first);
        assert!(a.now() >= second);
    }
}
