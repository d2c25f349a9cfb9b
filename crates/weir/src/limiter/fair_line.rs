//! The waiting line of a fair leaky bucket (feature `tokio`).
//!
//! Fairness here means strict arrival order: a waiter is admitted only after everyone who
//! queued before it, so a large request is never starved by a stream of small ones.
//!
//! Only the waiter at the head of the line touches the bucket. When it reaches the head it
//! *claims* its cost (a GCRA reservation, which may run the bucket into debt for a request larger
//! than the bucket) and sleeps until the claim is due; the others sleep until they are woken as
//! the new head. A head that gives up hands back its claim and wakes the next waiter, so a
//! cancelled waiter passes its turn on and gives back exactly what it took, nothing more. A
//! reconfiguration hands the head's claim back and makes the head claim again under the new
//! shape.
//!
//! The line itself is a `BTreeMap` keyed by arrival ticket, under a mutex that only the slow
//! path takes: leaving from the middle of the line is `O(log n)`.
//!
//! [`wait_in_line`] is the waiting loop, written once: a fair [`LeakyBucket`] waits in its one
//! line with it, and a fair keyed limiter in the line of the key (the keyed limiter keeps a line
//! per key only while the key has waiters). Both report the wait the same way: the time from
//! joining to admission, or zero if the request never had to wait.
//!
//! [`LeakyBucket`]: super::LeakyBucket

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::gcra::Reservation;
use super::waiting::OnCancel;
use crate::clock::{Clock, Nanos};

/// A place in line.
pub(crate) struct Ticket {
    /// Arrival order; also the key in the line.
    pub number: u64,
    /// Woken when this ticket becomes the head, or when its claim was reset.
    pub wake: Arc<Notify>,
}

/// What a waiter should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Someone is ahead: wait to be woken.
    NotYet,
    /// This ticket is the head and its claim is due at `ready`.
    Claimed {
        /// When the claim is due.
        ready: Nanos,
        /// Identifies the claim, so that a claim reset while its owner slept is noticed.
        claim: u64,
    },
}

struct Waiter {
    cost: u64,
    wake: Arc<Notify>,
}

struct HeadClaim {
    ticket: u64,
    id: u64,
    reservation: Reservation,
}

#[derive(Default)]
struct Line {
    next_ticket: u64,
    next_claim: u64,
    waiters: BTreeMap<u64, Waiter>,
    claim: Option<HeadClaim>,
    /// Total cost of the waiters that have not claimed yet.
    unclaimed_cost: u64,
}

impl Line {
    fn wake_head(&self) {
        if let Some((_, head)) = self.waiters.first_key_value() {
            head.wake.notify_one();
        }
    }
}

/// The line of waiters of one fair bucket.
#[derive(Default)]
pub(crate) struct FairLine {
    line: Mutex<Line>,
    len: AtomicUsize,
}

impl std::fmt::Debug for FairLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairLine")
            .field("len", &self.len())
            .finish()
    }
}

impl FairLine {
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waiters in line. The fast path reads only this.
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Total cost of the waiters that have not claimed yet, for retry-after estimates.
    pub fn unclaimed_cost(&self) -> u64 {
        self.lock().unclaimed_cost
    }

    /// Joins the back of the line.
    pub fn join(&self, cost: u64) -> Ticket {
        let mut line = self.lock();
        let number = line.next_ticket;
        line.next_ticket += 1;
        let wake = Arc::new(Notify::new());
        line.waiters.insert(
            number,
            Waiter {
                cost,
                wake: Arc::clone(&wake),
            },
        );
        line.unclaimed_cost = line.unclaimed_cost.saturating_add(cost);
        self.len.fetch_add(1, Ordering::AcqRel);
        Ticket { number, wake }
    }

    /// Where `ticket` stands. At the head with no claim yet, it claims now with `claim`.
    pub fn turn(&self, ticket: u64, claim: impl FnOnce(u64) -> Reservation) -> Turn {
        let mut line = self.lock();
        let Some((&head, waiter)) = line.waiters.first_key_value() else {
            return Turn::NotYet;
        };
        if head != ticket {
            return Turn::NotYet;
        }
        if let Some(current) = &line.claim {
            debug_assert_eq!(current.ticket, ticket, "only the head claims");
            return Turn::Claimed {
                ready: current.reservation.ready,
                claim: current.id,
            };
        }
        let cost = waiter.cost;
        let reservation = claim(cost);
        let id = line.next_claim;
        line.next_claim += 1;
        line.unclaimed_cost = line.unclaimed_cost.saturating_sub(cost);
        line.claim = Some(HeadClaim {
            ticket,
            id,
            reservation,
        });
        Turn::Claimed {
            ready: reservation.ready,
            claim: id,
        }
    }

    /// Admits the head if its claim `claim` still stands, returning what the claim took; `None`
    /// if the claim was reset meanwhile.
    pub fn admit(&self, ticket: u64, claim: u64) -> Option<u64> {
        let mut line = self.lock();
        let taken = match &line.claim {
            Some(current) if current.ticket == ticket && current.id == claim => {
                current.reservation.taken
            }
            _ => return None,
        };
        line.claim = None;
        line.waiters.remove(&ticket);
        self.len.fetch_sub(1, Ordering::AcqRel);
        line.wake_head();
        Some(taken)
    }

    /// Leaves the line without being admitted. A head hands its claim back with `give_back`.
    pub fn leave(&self, ticket: u64, give_back: impl FnOnce(u64)) {
        let mut line = self.lock();
        let Some(waiter) = line.waiters.remove(&ticket) else {
            return;
        };
        self.len.fetch_sub(1, Ordering::AcqRel);
        match line.claim.take() {
            Some(claim) if claim.ticket == ticket => give_back(claim.reservation.taken),
            other => {
                line.claim = other;
                line.unclaimed_cost = line.unclaimed_cost.saturating_sub(waiter.cost);
            }
        }
        line.wake_head();
    }

    /// Runs `change` with the head's claim handed back (via `give_back`), then makes the head
    /// claim again, so a reshaped bucket serves the head under its new shape.
    pub fn with_claim_released<R>(
        &self,
        give_back: impl FnOnce(u64),
        change: impl FnOnce() -> R,
    ) -> R {
        let mut held = self.hold();
        held.release_claim(give_back);
        change()
    }

    /// Holds the line still: nobody joins, leaves or claims until the guard is dropped, which
    /// then wakes the head. A keyed limiter holds every line of its keys while it reshapes them.
    pub fn hold(&self) -> HeldLine<'_> {
        HeldLine { line: self.lock() }
    }
}

/// A line held still by [`FairLine::hold`]; wakes the head when dropped.
pub(crate) struct HeldLine<'a> {
    line: MutexGuard<'a, Line>,
}

impl HeldLine<'_> {
    /// Hands the head's claim back (via `give_back`); the head claims again once woken.
    pub fn release_claim(&mut self, give_back: impl FnOnce(u64)) {
        let line = &mut *self.line;
        if let Some(claim) = line.claim.take() {
            give_back(claim.reservation.taken);
            if let Some(waiter) = line.waiters.get(&claim.ticket) {
                line.unclaimed_cost = line.unclaimed_cost.saturating_add(waiter.cost);
            }
        }
    }
}

impl Drop for HeldLine<'_> {
    fn drop(&mut self) {
        self.line.wake_head();
    }
}

/// Waits in `line` with `ticket` (already joined) until admitted.
///
/// At the head it claims its cost with `claim(cost, now)` and sleeps until the claim is due; a
/// claim reset meanwhile (the bucket was reshaped) is claimed again. If the future is dropped
/// first, the waiter leaves the line, hands its claim (if any) back through `give_back` and
/// passes the turn on. Returns what the admitted claim took and how long the request was held
/// back: from joining to admission, or zero if it was admitted without sleeping.
pub(crate) async fn wait_in_line<C: Clock>(
    line: &FairLine,
    ticket: Ticket,
    clock: &C,
    claim: impl Fn(u64, Nanos) -> Reservation,
    give_back: impl Fn(u64),
) -> (u64, Duration) {
    let start = clock.now();
    let place = OnCancel::new(|| line.leave(ticket.number, &give_back));
    let mut held_back = false;
    loop {
        let now = clock.now();
        match line.turn(ticket.number, |cost| claim(cost, now)) {
            Turn::NotYet => {
                held_back = true;
                ticket.wake.notified().await;
            }
            Turn::Claimed { ready, claim } => {
                if ready > now {
                    held_back = true;
                    let wait = Duration::from_nanos(ready - now);
                    if tokio::time::timeout(wait, ticket.wake.notified())
                        .await
                        .is_ok()
                    {
                        // Woken before the claim was due: it was reset. Look again.
                        continue;
                    }
                }
                if let Some(taken) = line.admit(ticket.number, claim) {
                    place.kept();
                    let waited = if held_back {
                        Duration::from_nanos(clock.now().saturating_sub(start))
                    } else {
                        Duration::ZERO
                    };
                    return (taken, waited);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(ready: Nanos, taken: u64) -> Reservation {
        Reservation { ready, taken }
    }

    #[test]
    fn only_the_head_claims_and_admission_passes_the_turn() {
        let queue = FairLine::default();
        let a = queue.join(50);
        let b = queue.join(1);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.unclaimed_cost(), 51);
        assert_eq!(queue.turn(b.number, |_| unreachable!()), Turn::NotYet);
        let Turn::Claimed { ready, claim } = queue.turn(a.number, |cost| {
            assert_eq!(cost, 50);
            reservation(7, 500)
        }) else {
            panic!("the head claims");
        };
        assert_eq!(ready, 7);
        assert_eq!(queue.unclaimed_cost(), 1);
        // Asking again returns the same claim rather than claiming twice.
        assert_eq!(
            queue.turn(a.number, |_| unreachable!()),
            Turn::Claimed { ready, claim }
        );
        assert_eq!(queue.admit(a.number, claim), Some(500));
        assert_eq!(queue.len(), 1);
        assert!(matches!(
            queue.turn(b.number, |_| reservation(9, 10)),
            Turn::Claimed { ready: 9, .. }
        ));
    }

    #[test]
    fn a_head_that_leaves_gives_back_its_claim_and_others_give_back_nothing() {
        let queue = FairLine::default();
        let a = queue.join(5);
        let b = queue.join(3);
        let c = queue.join(2);
        queue.turn(a.number, |_| reservation(1, 55));
        let mut given = Vec::new();
        queue.leave(b.number, |taken| given.push(taken));
        assert!(given.is_empty(), "b claimed nothing");
        queue.leave(a.number, |taken| given.push(taken));
        assert_eq!(given, vec![55]);
        assert_eq!(queue.unclaimed_cost(), 2);
        assert!(matches!(
            queue.turn(c.number, |_| reservation(3, 20)),
            Turn::Claimed { ready: 3, .. }
        ));
    }

    #[test]
    fn a_reset_claim_is_not_admitted_and_is_claimed_again() {
        let queue = FairLine::default();
        let a = queue.join(4);
        let Turn::Claimed { claim, .. } = queue.turn(a.number, |_| reservation(10, 40)) else {
            panic!("the head claims");
        };
        let mut given = 0;
        queue.with_claim_released(|taken| given = taken, || ());
        assert_eq!(given, 40);
        assert_eq!(queue.unclaimed_cost(), 4);
        assert_eq!(queue.admit(a.number, claim), None, "the old claim is gone");
        let Turn::Claimed { ready, claim } = queue.turn(a.number, |_| reservation(20, 80)) else {
            panic!("claims again");
        };
        assert_eq!(ready, 20);
        assert_eq!(queue.admit(a.number, claim), Some(80));
        assert_eq!(queue.len(), 0);
    }
}
