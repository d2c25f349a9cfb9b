//! The throttler: a strict limiter per limited (RPC type, key).
//!
//! Only keys the state machine has limited have a limiter here, so the table is small (top-k ×
//! levels). A call when no key is limited costs one atomic load: the count of limited keys is
//! checked before any lock is taken. Otherwise the lookup hashes with foldhash rather than SipHash:
//! only keys the controller chose to limit are in the table, so callers cannot flood it with
//! colliding keys, and the lookup is on every call's path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::clock::{Clock, Nanos};
use crate::limiter::{Strict, StrictConfig};

type Hasher = foldhash::fast::RandomState;
type Limits<C> = HashMap<String, HashMap<String, Arc<Strict<C>>, Hasher>, Hasher>;

/// Strict limiters for the limited keys.
#[derive(Debug)]
pub struct Throttler<C: Clock + Clone> {
    limits: RwLock<Limits<C>>,
    count: AtomicUsize,
    clock: C,
}

impl<C: Clock + Clone> Throttler<C> {
    /// No key limited.
    pub fn new(clock: C) -> Self {
        Throttler {
            limits: RwLock::new(HashMap::default()),
            count: AtomicUsize::new(0),
            clock,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Limits<C>> {
        self.limits.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Limits<C>> {
        self.limits.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves a slot for a call to `rpc`/`key`: the instant it may run, or `None` if the key is
    /// not limited (it may run now).
    #[inline]
    pub fn reserve(&self, rpc: &str, key: &str) -> Option<Nanos> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let limits = self.read();
        limits.get(rpc)?.get(key).map(|strict| strict.reserve(1))
    }

    /// Runs a call to `rpc`/`key` now if it is not limited or its next slot has come;
    /// otherwise takes nothing and says how long until it would.
    pub fn try_acquire(&self, rpc: &str, key: &str) -> Result<(), std::time::Duration> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let limits = self.read();
        match limits.get(rpc).and_then(|keys| keys.get(key)) {
            None => Ok(()),
            Some(strict) => strict
                .try_acquire(1)
                .map_err(|refused| refused.retry_after().unwrap_or_default()),
        }
    }

    /// Reserves a slot for `rpc`/`key` if it starts within `max_wait`: `Ok(None)` if the key is
    /// not limited, `Err(wait)` (nothing taken) if the slot is further away.
    pub fn reserve_within(
        &self,
        rpc: &str,
        key: &str,
        max_wait: std::time::Duration,
    ) -> Result<Option<Nanos>, std::time::Duration> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let limits = self.read();
        match limits.get(rpc).and_then(|keys| keys.get(key)) {
            None => Ok(None),
            Some(strict) => strict.reserve_within(1, max_wait).map(Some),
        }
    }

    /// Limits `rpc`/`key` to `qps`. With `reset`, slots queued under the previous limit are
    /// forgotten.
    pub fn set(&self, rpc: &str, key: &str, qps: f64, reset: bool) {
        let config = StrictConfig { qps };
        let mut limits = self.write();
        let keys = limits.entry(rpc.to_owned()).or_default();
        match keys.get(key) {
            Some(strict) => {
                // The state machine never produces an invalid rate (it is floor-bounded).
                let _ = strict.reconfigure(config);
                if reset {
                    strict.forget_reservations();
                }
            }
            None => {
                if let Ok(strict) = Strict::with_clock(config, self.clock.clone()) {
                    keys.insert(key.to_owned(), Arc::new(strict));
                    self.count.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Stops limiting `rpc`/`key`.
    pub fn remove(&self, rpc: &str, key: &str) {
        let mut limits = self.write();
        if let Some(keys) = limits.get_mut(rpc) {
            if keys.remove(key).is_some() {
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
            if keys.is_empty() {
                limits.remove(rpc);
            }
        }
    }

    /// The limit on `rpc`/`key`, if any.
    pub fn limit(&self, rpc: &str, key: &str) -> Option<f64> {
        self.read().get(rpc)?.get(key).map(|s| s.config().qps)
    }

    /// Every limited key: (RPC type, key, limit), sorted.
    pub fn limited(&self) -> Vec<(String, String, f64)> {
        let limits = self.read();
        let mut rows: Vec<_> = limits
            .iter()
            .flat_map(|(rpc, keys)| {
                keys.iter()
                    .map(move |(key, s)| (rpc.clone(), key.clone(), s.config().qps))
            })
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        rows
    }

    #[cfg(test)]
    /// Limited keys of `rpc`.
    pub fn count_for(&self, rpc: &str) -> usize {
        self.read().get(rpc).map_or(0, |keys| keys.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn only_limited_keys_wait_and_slots_are_exact() {
        let clock = ManualClock::new(0);
        let throttler = Throttler::new(clock.clone());
        assert_eq!(throttler.reserve("PREP", "t1"), None);
        throttler.set("PREP", "t1", 1.0, false);
        assert_eq!(throttler.reserve("PREP", "t1"), Some(0));
        assert_eq!(
            throttler.reserve("PREP", "t1"),
            Some(1_000_000_000),
            "1 s apart"
        );
        assert_eq!(throttler.reserve("PREP", "t2"), None);
        assert_eq!(throttler.reserve("COMMIT", "t1"), None);
        // Relaxing with a reset: the queue built under the old limit is forgotten.
        throttler.set("PREP", "t1", 10.0, true);
        assert_eq!(throttler.reserve("PREP", "t1"), Some(0));
        assert_eq!(
            throttler.limited(),
            vec![("PREP".into(), "t1".into(), 10.0)]
        );
        throttler.remove("PREP", "t1");
        assert_eq!(throttler.reserve("PREP", "t1"), None);
        assert_eq!(throttler.count_for("PREP"), 0);
    }
}
