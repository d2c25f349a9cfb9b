//! GCRA, the arithmetic behind both token buckets and leaky buckets.
//!
//! The Generic Cell Rate Algorithm keeps a whole bucket in one number: the *theoretical arrival
//! time* (TAT), the instant at which the bucket would be full again if nothing else were taken.
//! With `interval` nanoseconds per token and room for `capacity` tokens
//! (`tolerance = interval × capacity`):
//!
//! - tokens available at `now` = `(now + tolerance − max(tat, now)) / interval`;
//! - taking `cost` tokens moves `tat` to `max(tat, now) + cost × interval`, allowed only while the
//!   new `tat` is at most `now + tolerance`;
//! - a refused request becomes admissible at `new_tat − tolerance`, which is exactly its
//!   retry-after.
//!
//! This is the continuous token bucket, rounded to the nanosecond, updated with a single
//! compare-and-swap: no lock and no background refill task. The functions here are pure apart
//! from that one atomic; time always comes in as an argument.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Nanos;
use crate::error::Refused;

/// A bucket's shape: nanoseconds per token and the nanoseconds' worth of tokens it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    /// Nanoseconds per token: the inverse of the rate. At least 1.
    pub interval: u64,
    /// `interval × capacity`: how far ahead of `now` the TAT may run.
    pub tolerance: u64,
}

impl Params {
    /// The shape of a bucket refilling one token every `interval` ns and holding `capacity`.
    pub fn new(interval: u64, capacity: u64) -> Self {
        let interval = interval.max(1);
        Params {
            interval,
            tolerance: interval.saturating_mul(capacity),
        }
    }

    /// Nanoseconds per token for a rate in tokens per second, rounded up so that rounding can
    /// only make the limiter stricter, never looser.
    pub fn interval_for_rate(per_second: f64) -> u64 {
        ((1e9 / per_second).ceil() as u64).max(1)
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.tolerance / self.interval
    }

    /// The TAT of a bucket that holds `initial` tokens at `now`.
    pub fn tat_holding(&self, initial: u64, now: Nanos) -> Nanos {
        let missing = self.capacity().saturating_sub(initial);
        now.saturating_add(missing.saturating_mul(self.interval))
    }
}

#[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
/// A reservation taken by [`reserve`]: when it may run and what it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The instant the request may run (never before the `now` it was taken at).
    pub ready: Nanos,
    /// The tokens it took, to hand back with [`give_back`] if it is cancelled. Kept in tokens,
    /// not nanoseconds, so that a give-back after a reshape is right in the new shape.
    pub taken: u64,
}

/// Takes `cost` tokens if they are there now; otherwise says when they would be.
#[inline]
pub(crate) fn try_acquire(
    tat: &AtomicU64,
    params: Params,
    cost: u64,
    now: Nanos,
) -> Result<(), Refused> {
    let increment = cost.saturating_mul(params.interval);
    if increment > params.tolerance {
        return Err(Refused::ExceedsCapacity {
            cost,
            capacity: params.capacity(),
        });
    }
    let mut current = tat.load(Ordering::Acquire);
    loop {
        let next = current.max(now).saturating_add(increment);
        let ready = next.saturating_sub(params.tolerance);
        if ready > now {
            return Err(Refused::RetryAfter {
                retry_after: Duration::from_nanos(ready - now),
            });
        }
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

#[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
/// Takes `cost` tokens unconditionally, going into debt if needed, and returns when the request
/// may run. Reservations are served in the order they are taken, and a request larger than the
/// capacity is fine: it drains the full bucket and waits for the rest.
pub(crate) fn reserve(tat: &AtomicU64, params: Params, cost: u64, now: Nanos) -> Reservation {
    let taken = cost.saturating_mul(params.interval);
    let previous = tat
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            Some(current.max(now).saturating_add(taken))
        })
        .unwrap_or_else(|current| current);
    let next = previous.max(now).saturating_add(taken);
    Reservation {
        ready: next.saturating_sub(params.tolerance).max(now),
        taken: cost,
    }
}

#[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
/// Returns the `tokens` a cancelled reservation (or a rolled-back admission) took, in the
/// bucket's current shape.
///
/// The bucket ends as if the reservation had never been made *at the instant it was made*:
/// tokens that would have overflowed a full bucket stay lost, and everything that accrued since
/// is kept.
pub(crate) fn give_back(tat: &AtomicU64, tokens: u64, params: Params) {
    let amount = tokens.saturating_mul(params.interval);
    // The closure never returns None, so fetch_update cannot fail.
    let _ = tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
        Some(current.saturating_sub(amount))
    });
}

/// Whole tokens available at `now` (0 while in debt).
pub(crate) fn available(tat: Nanos, params: Params, now: Nanos) -> u64 {
    let debt = tat.max(now) - now;
    params.tolerance.saturating_sub(debt) / params.interval
}

/// The TAT that keeps a bucket's fill (in tokens, fractions included) across a change of shape.
///
/// A debt (reservations beyond the bucket's capacity) is carried over too, in tokens. A fill
/// above the new capacity is capped: the bucket is simply full.
pub(crate) fn convert(tat: Nanos, old: Params, new: Params, now: Nanos) -> Nanos {
    let debt = i128::from(tat.max(now) - now);
    // Fill in "old nanoseconds", negative when reservations run past the capacity.
    let fill_old = i128::from(old.tolerance) - debt;
    let fill_new = (fill_old.saturating_mul(i128::from(new.interval)) / i128::from(old.interval))
        .min(i128::from(new.tolerance));
    let new_debt = i128::from(new.tolerance) - fill_new;
    u64::try_from(i128::from(now) + new_debt).unwrap_or(u64::MAX)
}

/// One bucket whose shape can change while it is in use.
///
/// The hot path reads the shape and the TAT with plain atomic loads, without a lock. A decision
/// that races with [`reshape`](Self::reshape) — between its storing the new shape and converting
/// the TAT — is charged in the wrong shape: its cost is scaled by the ratio of the two rates
/// (over-admitting when the rate falls, holding the bucket back when it rises), once, for the
/// requests in that window. Keyed limiters do not have this window: they reshape under their
/// shards' write locks.
#[derive(Debug)]
#[repr(align(64))] // one bucket per cache line: two busy buckets never share a line
pub(crate) struct Bucket {
    tat: AtomicU64,
    interval: AtomicU64,
    tolerance: AtomicU64,
    reshaping: Mutex<()>,
}

impl Bucket {
    /// A bucket of the given shape holding `initial` tokens at `now`.
    pub fn new(params: Params, initial: u64, now: Nanos) -> Self {
        Bucket {
            tat: AtomicU64::new(params.tat_holding(initial, now)),
            interval: AtomicU64::new(params.interval),
            tolerance: AtomicU64::new(params.tolerance),
            reshaping: Mutex::new(()),
        }
    }

    /// The current shape.
    #[inline]
    pub fn params(&self) -> Params {
        Params {
            interval: self.interval.load(Ordering::Acquire),
            tolerance: self.tolerance.load(Ordering::Acquire),
        }
    }

    /// See [`try_acquire`](fn@try_acquire).
    #[inline]
    pub fn try_acquire(&self, cost: u64, now: Nanos) -> Result<(), Refused> {
        try_acquire(&self.tat, self.params(), cost, now)
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
    /// See [`reserve`](fn@reserve).
    pub fn reserve(&self, cost: u64, now: Nanos) -> Reservation {
        reserve(&self.tat, self.params(), cost, now)
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
    /// See [`give_back`](fn@give_back). Serialized with [`reshape`](Self::reshape), so the
    /// tokens are converted with the shape the TAT is in.
    pub fn give_back(&self, tokens: u64) {
        let _serialized = self
            .reshaping
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        give_back(&self.tat, tokens, self.params())
    }

    /// Whole tokens available at `now`.
    pub fn available(&self, now: Nanos) -> u64 {
        available(self.tat.load(Ordering::Acquire), self.params(), now)
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
    /// The TAT as it stands (for the fair queue's "when would this be ready" estimates).
    pub fn tat(&self) -> Nanos {
        self.tat.load(Ordering::Acquire)
    }

    /// Changes the shape, keeping the bucket's fill.
    pub fn reshape(&self, new: Params, now: Nanos) {
        let _serialized = self
            .reshaping
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let old = self.params();
        if old == new {
            return;
        }
        self.interval.store(new.interval, Ordering::Release);
        self.tolerance.store(new.tolerance, Ordering::Release);
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(convert(tat, old, new, now))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn intervals_round_up_so_rounding_only_tightens() {
        assert_eq!(Params::interval_for_rate(50.0), 20 * MS);
        assert_eq!(Params::interval_for_rate(3.0), 333_333_334);
        assert_eq!(Params::interval_for_rate(1e9), 1);
    }

    #[test]
    fn reserve_and_give_back_restore_the_bucket() {
        let params = Params::new(10 * MS, 10);
        let tat = AtomicU64::new(params.tat_holding(0, 0));
        let r = reserve(&tat, params, 3, 0);
        assert_eq!(r.ready, 30 * MS);
        assert_eq!(r.taken, 3, "reservations count tokens");
        give_back(&tat, r.taken, params);
        assert_eq!(available(tat.load(Ordering::Relaxed), params, 100 * MS), 10);
        assert_eq!(tat.load(Ordering::Relaxed), 100 * MS);
    }

    #[test]
    fn convert_keeps_fill_in_tokens() {
        let old = Params::new(10 * MS, 100); // 100/s, holds 100
        let new = Params::new(5 * MS, 100); // 200/s, holds 100
        // 40 tokens left at t = 1 s.
        let now = 1_000 * MS;
        let tat = old.tat_holding(40, now);
        let converted = convert(tat, old, new, now);
        assert_eq!(available(converted, new, now), 40);
        // Shrinking the capacity below the fill leaves a full, smaller bucket.
        let small = Params::new(10 * MS, 10);
        assert_eq!(available(convert(tat, old, small, now), small, now), 10);
        // A debt of 50 tokens stays a debt of 50 tokens.
        let in_debt = now + old.tolerance + 50 * old.interval;
        let converted = convert(in_debt, old, new, now);
        assert_eq!(converted, now + new.tolerance + 50 * new.interval);
    }
}
