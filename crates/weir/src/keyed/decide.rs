//! One non-blocking decision on a key's cell: a rate cell (GCRA or strict, a fair line's
//! claim), a fixed window's; and undoing what it took.

use super::{
    Duration, Found, KeyedAdmission, KeyedRefusal, Nanos, Ordering, Params, RateCell, RateShape,
    Refused, Taken, What, Window, strict,
};
use crate::limiter::gcra::Tat;

/// Why a rate cell refused, as seen under its shard's lock.
pub(super) enum Behind {
    Refused(KeyedRefusal),
    /// A fair bucket with waiters: the request would queue behind them.
    Line {
        tat: Nanos,
        params: Params,
        overflowed: bool,
    },
}

/// A non-blocking decision on a rate cell that did not admit.
pub(super) enum Decided {
    /// The bucket refused.
    Refused(Refused),
    /// A fair bucket has waiters: the request would have to queue behind them.
    BehindLine,
}

/// Undoes what `what` took from a rate cell (read under the cell's shard lock, so `shape` is
/// the one the cell is in).
pub(super) fn undo(cell: &RateCell, what: &What, shape: &RateShape) {
    match *what {
        What::Tokens(tokens) => cell.bucket(shape).give_back(tokens),
        What::Slot { slot, span } => strict::give_back(&cell.value, slot, span),
        What::Permit(_) | What::Hits { .. } | What::Nothing => {}
    }
}

/// A non-blocking decision on a rate cell, as an admission or what stands behind a refusal
/// (a fair line's retry-after is worked out outside the shard's lock).
#[inline]
pub(super) fn admit_rate(
    found: &Found<'_, RateShape, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<KeyedAdmission, Behind> {
    let tracked = found.cell.tracked.load(Ordering::Relaxed);
    match try_rate(found, cost, now) {
        Ok(taken) => Ok(KeyedAdmission {
            taken,
            waited: Duration::ZERO,
            tracked,
        }),
        Err(Decided::BehindLine) => Err(Behind::Line {
            tat: found.cell.value.load(Ordering::Acquire),
            params: found.shape.params(),
            overflowed: found.overflowed,
        }),
        Err(Decided::Refused(refused)) => Err(Behind::Refused(KeyedRefusal::Limited(refused))),
    }
}

/// A decision on a fixed window's cell.
pub(super) fn hit_window(
    found: &Found<'_, Window, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<KeyedAdmission, KeyedRefusal> {
    let tracked = found.cell.tracked.load(Ordering::Relaxed);
    found
        .shape
        .hit(&found.cell.value, cost, now)
        .map(|_| KeyedAdmission {
            taken: Taken::new(What::Hits { cost, at: now }, found.overflowed),
            waited: Duration::ZERO,
            tracked,
        })
        .map_err(KeyedRefusal::Limited)
}

/// One non-blocking decision on a rate cell.
#[inline]
pub(super) fn try_rate(
    found: &Found<'_, RateShape, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<Taken, Decided> {
    let cell = found.cell;
    match *found.shape {
        RateShape::Gcra { fair, .. } => {
            let bucket = cell.bucket(found.shape);
            if fair
                && cell.waiting.load(Ordering::Acquire) > 0
                && cost.saturating_mul(bucket.params.interval) <= bucket.params.tolerance
            {
                return Err(Decided::BehindLine);
            }
            bucket
                .try_acquire(cost, now)
                .map(|()| Taken::new(What::Tokens(cost), found.overflowed))
                .map_err(Decided::Refused)
        }
        RateShape::Strict { interval } => {
            let span = cost.saturating_mul(interval);
            strict::take(&cell.value, span, now)
                .map(|()| Taken::new(What::Slot { slot: now, span }, found.overflowed))
                .map_err(Decided::Refused)
        }
    }
}
