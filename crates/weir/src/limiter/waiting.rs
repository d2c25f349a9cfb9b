//! Waiting out a reservation, and handing it back if the wait is cancelled (feature `tokio`).
//!
//! A waiting acquire that knows its turn in advance (a GCRA reservation on a bucket that is not
//! fair, a strict limiter's slot) takes it at once and sleeps until it is due. Reservations are
//! ordered by the atomic that takes them, so waiters are served in the order they reserved,
//! without a queue or a lock. If the waiting future is dropped (a timeout, a cancelled request),
//! [`OnCancel`] hands the reservation back, so a cancelled waiter costs nothing. The same guard
//! serves the fair lines ([`fair_line`](super::fair_line)): it is the one place Weir undoes what
//! a cancelled waiter took.

use std::time::Duration;

use super::Admitted;
use super::gcra::{Bucket, Tat};
use crate::clock::{Clock, Nanos};

/// Runs its undo action when dropped, unless [`kept`](OnCancel::kept) first: what a waiting
/// future took is handed back if the future is cancelled before it completes.
#[must_use = "dropping the guard undoes at once"]
pub(crate) struct OnCancel<F: FnOnce()> {
    undo: Option<F>,
}

impl<F: FnOnce()> OnCancel<F> {
    /// A guard that runs `undo` if dropped before [`kept`](Self::kept).
    pub fn new(undo: F) -> Self {
        OnCancel { undo: Some(undo) }
    }

    /// The wait completed: keep what was taken.
    pub fn kept(mut self) {
        self.undo = None;
    }
}

impl<F: FnOnce()> Drop for OnCancel<F> {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo();
        }
    }
}

/// Sleeps from `now` until `ready`, running `give_back` if cancelled first. Returns how long
/// the request was held back (zero if it was due at once).
pub(crate) async fn until_due(ready: Nanos, now: Nanos, give_back: impl FnOnce()) -> Duration {
    if ready <= now {
        return Duration::ZERO;
    }
    let pending = OnCancel::new(give_back);
    let wait = Duration::from_nanos(ready - now);
    tokio::time::sleep(wait).await;
    pending.kept();
    wait
}

/// Reserves `cost` tokens in `bucket` and waits until they are due (a bucket that is not fair).
pub(crate) async fn reserve_and_wait<C: Clock>(bucket: &Bucket, clock: &C, cost: u64) -> Admitted {
    let now = clock.now();
    let reservation = bucket.reserve(cost, now);
    let give_back = || bucket.give_back(reservation.taken);
    Admitted::after(until_due(reservation.ready, now, give_back).await)
}
