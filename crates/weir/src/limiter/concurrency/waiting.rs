//! Waiting for permits (feature `tokio`): the line of waiters, in arrival order, and the async
//! `acquire` that joins it.
//!
//! A released permit is handed straight to the head of the line, so a non-blocking
//! `try_acquire` never overtakes anyone waiting. A head whose cost is above the limit runs alone
//! once nothing else is in flight, instead of blocking the line forever.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{Concurrency, OwnedPermit, Permit};

impl Concurrency {
    /// Waits for `cost` permits, in arrival order, and takes them.
    ///
    /// Cancel-safe: a waiter dropped before it is granted leaves the line; one dropped just
    /// after being granted releases what it was given.
    pub async fn acquire(&self, cost: u64) -> Permit<'_> {
        if let Ok(permit) = self.try_acquire(cost) {
            return permit;
        }
        let (ticket, granted) = {
            let mut line = self.lock_line();
            // Announce ourselves before the last look, so that a release that does not see us
            // has already happened and its room is visible to `try_take`.
            self.waiters.fetch_add(1, Ordering::SeqCst);
            if line.is_empty() && self.try_take_as_head(cost) {
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return Permit {
                    limiter: self,
                    cost,
                };
            }
            line.join(cost)
        };
        let mut waiting = Waiting {
            limiter: self,
            ticket,
            cost,
            granted: false,
        };
        // The sender is only dropped after it has sent the grant.
        let _ = granted.await;
        waiting.granted = true;
        Permit {
            limiter: self,
            cost,
        }
    }

    /// [`acquire`](Self::acquire) returning an owned permit.
    pub async fn acquire_owned(self: Arc<Self>, cost: u64) -> OwnedPermit {
        let permit = self.acquire(cost).await;
        std::mem::forget(permit);
        OwnedPermit {
            limiter: self,
            cost,
        }
    }

    /// Like `try_take`, for the head of the line: a cost above the limit is taken when nothing
    /// is in flight, so that it runs alone instead of blocking everyone behind it forever.
    fn try_take_as_head(&self, cost: u64) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(cost)
                    .filter(|&after| after <= limit || (held == 0 && limit > 0))
            })
            .is_ok()
    }

    fn lock_line(&self) -> std::sync::MutexGuard<'_, Line> {
        self.line
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands free permits to the head of the line, in order, while they fit.
    pub(super) fn grant_waiters(&self) {
        let mut line = self.lock_line();
        while let Some(cost) = line.head_cost() {
            if !self.try_take_as_head(cost) {
                break;
            }
            line.grant_head();
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The waiting line: tickets in arrival order, each with the channel its grant is sent on.
#[derive(Debug, Default)]
pub(super) struct Line {
    next_ticket: u64,
    waiting: BTreeMap<u64, (u64, oneshot::Sender<()>)>,
}

impl Line {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn join(&mut self, cost: u64) -> (u64, oneshot::Receiver<()>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let (grant, granted) = oneshot::channel();
        self.waiting.insert(ticket, (cost, grant));
        (ticket, granted)
    }

    pub fn head_cost(&self) -> Option<u64> {
        self.waiting.first_key_value().map(|(_, (cost, _))| *cost)
    }

    /// Removes the head and tells it its permits are taken.
    pub fn grant_head(&mut self) {
        if let Some((_, (_, grant))) = self.waiting.pop_first() {
            // A waiter that is gone finds itself out of line when it drops, and releases.
            let _ = grant.send(());
        }
    }

    /// Leaves the line; false if the ticket was granted meanwhile.
    pub fn leave(&mut self, ticket: u64) -> bool {
        self.waiting.remove(&ticket).is_some()
    }
}

/// A waiter's place in line, cleaned up if the waiting future is dropped.
struct Waiting<'a> {
    limiter: &'a Concurrency,
    ticket: u64,
    cost: u64,
    granted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let was_waiting = {
            let mut line = self.limiter.lock_line();
            let was_waiting = line.leave(self.ticket);
            if was_waiting {
                self.limiter.waiters.fetch_sub(1, Ordering::SeqCst);
            }
            was_waiting
        };
        if was_waiting {
            // A head that leaves may unblock smaller requests behind it.
            self.limiter.grant_waiters();
        } else {
            // Granted while being dropped: give the permits back.
            self.limiter.release(self.cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{Concurrency, ConcurrencyConfig};

    #[tokio::test(start_paused = true)]
    async fn a_request_above_the_limit_runs_alone_instead_of_blocking_the_line() {
        let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 2 }));
        assert!(limiter.try_acquire(3).is_err(), "never without waiting");
        let held = limiter.try_acquire(1).unwrap();
        let big = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.acquire_owned(3).await })
        };
        tokio::task::yield_now().await;
        let small = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.acquire_owned(1).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(limiter.waiters(), 2);
        drop(held);
        let big = big.await.unwrap();
        assert_eq!(limiter.in_flight(), 3, "alone");
        assert_eq!(limiter.waiters(), 1, "the small one still waits its turn");
        drop(big);
        let small = small.await.unwrap();
        assert_eq!(limiter.in_flight(), 1);
        drop(small);
        limiter.reconfigure(ConcurrencyConfig { limit: 0 });
        assert!(
            limiter.try_acquire(1).is_err(),
            "a limit of 0 admits nobody"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn growing_the_limit_wakes_waiters_in_order() {
        let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 0 }));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let limiter = Arc::clone(&limiter);
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let permit = limiter.acquire_owned(1).await;
                order.lock().unwrap().push(i);
                permit
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(limiter.waiters(), 3);
        limiter.reconfigure(ConcurrencyConfig { limit: 2 });
        let first = tasks.remove(0).await.unwrap();
        let second = tasks.remove(0).await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        assert_eq!(limiter.waiters(), 1);
        drop(first);
        let third = tasks.remove(0).await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(limiter.in_flight(), 2);
        drop((second, third));
        assert_eq!(limiter.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_takes_nothing_and_unblocks_those_behind() {
        let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 2 }));
        let held = limiter.try_acquire(1).unwrap();
        // A head wanting 2 blocks a later request for 1 (strict order)...
        let big = tokio::time::timeout(std::time::Duration::from_millis(10), limiter.acquire(2));
        let small = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                limiter.acquire_owned(1).await
            })
        };
        assert!(big.await.is_err(), "the big request times out");
        // ...and once it gives up, the small one goes through.
        let small = small.await.unwrap();
        assert_eq!(limiter.in_flight(), 2);
        assert_eq!(limiter.waiters(), 0);
        drop((held, small));
        assert_eq!(limiter.in_flight(), 0);
    }
}
