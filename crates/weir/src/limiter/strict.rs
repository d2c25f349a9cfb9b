//! `Strict { qps }`: requests spaced exactly `1/qps` apart, no burst.
//!
//! Backpressure's per-key limiter. It answers *when* a request may run: each reservation takes
//! the next free slot, slots are `1/qps` apart, and idle time is not banked, so after a quiet
//! spell the first request runs at once and the second still waits a full interval. That is
//! what a backpressure controller wants from a key it has throttled: a steady trickle, never a
//! burst.
//!
//! ```
//! use std::time::Duration;
//! use weir::{ManualClock, Strict, StrictConfig};
//!
//! let clock = ManualClock::new(0);
//! let strict = Strict::with_clock(StrictConfig { qps: 10.0 }, clock.clone())?;
//! assert_eq!(strict.reserve(1), 0);
//! assert_eq!(strict.reserve(1), 100_000_000); // 100 ms later
//! # Ok::<(), weir::ConfigError>(())
//! ```

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::gcra::{Params, check_shape, wide_interval_for_rate};
use super::word;
use crate::clock::{Clock, Nanos, SystemClock};
use crate::error::{ConfigError, Refused, check_rate};
use crate::sync::AtomicU64;

/// The parameter of a [`Strict`] limiter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StrictConfig {
    /// Requests per second. Finite, > 0, at most 10⁹.
    pub qps: f64,
}

impl StrictConfig {
    /// Checks the parameter; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_rate("qps", self.qps)?;
        check_shape(wide_interval_for_rate(self.qps), 1, self.qps, "qps", "qps")
    }

    pub(crate) fn interval(&self) -> u64 {
        Params::interval_for_rate(self.qps)
    }
}

/// One request per `1/qps`, exactly; see the [module docs](self).
#[derive(Debug)]
pub struct Strict<C: Clock = SystemClock> {
    /// The first free slot. Slots before `now` are gone: idle time is not banked.
    next: AtomicU64,
    interval: AtomicU64,
    clock: C,
    config: Mutex<StrictConfig>,
}

impl Strict<SystemClock> {
    /// A strict limiter on the system clock.
    pub fn new(config: StrictConfig) -> Result<Self, ConfigError> {
        Strict::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> Strict<C> {
    /// A strict limiter reading time from `clock`.
    pub fn with_clock(config: StrictConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Strict {
            next: AtomicU64::new(0),
            interval: AtomicU64::new(config.interval()),
            clock,
            config: Mutex::new(config),
        })
    }

    /// Reserves the next slot for a request of `cost` (it occupies `cost` slots) and returns the
    /// instant, on this limiter's clock, at which it may run. The caller waits until then.
    pub fn reserve(&self, cost: u64) -> Nanos {
        book(&self.next, self.span(cost), self.clock.now())
    }

    #[inline]
    fn span(&self, cost: u64) -> u64 {
        cost.saturating_mul(self.interval.load(Ordering::Acquire))
    }

    /// Reserves a slot if it starts within `max_wait` of now; otherwise takes nothing (the slot
    /// is handed back if nobody reserved after it) and says how far away it was.
    pub fn reserve_within(&self, cost: u64, max_wait: Duration) -> Result<Nanos, Duration> {
        let now = self.clock.now();
        let span = self.span(cost);
        let slot = book(&self.next, span, now);
        let wait = Duration::from_nanos(slot.saturating_sub(now));
        if wait > max_wait {
            give_back(&self.next, slot, span);
            return Err(wait);
        }
        Ok(slot)
    }

    /// Runs now if the next slot has come; otherwise refused with the exact time until it does.
    pub fn try_acquire(&self, cost: u64) -> Result<(), Refused> {
        take(&self.next, self.span(cost), self.clock.now())
    }

    /// Reserves a slot and waits for it.
    ///
    /// Cancel-safe: a waiter dropped before its slot gives the slot back if nobody has reserved
    /// after it (otherwise the slot stays spent: later waiters keep their times).
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, cost: u64) -> super::Admitted {
        let now = self.clock.now();
        let span = cost.saturating_mul(self.interval.load(Ordering::Acquire));
        let slot = book(&self.next, span, now);
        let undo = || give_back(&self.next, slot, span);
        super::Admitted::after(super::waiting::until_due(slot, now, undo).await)
    }

    /// Changes the rate while in use. Slots already reserved keep their times; a rejected
    /// config leaves the limiter untouched.
    pub fn reconfigure(&self, config: StrictConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let mut current = self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.interval.store(config.interval(), Ordering::Release);
        *current = config;
        Ok(())
    }

    /// Forgets the slots already reserved, so the next request runs at once. A controller
    /// relaxing a limit calls this after [`reconfigure`](Self::reconfigure), so that the queue
    /// built under the old, tighter limit does not hold new requests back. Requests that already
    /// hold a slot keep it.
    pub fn forget_reservations(&self) {
        self.next.store(0, Ordering::Release);
    }

    /// The configuration in force.
    pub fn config(&self) -> StrictConfig {
        *self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// The slot arithmetic, over the next free instant, shared with the keyed limiter's cells.

/// Takes the slot at `now` if it has come (the next one then starts `span` later); otherwise
/// refused with the exact time until it does.
#[inline]
pub(crate) fn take(next: &AtomicU64, span: u64, now: Nanos) -> Result<(), Refused> {
    word::update(next, |current| {
        if current > now {
            return Err(Refused::RetryAfter {
                retry_after: Duration::from_nanos(current - now),
            });
        }
        Ok((now.saturating_add(span), ()))
    })
}

/// Reserves the next slot, `span` long; returns the instant it starts.
#[inline]
pub(crate) fn book(next: &AtomicU64, span: u64, now: Nanos) -> Nanos {
    word::apply(next, |current| {
        let slot = current.max(now);
        (slot.saturating_add(span), slot)
    })
}

/// Hands back the slot starting at `slot`, `span` long, if nobody reserved after it (later
/// reservations keep theirs).
#[inline]
pub(crate) fn give_back(next: &AtomicU64, slot: Nanos, span: u64) {
    let _ = next.compare_exchange(
        slot.saturating_add(span),
        slot,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const MS: u64 = 1_000_000;

    fn strict(qps: f64) -> (Strict<ManualClock>, ManualClock) {
        let clock = ManualClock::new(0);
        (
            Strict::with_clock(StrictConfig { qps }, clock.clone()).unwrap(),
            clock,
        )
    }

    #[test]
    fn try_acquire_says_exactly_when() {
        let (strict, clock) = strict(10.0);
        assert_eq!(strict.try_acquire(1), Ok(()));
        assert_eq!(
            strict.try_acquire(1),
            Err(Refused::RetryAfter {
                retry_after: Duration::from_millis(100)
            })
        );
        clock.advance(Duration::from_millis(100));
        assert_eq!(strict.try_acquire(1), Ok(()));
    }

    #[test]
    fn reset_forgets_queued_slots() {
        let (strict, _clock) = strict(1.0);
        for i in 0..5 {
            assert_eq!(strict.reserve(1), i * 1_000 * MS);
        }
        strict.reconfigure(StrictConfig { qps: 10.0 }).unwrap();
        strict.forget_reservations();
        assert_eq!(strict.reserve(1), 0);
        assert_eq!(strict.reserve(1), 100 * MS);
        strict.reconfigure(StrictConfig { qps: 20.0 }).unwrap();
        assert_eq!(strict.reserve(1), 200 * MS, "kept slots stay");
        assert_eq!(strict.reserve(1), 250 * MS);
    }

    #[test]
    fn reserve_within_takes_nothing_when_too_far() {
        let (strict, _clock) = strict(1.0);
        assert_eq!(strict.reserve_within(1, Duration::ZERO), Ok(0));
        assert_eq!(
            strict.reserve_within(1, Duration::from_millis(999)),
            Err(Duration::from_secs(1))
        );
        assert_eq!(
            strict.reserve_within(1, Duration::from_secs(1)),
            Ok(1_000 * MS)
        );
    }

    #[test]
    fn bad_qps_is_refused_by_name() {
        for qps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = Strict::new(StrictConfig { qps }).unwrap_err();
            assert!(err.to_string().contains("`qps`"), "{err}");
        }
        let (strict, _clock) = strict(10.0);
        assert!(strict.reconfigure(StrictConfig { qps: 0.0 }).is_err());
        assert_eq!(strict.config(), StrictConfig { qps: 10.0 });
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_last_waiter_gives_its_slot_back() {
        let strict =
            Strict::with_clock(StrictConfig { qps: 1.0 }, crate::TokioClock::new()).unwrap();
        assert!(!strict.acquire(1).await.throttled());
        let timed_out = tokio::time::timeout(Duration::from_millis(10), strict.acquire(1)).await;
        assert!(timed_out.is_err());
        let admitted = strict.acquire(1).await;
        assert_eq!(admitted.waited(), Duration::from_millis(990));
    }
}
