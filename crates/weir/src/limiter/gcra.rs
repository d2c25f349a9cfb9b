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
//! compare-and-swap: no lock and no background refill task. Each operation is written once, on
//! the [`Tat`] trait, and serves both the single limiters (one [`Bucket`]) and the keyed ones (a
//! word per key, [`InShape`]). Nothing here reads a clock: time always comes in as an argument.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::word;
use crate::clock::Nanos;
use crate::error::{ConfigError, Refused};
use crate::sync::AtomicU64;

/// The longest any bucket may take to refill from empty: 2^60 ns, about 36.5 years.
///
/// Every sum the arithmetic makes is a `now` plus at most this much (a TAT never runs further
/// ahead of `now`), so with 62 bits of TAT it never saturates in the first 100 years of a
/// clock. A configuration beyond it is refused rather than rounded: a saturated spacing or
/// tolerance makes the check always pass, which would admit everything.
pub const MAX_REFILL_NANOS: u64 = 1 << 60;

/// Checks that a bucket of `capacity` tokens, one every `interval` ns (`rate` per second, as
/// configured, for the messages), is within [`MAX_REFILL_NANOS`]; the errors name `rate_field`
/// (the spacing is too long) or `capacity_field` (the whole bucket is).
pub(crate) fn check_shape(
    interval: u128,
    capacity: u64,
    rate: f64,
    rate_field: &'static str,
    capacity_field: &'static str,
) -> Result<(), ConfigError> {
    let max = u128::from(MAX_REFILL_NANOS);
    if interval > max {
        return Err(ConfigError::TooSlow {
            field: rate_field,
            value: rate,
            min: 1e9 / MAX_REFILL_NANOS as f64,
        });
    }
    let fill = interval * u128::from(capacity);
    if fill > max {
        return Err(ConfigError::TooLong {
            field: capacity_field,
            capacity,
            rate,
            years: fill as f64 / 1e9 / 31_557_600.0,
            max: u64::try_from(max / interval).unwrap_or(u64::MAX),
        });
    }
    Ok(())
}

/// `⌈10⁹ / per_second⌉`, the spacing in nanoseconds for a rate in tokens per second, exactly:
/// a float is a dyadic rational, `mantissa × 2^power`, and the quotient is taken in 128-bit
/// integers. Rounded up, so rounding can only make a limiter stricter. A rate too low to
/// represent gives a spacing above [`MAX_REFILL_NANOS`] (at most `u64::MAX`), never a
/// saturated one that looks small; a rate that is not positive and finite gives `u64::MAX`.
pub(crate) fn wide_interval_for_rate(per_second: f64) -> u128 {
    const BEYOND: u128 = u64::MAX as u128;
    if !(per_second.is_finite() && per_second > 0.0) {
        return BEYOND;
    }
    let bits = per_second.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i32;
    let fraction = u128::from(bits & ((1 << 52) - 1));
    let (mantissa, power) = if exponent == 0 {
        (fraction, -1074) // subnormal
    } else {
        (fraction | 1 << 52, exponent - 1075)
    };
    if power >= 0 {
        // At least 2^52 per second: one nanosecond (a rate above 10⁹ is refused elsewhere).
        return 1;
    }
    // 10⁹ < 2^30 shifted by up to 97 fits in 128 bits; past that the spacing is at least
    // 10⁹ × 2^98 / 2^53 > 2^74 ns, far beyond.
    if -power > 97 {
        return BEYOND;
    }
    (1_000_000_000u128 << -power)
        .div_ceil(mantissa)
        .clamp(1, BEYOND)
}

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
    /// only make the limiter stricter, never looser. Exact (see [`wide_interval_for_rate`]); a rate below what can be represented (which
    /// validation refuses) saturates.
    pub fn interval_for_rate(per_second: f64) -> u64 {
        u64::try_from(wide_interval_for_rate(per_second)).unwrap_or(u64::MAX)
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
/// A reservation taken by [`Tat::reserve`]: when it may run and what it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The instant the request may run (never before the `now` it was taken at).
    pub ready: Nanos,
    /// The tokens it took, to hand back with [`Tat::give_back`] if it is cancelled. Kept in tokens,
    /// not nanoseconds, so that a give-back after a reshape is right in the new shape.
    pub taken: u64,
}

/// One decision: the TAT after taking `cost` at `now`, if the tokens are there; otherwise why
/// not (and when they would be).
#[inline]
fn take(current: Nanos, params: Params, cost: u64, now: Nanos) -> Result<Nanos, Refused> {
    let increment = cost.saturating_mul(params.interval);
    if increment > params.tolerance {
        return Err(Refused::ExceedsCapacity {
            cost,
            capacity: params.capacity(),
        });
    }
    let next = current.max(now).saturating_add(increment);
    let ready = next.saturating_sub(params.tolerance);
    if ready > now {
        return Err(Refused::RetryAfter {
            retry_after: Duration::from_nanos(ready - now),
        });
    }
    Ok(next)
}

/// One reservation: the TAT after taking `cost` unconditionally, and when it is due.
#[inline]
fn book(current: Nanos, params: Params, cost: u64, now: Nanos) -> (Nanos, Nanos) {
    let next = current
        .max(now)
        .saturating_add(cost.saturating_mul(params.interval));
    (next, next.saturating_sub(params.tolerance).max(now))
}

/// Where a bucket's TAT lives, and the shape it is expressed in.
///
/// Every GCRA operation (decide, reserve, give back, read) is written once, as a provided method
/// here, over [`update`](Tat::update): one compare-and-swap of one word. A single limiter's
/// [`Bucket`] keeps its shape beside the word (behind an epoch, so it can change live); a keyed
/// limiter's cell is a bare word whose shape the map holds under the same lock ([`InShape`]).
pub(crate) trait Tat {
    /// Applies `step` to the TAT in its own shape, atomically (`step` may run more than once).
    fn update<R, E>(
        &self,
        step: impl FnMut(Nanos, Params) -> Result<(Nanos, R), E>,
    ) -> Result<R, E>;

    /// The TAT as it stands, and its shape.
    fn read(&self) -> (Nanos, Params);

    /// Takes `cost` tokens if they are there now; otherwise says when they would be.
    #[inline]
    fn try_acquire(&self, cost: u64, now: Nanos) -> Result<(), Refused> {
        self.update(|tat, params| take(tat, params, cost, now).map(|next| (next, ())))
    }

    /// [`update`](Tat::update) for a step that cannot fail.
    #[inline]
    fn apply<R>(&self, mut step: impl FnMut(Nanos, Params) -> (Nanos, R)) -> R {
        match self.update(|tat, params| Ok::<_, std::convert::Infallible>(step(tat, params))) {
            Ok(out) => out,
            Err(never) => match never {},
        }
    }

    /// Takes `cost` tokens unconditionally, going into debt if needed, and says when the
    /// request may run. Reservations are served in the order they are taken, and a request
    /// larger than the capacity is fine: it drains the full bucket and waits for the rest.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only waiting acquires reserve
    fn reserve(&self, cost: u64, now: Nanos) -> Reservation {
        self.apply(|tat, params| {
            let (next, ready) = book(tat, params, cost, now);
            (next, Reservation { ready, taken: cost })
        })
    }

    /// Returns the `tokens` a cancelled reservation (or a rolled-back admission) took, in the
    /// bucket's current shape.
    ///
    /// The bucket ends as if the reservation had never been made *at the instant it was made*:
    /// tokens that would have overflowed a full bucket stay lost, and everything that accrued
    /// since is kept.
    fn give_back(&self, tokens: u64) {
        self.apply(|tat, params| {
            (
                tat.saturating_sub(tokens.saturating_mul(params.interval)),
                (),
            )
        });
    }

    /// Whole tokens available at `now` (0 while in debt).
    fn available(&self, now: Nanos) -> u64 {
        let (tat, params) = self.read();
        available(tat, params, now)
    }

    /// The refusal for `cost` queued behind `ahead` tokens of waiters (see
    /// [`refusal_behind`](fn@refusal_behind)).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // only fair lines have waiters
    fn refusal_behind(&self, ahead: u64, cost: u64, now: Nanos) -> Refused {
        let (tat, params) = self.read();
        refusal_behind(tat, params, ahead, cost, now)
    }
}

/// The refusal for `cost` queued behind `ahead` tokens of waiters that have not claimed yet, in
/// a bucket at `tat`: its retry-after counts everyone in front of it.
pub(crate) fn refusal_behind(
    tat: Nanos,
    params: Params,
    ahead: u64,
    cost: u64,
    now: Nanos,
) -> Refused {
    if cost.saturating_mul(params.interval) > params.tolerance {
        return Refused::ExceedsCapacity {
            cost,
            capacity: params.capacity(),
        };
    }
    let due = tat
        .max(now)
        .saturating_add(ahead.saturating_add(cost).saturating_mul(params.interval))
        .saturating_sub(params.tolerance);
    Refused::RetryAfter {
        retry_after: Duration::from_nanos(due.saturating_sub(now)),
    }
}

/// A TAT in a bare word, in a shape held elsewhere: a keyed limiter's cell, whose shape is read
/// under the lock of the map's shard, so the two always belong together.
pub(crate) struct InShape<'a> {
    /// The word holding the TAT.
    pub word: &'a AtomicU64,
    /// The shape it is expressed in.
    pub params: Params,
}

impl Tat for InShape<'_> {
    #[inline]
    fn update<R, E>(
        &self,
        mut step: impl FnMut(Nanos, Params) -> Result<(Nanos, R), E>,
    ) -> Result<R, E> {
        word::update(self.word, |tat| step(tat, self.params))
    }

    fn read(&self) -> (Nanos, Params) {
        (self.word.load(Ordering::Acquire), self.params)
    }
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

/// The TAT's bits in a [`Bucket`]'s word; the two bits above hold the shape's epoch.
const TAT_MASK: u64 = (1 << 62) - 1;

#[derive(Debug, Default)]
struct Shape {
    interval: AtomicU64,
    tolerance: AtomicU64,
}

/// One bucket whose shape can change while it is in use, without a lock on the hot path.
///
/// The bucket is one word: the TAT (62 bits, 146 years of nanoseconds) and a 2-bit *epoch*
/// naming which of four shape slots the TAT is expressed in. A decision reads the word, the
/// shape of its epoch, and compare-and-swaps the word with the same epoch. A reshape writes the
/// new shape into the next slot, then converts the TAT and advances the epoch in one
/// compare-and-swap. So a decision either lands before the conversion (and is converted with
/// the rest of the TAT) or fails its compare-and-swap and retries in the new shape.
///
/// # The epoch's limit
///
/// A slot is written again by the fourth reshape after the one that filled it. A decision that
/// read the word, then stalled while four reshapes to four different shapes ran (they are
/// serialized, each under the reshape lock), finds its compare-and-swap succeeding if the word
/// came back to the very same bits — a full bucket at a standing clock does. It is then charged
/// in the shape four reshapes back: one decision, mis-charged by the ratio of the two rates.
/// With three reshapes or fewer inside a decision, no decision is ever charged in the wrong
/// shape. Both facts are checked: the loom models in `loom_models.rs` explore every interleaving
/// of a decision with three and with four reshapes, and the tests below drive the exact
/// interleaving on a plain thread.
///
/// It is left so because each way out costs every decision: a 128-bit word with a full
/// reshape counter more than doubled the compare-and-swap loop (`docs/benchmarks.md`, "Figures
/// behind the code's choices"); registering readers
/// costs a read-modify-write per decision; swapping whole buckets behind a pointer needs either
/// `unsafe` reclamation or a lock-free reference count on the hot path. Four reconfigurations
/// inside the few nanoseconds of one decision (or while its thread is descheduled between two
/// instructions) is not how limits change; a keyed limiter's cells, reshaped under their
/// shard's lock, do not have this limit at all.
#[derive(Debug)]
#[repr(align(64))] // one bucket per cache line: two busy buckets never share a line
pub(crate) struct Bucket {
    word: AtomicU64,
    shapes: [Shape; 4],
    reshaping: Mutex<()>,
}

fn pack(epoch: u64, tat: Nanos) -> u64 {
    epoch << 62 | tat.min(TAT_MASK)
}

fn unpack(word: u64) -> (u64, Nanos) {
    (word >> 62, word & TAT_MASK)
}

impl Tat for Bucket {
    #[inline]
    fn update<R, E>(
        &self,
        mut step: impl FnMut(Nanos, Params) -> Result<(Nanos, R), E>,
    ) -> Result<R, E> {
        word::update(&self.word, |current| {
            let (epoch, tat) = unpack(current);
            let (next, out) = step(tat, self.shape_of_any(epoch))?;
            Ok((pack(epoch, next), out))
        })
    }

    fn read(&self) -> (Nanos, Params) {
        let (epoch, tat) = unpack(self.word.load(Ordering::Acquire));
        (tat, self.shape(epoch))
    }
}

impl Bucket {
    /// A bucket of the given shape holding `initial` tokens at `now`.
    pub fn new(params: Params, initial: u64, now: Nanos) -> Self {
        let bucket = Bucket {
            word: AtomicU64::new(pack(0, params.tat_holding(initial, now))),
            shapes: Default::default(),
            reshaping: Mutex::new(()),
        };
        bucket.shapes[0]
            .interval
            .store(params.interval, Ordering::Release);
        bucket.shapes[0]
            .tolerance
            .store(params.tolerance, Ordering::Release);
        bucket
    }

    #[inline]
    fn shape(&self, epoch: u64) -> Params {
        // The mask lets the compiler drop the bounds check on this hot path.
        let shape = &self.shapes[(epoch & 3) as usize];
        Params {
            interval: shape.interval.load(Ordering::Acquire),
            tolerance: shape.tolerance.load(Ordering::Acquire),
        }
    }

    /// [`shape`](Self::shape) without making the loads wait for the word: all four slots are
    /// read at once and the epoch picks one.
    #[inline]
    fn shape_of_any(&self, epoch: u64) -> Params {
        let all = [0, 1, 2, 3].map(|slot| {
            (
                self.shapes[slot].interval.load(Ordering::Acquire),
                self.shapes[slot].tolerance.load(Ordering::Acquire),
            )
        });
        let (interval, tolerance) = match epoch & 3 {
            0 => all[0],
            1 => all[1],
            2 => all[2],
            _ => all[3],
        };
        Params {
            interval,
            tolerance,
        }
    }

    #[cfg(test)]
    fn params(&self) -> Params {
        self.read().1
    }

    /// Changes the shape, keeping the bucket's fill (see [`convert`]).
    pub fn reshape(&self, new: Params, now: Nanos) {
        let _serialized = self
            .reshaping
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (epoch, _) = unpack(self.word.load(Ordering::Acquire));
        let old = self.shape(epoch);
        if old == new {
            return;
        }
        let next = (epoch + 1) & 3;
        self.shapes[next as usize]
            .interval
            .store(new.interval, Ordering::Release);
        self.shapes[next as usize]
            .tolerance
            .store(new.tolerance, Ordering::Release);
        // Only a reshape changes the epoch, and reshapes are serialized: every word seen here is
        // in the old shape.
        word::apply(&self.word, |current| {
            let (_, tat) = unpack(current);
            (pack(next, convert(tat, old, new, now)), ())
        });
    }
}

#[cfg(test)]
mod tests;
