//! Waiting out a GCRA reservation (feature `tokio`).
//!
//! A waiting acquire on a non-fair bucket reserves its tokens at once and sleeps until the
//! reservation is due. Reservations are ordered by the atomic that takes them, so waiters are
//! served in the order they reserved, without a queue or a lock. If the waiting future is dropped
//! (a timeout, a cancelled request), the reservation is handed back, so a cancelled waiter costs
//! nothing.

use std::time::Duration;

use super::Admitted;
use super::gcra::Bucket;
use crate::clock::Clock;

/// Hands a reservation back unless the request it was for went ahead.
struct Pending<'a> {
    bucket: &'a Bucket,
    /// Tokens reserved.
    taken: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.bucket.give_back(self.taken);
    }
}

/// Reserves `cost` tokens in `bucket` and waits until they are due.
pub(crate) async fn reserve_and_wait<C: Clock>(bucket: &Bucket, clock: &C, cost: u64) -> Admitted {
    let now = clock.now();
    let reservation = bucket.reserve(cost, now);
    if reservation.ready <= now {
        return Admitted::AT_ONCE;
    }
    let pending = Pending {
        bucket,
        taken: reservation.taken,
    };
    let wait = Duration::from_nanos(reservation.ready - now);
    tokio::time::sleep(wait).await;
    // Due: the request goes ahead and keeps what it reserved.
    std::mem::forget(pending);
    Admitted::after(wait)
}
