//! The owner side of a shared pool: the leases each bucket has out.
//!
//! A bucket's shared permits are counted on its owner as *live leases*: a grant inserts a lease
//! `{id, expires_at, holder}` if fewer than `limit` are live, all under one lock, so a check and
//! its insert cannot be split by a racing grant. Because the count *is* the set of live leases,
//! releasing twice, releasing after a sweep, or sweeping twice cannot drift it. A lease expires
//! at `expires_at` inclusive (`expires_at == now` is expired): expired leases are pruned lazily
//! when a bucket looks full, and by a periodic sweep; empty buckets are removed. A holder that
//! leaves the cluster keeps its leases until they expire: it may only be paused.
//!
//! The number of buckets an owner tracks is bounded (`max_buckets`; keyed per user, the map
//! could otherwise grow with every user that has a request in flight): beyond it a new bucket
//! is refused, and the caller applies the policy's "unavailable" behaviour.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use weir::Nanos;

/// A shared permit, as its owner records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLease {
    /// Unique within this pool.
    pub id: u64,
    /// Expired from this instant on.
    pub expires_at: Nanos,
    /// The node holding it (empty: unknown).
    pub holder: String,
}

/// The answer to a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Granted: the lease's id and expiry.
    Granted {
        /// The lease id, to release or renew.
        id: u64,
        /// When it expires unless renewed.
        expires_at: Nanos,
    },
    /// The bucket has `limit` live leases already.
    Full,
    /// The owner tracks `max_buckets` buckets already and this one is new.
    TooManyBuckets,
}

#[derive(Debug, Default)]
struct Buckets {
    next_id: u64,
    leases: HashMap<String, Vec<PoolLease>>,
}

/// The leases of every bucket this node owns; see the [module docs](self).
#[derive(Debug)]
pub struct SharedPool {
    state: Mutex<Buckets>,
    max_buckets: usize,
}

impl SharedPool {
    /// An empty pool tracking at most `max_buckets` buckets.
    pub fn new(max_buckets: usize) -> Self {
        SharedPool {
            state: Mutex::new(Buckets::default()),
            max_buckets,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants `holder` a lease on `bucket` for `ttl` if fewer than `limit` are live at `now`.
    pub fn acquire(
        &self,
        bucket: &str,
        limit: u64,
        holder: &str,
        ttl: Duration,
        now: Nanos,
    ) -> Grant {
        let mut state = self.lock();
        let state = &mut *state;
        if !state.leases.contains_key(bucket) {
            if state.leases.len() >= self.max_buckets {
                // Make room by dropping buckets whose leases have all expired.
                state
                    .leases
                    .retain(|_, leases| leases.iter().any(|l| l.expires_at > now));
                if state.leases.len() >= self.max_buckets {
                    return Grant::TooManyBuckets;
                }
            }
            if limit == 0 {
                return Grant::Full;
            }
            state.leases.insert(bucket.to_owned(), Vec::new());
        }
        let leases = state.leases.get_mut(bucket).expect("present");
        if leases.len() as u64 >= limit {
            // Looks full: prune the expired before deciding.
            leases.retain(|l| l.expires_at > now);
        }
        if leases.len() as u64 >= limit {
            return Grant::Full;
        }
        let id = state.next_id;
        state.next_id += 1;
        let expires_at = weir::clock::after(now, ttl);
        leases.push(PoolLease {
            id,
            expires_at,
            holder: holder.to_owned(),
        });
        Grant::Granted { id, expires_at }
    }

    /// Takes over a lease another owner granted (a handoff after the bucket moved here): it is
    /// recorded whatever the count, because it is already in use; it counts against the limit
    /// from now on. Returns its id here.
    pub fn adopt(&self, bucket: &str, holder: &str, expires_at: Nanos) -> u64 {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state
            .leases
            .entry(bucket.to_owned())
            .or_default()
            .push(PoolLease {
                id,
                expires_at,
                holder: holder.to_owned(),
            });
        id
    }

    /// Ends a lease. Unknown ids (released, swept, never granted) are a no-op: false.
    pub fn release(&self, bucket: &str, id: u64) -> bool {
        let mut state = self.lock();
        let Some(leases) = state.leases.get_mut(bucket) else {
            return false;
        };
        let before = leases.len();
        leases.retain(|l| l.id != id);
        let released = leases.len() < before;
        if leases.is_empty() {
            state.leases.remove(bucket);
        }
        released
    }

    /// Extends a live lease to `now + ttl`; `None` if it is unknown or expired.
    pub fn renew(&self, bucket: &str, id: u64, ttl: Duration, now: Nanos) -> Option<Nanos> {
        let mut state = self.lock();
        let lease = state
            .leases
            .get_mut(bucket)?
            .iter_mut()
            .find(|l| l.id == id && l.expires_at > now)?;
        lease.expires_at = weir::clock::after(now, ttl);
        Some(lease.expires_at)
    }

    /// Drops every lease expired by `now` and every empty bucket; returns how many leases.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut state = self.lock();
        let mut dropped = 0;
        state.leases.retain(|_, leases| {
            let before = leases.len();
            leases.retain(|l| l.expires_at > now);
            dropped += before - leases.len();
            !leases.is_empty()
        });
        dropped
    }

    /// Live leases of `bucket` at `now`.
    pub fn in_use(&self, bucket: &str, now: Nanos) -> usize {
        self.lock().leases.get(bucket).map_or(0, |leases| {
            leases.iter().filter(|l| l.expires_at > now).count()
        })
    }

    /// Buckets tracked now.
    pub fn buckets(&self) -> usize {
        self.lock().leases.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    const TTL: Duration = Duration::from_nanos(1_000);

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    fn granted(grant: Grant) -> u64 {
        match grant {
            Grant::Granted { id, .. } => id,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn limit_2_grants_two_and_refuses_the_third() {
        let pool = SharedPool::new(100);
        granted(pool.acquire("b", 2, "a", TTL, 0));
        granted(pool.acquire("b", 2, "b", TTL, 0));
        assert_eq!(pool.acquire("b", 2, "c", TTL, 0), Grant::Full);
    }

    #[test]
    fn a_release_lets_exactly_one_in_and_is_idempotent() {
        let pool = SharedPool::new(100);
        let a = granted(pool.acquire("b", 1, "a", TTL, 0));
        assert_eq!(pool.acquire("b", 1, "b", TTL, 0), Grant::Full);
        assert!(pool.release("b", a));
        assert!(!pool.release("b", a), "twice is a no-op");
        assert!(!pool.release("b", 999), "unknown ids too");
        granted(pool.acquire("b", 1, "c", TTL, 0));
        assert_eq!(pool.acquire("b", 1, "d", TTL, 0), Grant::Full);
    }

    #[test]
    fn expiry_is_inclusive_and_needs_no_sweep() {
        let pool = SharedPool::new(100);
        granted(pool.acquire("b", 1, "a", ns(100), 0));
        assert_eq!(pool.acquire("b", 1, "b", ns(100), 99), Grant::Full);
        granted(pool.acquire("b", 1, "b", ns(100), 100));
    }

    #[test]
    fn a_sweep_drops_what_expired_and_empty_buckets() {
        let pool = SharedPool::new(100);
        granted(pool.acquire("b", 1, "a", ns(100), 0));
        assert_eq!(pool.sweep(99), 0);
        assert_eq!(pool.buckets(), 1);
        assert_eq!(pool.sweep(100), 1);
        assert_eq!(pool.buckets(), 0);
        assert_eq!(pool.sweep(100), 0, "sweeping twice changes nothing");
    }

    #[test]
    fn renewal_extends_live_leases_only() {
        let pool = SharedPool::new(100);
        let a = granted(pool.acquire("b", 1, "a", ns(100), 0));
        assert_eq!(pool.renew("b", a, ns(100), 50), Some(150));
        assert_eq!(pool.acquire("b", 1, "b", ns(100), 120), Grant::Full);
        assert_eq!(pool.renew("b", a, ns(100), 150), None, "expired at 150");
    }

    #[test]
    fn sixty_four_threads_racing_on_limit_10_get_exactly_10() {
        for _ in 0..20 {
            let pool = Arc::new(SharedPool::new(100));
            let start = Arc::new(Barrier::new(64));
            let threads: Vec<_> = (0..64)
                .map(|i| {
                    let (pool, start) = (Arc::clone(&pool), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        matches!(
                            pool.acquire("b", 10, &format!("n{i}"), TTL, 0),
                            Grant::Granted { .. }
                        )
                    })
                })
                .collect();
            let grants = threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|&g| g)
                .count();
            assert_eq!(grants, 10);
            assert_eq!(pool.in_use("b", 0), 10);
        }
    }

    #[test]
    fn adopted_leases_count_against_the_limit() {
        let pool = SharedPool::new(100);
        pool.adopt("b", "a", 1_000);
        pool.adopt("b", "a", 1_000);
        assert_eq!(pool.in_use("b", 0), 2);
        assert_eq!(pool.acquire("b", 2, "c", TTL, 0), Grant::Full);
        assert_eq!(
            pool.acquire("b", 2, "c", TTL, 1_000),
            Grant::Granted {
                id: 2,
                expires_at: weir::clock::after(1_000, TTL)
            }
        );
    }

    #[test]
    fn the_number_of_buckets_is_bounded() {
        let pool = SharedPool::new(2);
        granted(pool.acquire("b1", 1, "a", ns(100), 0));
        granted(pool.acquire("b2", 1, "a", ns(200), 0));
        assert_eq!(
            pool.acquire("b3", 1, "a", ns(100), 0),
            Grant::TooManyBuckets
        );
        // Once b1's lease has expired, its bucket makes room.
        granted(pool.acquire("b3", 1, "a", ns(100), 100));
        assert_eq!(pool.buckets(), 2);
    }
}
