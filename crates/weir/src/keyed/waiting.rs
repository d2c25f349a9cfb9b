//! Waiting for a key's turn (feature `tokio`): reserve and sleep, or join the key's fair line,
//! or wait for a permit, each bounded by `max_wait` and cancel-safe.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::decide::{Decided, try_rate};
use super::store::{Found, Store};
use super::{
    Buckets, KeyedAdmission, KeyedLimiter, KeyedRefusal, RateCell, RateShape, Taken, What, undo,
};
use crate::clock::{Clock, Nanos};
use crate::error::Refused;
use crate::limiter::gcra::Tat;
use crate::limiter::strict;

impl<C: Clock> KeyedLimiter<C> {
    /// Waits up to `max_wait` for `cost` to be admitted for `key`.
    ///
    /// Where the wait is known in advance (a reservation on an unfair bucket or a strict
    /// limiter), a request that could not make it within `max_wait` is refused at once with its
    /// exact retry-after, and takes nothing. Fair buckets and concurrency limits wait in line
    /// and are refused when `max_wait` runs out. Cancel-safe: a dropped waiter gives back
    /// whatever it had reserved.
    pub async fn acquire(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<KeyedAdmission, KeyedRefusal> {
        let grant = |taken, waited| KeyedAdmission {
            taken,
            waited,
            tracked: false,
        };
        match &self.buckets {
            Buckets::Rate(store) => self.acquire_rate(store, key, cost, max_wait).await,
            // A window has no place to queue: decide at once.
            Buckets::Window(_) => self.try_acquire(key, cost),
            Buckets::Concurrency(store) => {
                let (cell, overflowed) = store.with(key, self.clock.now(), |found| {
                    (Arc::clone(found.cell), found.overflowed)
                })?;
                if let Ok(permit) = cell.try_acquire_owned(cost) {
                    return Ok(grant(
                        Taken::new(What::Permit(permit), overflowed),
                        Duration::ZERO,
                    ));
                }
                let start = self.clock.now();
                match tokio::time::timeout(max_wait, cell.acquire_owned(cost)).await {
                    Ok(permit) => Ok(grant(
                        Taken::new(What::Permit(permit), overflowed),
                        Duration::from_nanos(self.clock.now().saturating_sub(start)),
                    )),
                    Err(_) => Err(KeyedRefusal::TimedOut),
                }
            }
        }
    }

    async fn acquire_rate(
        &self,
        store: &Store<RateShape, RateCell>,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<KeyedAdmission, KeyedRefusal> {
        let now = self.clock.now();
        let max_wait_ns = crate::clock::duration_to_nanos(max_wait);
        // Under the shard's lock: admit now, reserve, or (fair) join the key's line.
        let (plan, tracked) = store.with(key, now, |found| {
            let tracked = found.cell.tracked.load(Ordering::Relaxed);
            (plan_wait(&found, cost, now, max_wait_ns), tracked)
        })?;
        let grant = |taken, waited| KeyedAdmission {
            taken,
            waited,
            tracked,
        };
        match plan {
            Plan::Admitted(taken) => Ok(grant(taken, Duration::ZERO)),
            Plan::Refused(refused) => Err(KeyedRefusal::Limited(refused)),
            Plan::Sleep { ready, taken } => {
                // The reservation keeps the key's bucket busy (and so in the map) until it is
                // due, so it can be found again to give it back.
                let give_back = || {
                    store.with_existing(key, taken.overflowed, |found| {
                        undo(found.cell, &taken.what, found.shape)
                    });
                };
                let waited = crate::limiter::waiting::until_due(ready, now, give_back).await;
                Ok(grant(taken, waited))
            }
            Plan::Line { overflowed } => {
                let in_line = self.lines.wait(store, key, overflowed, cost, &self.clock);
                match tokio::time::timeout(max_wait, in_line).await {
                    Ok((tokens, waited)) => {
                        Ok(grant(Taken::new(What::Tokens(tokens), overflowed), waited))
                    }
                    Err(_) => Err(KeyedRefusal::TimedOut),
                }
            }
        }
    }
}

/// What a waiting acquire on a rate cell does next.
enum Plan {
    Admitted(Taken),
    Refused(Refused),
    /// Reserved: sleep until `ready`; give it back if cancelled.
    Sleep {
        ready: Nanos,
        taken: Taken,
    },
    /// A fair bucket: wait in the key's line (already counted in the cell's `waiting`).
    Line {
        overflowed: bool,
    },
}

fn plan_wait(found: &Found<'_, RateShape, RateCell>, cost: u64, now: Nanos, max_wait: u64) -> Plan {
    let cell = found.cell;
    if found.sketched {
        // A key past the cap is decided at once: its reservation could not be found again to
        // be given back, nor could a line be kept for it.
        return match try_rate(found, cost, now) {
            Ok(taken) => Plan::Admitted(taken),
            Err(Decided::Refused(refused)) => Plan::Refused(refused),
            Err(Decided::BehindLine) => Plan::Refused(Refused::RetryAfter {
                retry_after: Duration::ZERO,
            }),
        };
    }
    let (ready, what) = match *found.shape {
        RateShape::Gcra { fair: true, .. } => {
            if let Ok(taken) = try_rate(found, cost, now) {
                return Plan::Admitted(taken);
            }
            // Counted as waiting under the shard's lock: from here on the key cannot be
            // evicted until it leaves the line.
            cell.waiting.fetch_add(1, Ordering::AcqRel);
            return Plan::Line {
                overflowed: found.overflowed,
            };
        }
        RateShape::Gcra { .. } => {
            let reservation = cell.bucket(found.shape).reserve(cost, now);
            (reservation.ready, What::Tokens(reservation.taken))
        }
        RateShape::Strict { interval } => {
            let span = cost.saturating_mul(interval);
            let slot = strict::book(&cell.value, span, now);
            (slot, What::Slot { slot, span })
        }
    };
    if ready <= now {
        return Plan::Admitted(Taken::new(what, found.overflowed));
    }
    if ready - now > max_wait {
        // It could not make it in time: take nothing, say exactly when it could.
        undo(cell, &what, found.shape);
        return Plan::Refused(Refused::RetryAfter {
            retry_after: Duration::from_nanos(ready - now),
        });
    }
    Plan::Sleep {
        ready,
        taken: Taken::new(what, found.overflowed),
    }
}
