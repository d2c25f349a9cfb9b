//! `Concurrency { limit }`: at most `limit` requests in flight.
//!
//! A request holds a [`Permit`] while it runs; dropping the permit releases it, exactly once.
//! Waiters (feature `tokio`) are served strictly in arrival order: a released permit is handed
//! directly to the head of the line, and a non-blocking `try_acquire` does not overtake anyone
//! waiting. The limit changes at runtime: shrinking admits nobody new until in-flight falls
//! below the new limit (nothing running is interrupted); growing wakes waiters at once.
//!
//! A waiting request that costs more than the limit is admitted when nothing else is in flight
//! (it runs alone) rather than blocking the line forever; a non-blocking `try_acquire` refuses
//! it. A limit of 0 admits nobody.
//!
//! No clock is involved: a concurrency limit is about how many, not how often.
//!
//! ```
//! use weir::Concurrency;
//!
//! let limit = Concurrency::new(2);
//! let a = limit.try_acquire(1).unwrap();
//! let _b = limit.try_acquire(1).unwrap();
//! assert!(limit.try_acquire(1).is_err());
//! drop(a);
//! assert!(limit.try_acquire(1).is_ok());
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::Refused;

/// In-flight permits; see the [module docs](self).
#[derive(Debug)]
pub struct Concurrency {
    in_flight: AtomicU64,
    limit: AtomicU64,
    waiters: AtomicUsize,
    #[cfg(feature = "tokio")]
    line: std::sync::Mutex<line::Line>,
}

impl Concurrency {
    /// A limiter admitting up to `limit` permits at once. A limit of 0 admits nobody (useful to
    /// drain a backend) until it is raised.
    pub fn new(limit: u64) -> Self {
        Concurrency {
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
            waiters: AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            line: Default::default(),
        }
    }

    /// Takes `cost` permits if they are free and nobody is waiting.
    ///
    /// Refused with [`Refused::NoPermit`] otherwise: only a release makes room, so there is no
    /// retry time to give.
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<Permit<'_>, Refused> {
        if self.waiters.load(Ordering::SeqCst) > 0 || !self.try_take(cost) {
            return Err(Refused::NoPermit);
        }
        Ok(Permit {
            limiter: self,
            cost,
        })
    }

    /// Like [`try_acquire`](Self::try_acquire), with a permit that owns a handle to the limiter
    /// and so can be moved across tasks freely.
    pub fn try_acquire_owned(self: &Arc<Self>, cost: u64) -> Result<OwnedPermit, Refused> {
        let permit = self.try_acquire(cost)?;
        std::mem::forget(permit);
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            cost,
        })
    }

    /// Waits for `cost` permits, in arrival order, and takes them.
    ///
    /// Cancel-safe: a waiter dropped before it is granted leaves the line; one dropped just
    /// after being granted releases what it was given.
    #[cfg(feature = "tokio")]
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
    #[cfg(feature = "tokio")]
    pub async fn acquire_owned(self: Arc<Self>, cost: u64) -> OwnedPermit {
        let permit = self.acquire(cost).await;
        std::mem::forget(permit);
        OwnedPermit {
            limiter: self,
            cost,
        }
    }

    /// Changes the limit. Growing hands the new room to waiters at once; shrinking lets what is
    /// in flight finish and admits nobody until in-flight is below the new limit.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::SeqCst);
        #[cfg(feature = "tokio")]
        self.grant_waiters();
    }

    /// The limit in force.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests waiting for a permit.
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Acquire)
    }

    /// Adds `cost` to in-flight if that stays within the limit.
    #[inline]
    fn try_take(&self, cost: u64) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(cost).filter(|&after| after <= limit)
            })
            .is_ok()
    }

    /// Like `try_take`, for the head of the line: a cost above the limit is taken when nothing
    /// is in flight, so that it runs alone instead of blocking everyone behind it forever.
    #[cfg(feature = "tokio")]
    fn try_take_as_head(&self, cost: u64) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(cost)
                    .filter(|&after| after <= limit || (held == 0 && limit > 0))
            })
            .is_ok()
    }

    #[inline]
    fn release(&self, cost: u64) {
        self.in_flight.fetch_sub(cost, Ordering::SeqCst);
        #[cfg(feature = "tokio")]
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.grant_waiters();
        }
    }

    #[cfg(feature = "tokio")]
    fn lock_line(&self) -> std::sync::MutexGuard<'_, line::Line> {
        self.line
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands free permits to the head of the line, in order, while they fit.
    #[cfg(feature = "tokio")]
    fn grant_waiters(&self) {
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

/// The waiting line (feature `tokio`): tickets in arrival order, each with the channel its
/// grant is sent on.
#[cfg(feature = "tokio")]
mod line {
    use std::collections::BTreeMap;

    use tokio::sync::oneshot;

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
}

/// A waiter's place in line, cleaned up if the waiting future is dropped.
#[cfg(feature = "tokio")]
struct Waiting<'a> {
    limiter: &'a Concurrency,
    ticket: u64,
    cost: u64,
    granted: bool,
}

#[cfg(feature = "tokio")]
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

/// Permits borrowed from a [`Concurrency`] limiter; released when dropped.
#[derive(Debug)]
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit<'a> {
    limiter: &'a Concurrency,
    cost: u64,
}

impl Permit<'_> {
    /// How many permits this holds.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.release(self.cost);
    }
}

/// Permits holding a handle to their [`Concurrency`] limiter; released when dropped.
#[derive(Debug)]
#[must_use = "the permit is released as soon as it is dropped"]
pub struct OwnedPermit {
    limiter: Arc<Concurrency>,
    cost: u64,
}

impl OwnedPermit {
    /// How many permits this holds.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.limiter.release(self.cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_admits_nobody_until_in_flight_is_below_the_limit() {
        let limiter = Concurrency::new(3);
        let a = limiter.try_acquire(1).unwrap();
        let b = limiter.try_acquire(1).unwrap();
        let _c = limiter.try_acquire(1).unwrap();
        limiter.set_limit(1);
        drop(a);
        assert!(limiter.try_acquire(1).is_err(), "2 in flight, limit 1");
        drop(b);
        assert!(limiter.try_acquire(1).is_err(), "1 in flight, limit 1");
        assert_eq!(limiter.in_flight(), 1);
    }

    #[test]
    fn owned_permits_release_once() {
        let limiter = Arc::new(Concurrency::new(1));
        let permit = limiter.try_acquire_owned(1).unwrap();
        assert_eq!(limiter.in_flight(), 1);
        let moved = std::thread::spawn(move || drop(permit));
        moved.join().unwrap();
        assert_eq!(limiter.in_flight(), 0);
        assert!(limiter.try_acquire(1).is_ok());
        assert_eq!(limiter.in_flight(), 0);
    }

    #[test]
    fn a_cost_above_the_limit_is_refused() {
        let limiter = Concurrency::new(2);
        assert!(limiter.try_acquire(3).is_err());
        assert_eq!(limiter.try_acquire(2).map(|p| p.cost()), Ok(2));
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn a_request_above_the_limit_runs_alone_instead_of_blocking_the_line() {
        let limiter = Arc::new(Concurrency::new(2));
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
        limiter.set_limit(0);
        assert!(
            limiter.try_acquire(1).is_err(),
            "a limit of 0 admits nobody"
        );
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn growing_the_limit_wakes_waiters_in_order() {
        let limiter = Arc::new(Concurrency::new(0));
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
        limiter.set_limit(2);
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

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_takes_nothing_and_unblocks_those_behind() {
        let limiter = Arc::new(Concurrency::new(2));
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
