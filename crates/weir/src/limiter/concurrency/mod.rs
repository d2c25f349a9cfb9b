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
//! use weir::{Concurrency, ConcurrencyConfig};
//!
//! let limit = Concurrency::new(ConcurrencyConfig { limit: 2 });
//! let a = limit.try_acquire(1).unwrap();
//! let _b = limit.try_acquire(1).unwrap();
//! assert!(limit.try_acquire(1).is_err());
//! drop(a);
//! assert!(limit.try_acquire(1).is_ok());
//! ```

#[cfg(feature = "tokio")]
mod waiting;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::Refused;

/// The parameters of a [`Concurrency`] limiter. Every value is valid: a limit of 0 admits
/// nobody (useful to drain a backend) until it is raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyConfig {
    /// Permits held at once.
    pub limit: u64,
}

/// In-flight permits; see the [module docs](self).
#[derive(Debug)]
pub struct Concurrency {
    in_flight: AtomicU64,
    limit: AtomicU64,
    waiters: AtomicUsize,
    #[cfg(feature = "tokio")]
    line: std::sync::Mutex<waiting::Line>,
}

impl Concurrency {
    /// A limiter admitting up to `config.limit` permits at once.
    ///
    /// Unlike the rate limiters' constructors this cannot fail: every limit is valid.
    pub fn new(config: ConcurrencyConfig) -> Self {
        Concurrency {
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(config.limit),
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

    /// Changes the limit while in use. Growing hands the new room to waiters at once; shrinking
    /// lets what is in flight finish and admits nobody until in-flight is below the new limit.
    pub fn reconfigure(&self, config: ConcurrencyConfig) {
        self.limit.store(config.limit, Ordering::SeqCst);
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

    #[inline]
    fn release(&self, cost: u64) {
        self.in_flight.fetch_sub(cost, Ordering::SeqCst);
        #[cfg(feature = "tokio")]
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.grant_waiters();
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
        let limiter = Concurrency::new(ConcurrencyConfig { limit: 3 });
        let a = limiter.try_acquire(1).unwrap();
        let b = limiter.try_acquire(1).unwrap();
        let _c = limiter.try_acquire(1).unwrap();
        limiter.reconfigure(ConcurrencyConfig { limit: 1 });
        drop(a);
        assert!(limiter.try_acquire(1).is_err(), "2 in flight, limit 1");
        drop(b);
        assert!(limiter.try_acquire(1).is_err(), "1 in flight, limit 1");
        assert_eq!(limiter.in_flight(), 1);
    }

    #[test]
    fn owned_permits_release_once() {
        let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 1 }));
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
        let limiter = Concurrency::new(ConcurrencyConfig { limit: 2 });
        assert!(limiter.try_acquire(3).is_err());
        assert_eq!(limiter.try_acquire(2).map(|p| p.cost()), Ok(2));
    }
}
