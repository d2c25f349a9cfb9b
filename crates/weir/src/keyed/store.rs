//! The key → bucket map behind every keyed limiter, with memory bounded by configuration.
//!
//! A sharded hash map (a `RwLock` per shard, keys hashed with the standard library's per-process
//! seeded SipHash so callers cannot aim collisions at one bucket). The hot path for a key that
//! exists takes one shard's read lock, finds the key and hands its cell to the caller: no global
//! lock, nothing allocated. Only a new key takes a write lock and allocates.
//!
//! A key of up to 24 bytes is kept inside its entry ([`CompactString`]), beside its cell, so
//! finding it reads the table's control bytes and one entry, and no allocation of its own. At a
//! million keys every one of those reads misses the caches, and the key's own allocation was
//! the third: keeping keys inline is what brought a decision there under governor's
//! (`docs/benchmarks.md`, "Keys inside the entry", has the figures).
//!
//! Each shard also carries the limiter's *shape* (its rate, capacity, limit). Keeping it under
//! the same lock as the cells lets a reconfiguration convert every cell and switch the shape
//! atomically, shard by shard, without ever letting a decision combine a new shape with an
//! unconverted cell.
//!
//! Memory is bounded by `max_keys`. At the cap, a new key first triggers a sweep that drops idle
//! cells (a cell is idle when its bucket is back to its initial state and nothing outside the
//! map depends on it: no permit, no waiter). Cells that are not idle are never dropped — dropping one would give its
//! key a fresh burst, so key churn would become a way around the limit. If nothing can be
//! dropped, the new key overflows: it is counted in the sketch (`sketch.rs`, the default for
//! rate cells), shares one overflow cell with every other overflowing key, or is refused, as
//! the policy says. A sweep that frees nothing is not repeated for a while, so
//! a flood of new keys at the cap costs one lookup each, not one sweep each.
//!
//! Locks are taken in one order only: a shard's, then the overflow cell's, then the sketch's.
//! A decision past the cap is made holding its key's shard lock, so it and a request that gives
//! the same key a cell in the map (from the sketch's word) never run at once.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use compact_str::CompactString;
use hashbrown::HashTable;

use super::sketch::MaxSketch;
use crate::clock::Nanos;

/// A per-key cell that can tell whether it is idle.
pub(crate) trait Cell<S>: Send + Sync {
    /// A fresh cell for a key seen for the first time.
    fn new(shape: &S, now: Nanos) -> Self;
    /// Whether dropping this cell would lose nothing: the bucket is back to its initial state
    /// (full, nothing in flight) and nothing outside the map is waiting on it or holding it.
    fn is_idle(&self, shape: &S, now: Nanos) -> bool;
    /// The cell's whole state as one word that only grows as the bucket empties, if it is one
    /// in `shape`: such cells can be counted in a sketch past the cap (see `sketch.rs`).
    fn word(&self, _shape: &S) -> Option<&crate::sync::AtomicU64> {
        None
    }
}

/// What to do with a new key when the map is at its cap and nothing is idle.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Overflowing keys are counted in a fixed-size sketch that never admits a key more than
    /// its own bucket would (see `sketch.rs`); they are decided at once, without waiting. A
    /// concurrency limiter, whose permits cannot be sketched, shares one bucket instead.
    #[default]
    Sketch,
    /// All overflowing keys share one bucket with the policy's limits.
    Shared,
    /// Overflowing keys are refused.
    Reject,
}

/// The cell a lookup found, and whether it is the shared overflow cell.
pub(crate) struct Found<'a, S, C> {
    /// The shape in force for this cell (held under its shard's lock).
    pub shape: &'a S,
    /// The key's cell.
    pub cell: &'a C,
    /// True if the key is not tracked: it shares the overflow cell, or (if `sketched`) is
    /// counted in the sketch.
    pub overflowed: bool,
    /// The cell is the key's estimate from the sketch, made for this decision: what is done
    /// to it is kept in the sketch, but it cannot be found again, so a waiting acquire decides
    /// at once on it (and a give-back lands on the unused overflow cell); a handover or a
    /// tenure's hold is written into the sketch through it.
    pub sketched: bool,
}

/// The map was full, nothing was idle and the policy refuses overflowing keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeysExhausted;

/// After a sweep that freed nothing, new keys go straight to overflow for this long.
const FRUITLESS_SWEEP_BACKOFF_NS: u64 = 100_000_000;

#[derive(Debug)]
#[repr(align(128))] // one shard per cache line pair: shards never false-share
struct Shard<S, C> {
    lock: RwLock<ShardData<S, C>>,
}

#[derive(Debug)]
struct ShardData<S, C> {
    shape: S,
    table: HashTable<(CompactString, C)>,
}

/// Counters of what the map did, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreCounters {
    /// Keys tracked now.
    pub keys: u64,
    /// Idle cells dropped by sweeps.
    pub evictions: u64,
    /// New keys that found the map full (shared the overflow cell or were refused).
    pub overflow_hits: u64,
    /// Of those, the decisions made in the sketch.
    pub sketched: u64,
    /// Memory the sketch takes, in bytes (0 until a key first overflows).
    pub sketch_bytes: u64,
}

/// The sharded, bounded key → cell map. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Store<S, C> {
    shards: Box<[Shard<S, C>]>,
    /// The overflow cell, with its own copy of the shape under its own lock.
    overflow_cell: RwLock<ShardData<S, C>>,
    hasher: RandomState,
    len: AtomicUsize,
    max_keys: AtomicUsize,
    overflow: RwLock<Overflow>,
    evictions: AtomicU64,
    overflow_hits: AtomicU64,
    /// When a sweep last freed nothing (0: never).
    fruitless_sweep_at: AtomicU64,
    /// Keys past the cap, with [`Overflow::Sketch`] and cells that can be sketched; made the
    /// first time a key overflows, so a map that never fills pays nothing for it.
    sketch: OnceLock<MaxSketch>,
    /// Decisions made in the sketch.
    sketched: AtomicU64,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Clone, C: Cell<S>> Store<S, C> {
    /// An empty map for cells of `shape`, holding at most `max_keys` keys.
    pub fn new(shape: S, max_keys: usize, overflow: Overflow, now: Nanos) -> Self {
        let shard_count = std::thread::available_parallelism()
            .map_or(4, |n| n.get() * 4)
            .next_power_of_two();
        let shards = (0..shard_count)
            .map(|_| Shard {
                lock: RwLock::new(ShardData {
                    shape: shape.clone(),
                    table: HashTable::new(),
                }),
            })
            .collect();
        let mut overflow_table = HashTable::new();
        let overflow_cell = C::new(&shape, now);
        overflow_table.insert_unique(0, (CompactString::const_new(""), overflow_cell), |_| 0);
        Store {
            shards,
            overflow_cell: RwLock::new(ShardData {
                shape,
                table: overflow_table,
            }),
            hasher: RandomState::new(),
            len: AtomicUsize::new(0),
            max_keys: AtomicUsize::new(max_keys),
            overflow: RwLock::new(overflow),
            evictions: AtomicU64::new(0),
            overflow_hits: AtomicU64::new(0),
            fruitless_sweep_at: AtomicU64::new(0),
            sketch: OnceLock::new(),
            sketched: AtomicU64::new(0),
        }
    }

    fn shard_of(&self, hash: u64) -> &Shard<S, C> {
        // hashbrown places an entry by the hash's low bits and tags it with the top 7 bits.
        // The shard takes the bits just below the tag: taking tag bits would leave every
        // shard's table with fewer distinct tags, so more false matches and more key compares.
        let shard_bits = self.shards.len().trailing_zeros();
        let index = (hash << 7 >> (64 - shard_bits)) as usize;
        &self.shards[index]
    }

    /// Runs `f` on `key`'s cell, creating it if needed. At the cap, runs `f` on the overflow
    /// cell (or refuses, if the policy says so).
    #[inline]
    pub fn with<R>(
        &self,
        key: &str,
        now: Nanos,
        f: impl FnOnce(Found<'_, S, C>) -> R,
    ) -> Result<R, KeysExhausted> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard_of(hash);
        {
            let data = read(&shard.lock);
            if let Some((_, cell)) = data.table.find(hash, |(k, _)| **k == *key) {
                return Ok(f(Found {
                    shape: &data.shape,
                    cell,
                    overflowed: false,
                    sketched: false,
                }));
            }
        }
        self.with_new(shard, hash, key, now, f)
    }

    /// The slow path: the key was not there when we looked.
    fn with_new<R>(
        &self,
        shard: &Shard<S, C>,
        hash: u64,
        key: &str,
        now: Nanos,
        f: impl FnOnce(Found<'_, S, C>) -> R,
    ) -> Result<R, KeysExhausted> {
        let mut swept = false;
        loop {
            {
                let mut data = write(&shard.lock);
                let data = &mut *data;
                // Another thread may have inserted it while we waited for the lock.
                let present = data.table.find(hash, |(k, _)| **k == *key).is_some();
                if present || self.take_slot() {
                    if !present {
                        let cell = C::new(&data.shape, now);
                        // A key the sketch has counted starts from what it spent there.
                        if let (Some(sketch), Some(word)) =
                            (self.sketch.get(), cell.word(&data.shape))
                        {
                            word.fetch_max(sketch.estimate(hash), Ordering::AcqRel);
                        }
                        let hasher = &self.hasher;
                        data.table.insert_unique(
                            hash,
                            (CompactString::new(key), cell),
                            |(k, _)| hasher.hash_one(k.as_str()),
                        );
                    }
                    let (_, cell) = data
                        .table
                        .find(hash, |(k, _)| **k == *key)
                        .expect("present: found or inserted under this lock");
                    return Ok(f(Found {
                        shape: &data.shape,
                        cell,
                        overflowed: false,
                        sketched: false,
                    }));
                }
                // Full, and no sweep to try: decided past the cap under this shard's lock, so
                // that no request for the key can give it a cell in the map from the sketch's
                // word while this decision on the same word is under way.
                if swept || !self.sweep_due(now) {
                    return self.with_overflow(hash, now, f);
                }
            }
            // Sweep once (never while holding a shard lock: the sweep takes them all), then
            // look again.
            self.make_room(now);
            swept = true;
        }
    }

    /// Counts one more key if that stays within the cap.
    fn take_slot(&self) -> bool {
        let max = self.max_keys.load(Ordering::Acquire);
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |len| {
                (len < max).then_some(len + 1)
            })
            .is_ok()
    }

    fn with_overflow<R>(
        &self,
        hash: u64,
        now: Nanos,
        f: impl FnOnce(Found<'_, S, C>) -> R,
    ) -> Result<R, KeysExhausted> {
        self.overflow_hits.fetch_add(1, Ordering::Relaxed);
        let overflow = *read(&self.overflow);
        if overflow == Overflow::Reject {
            return Err(KeysExhausted);
        }
        // The shape under the overflow cell's lock, which a reshape holds while it converts
        // the sketch too: no decision sees a new shape with old words.
        let data = read(&self.overflow_cell);
        if overflow == Overflow::Sketch {
            let fresh = C::new(&data.shape, now);
            if let Some(word) = fresh.word(&data.shape) {
                let sketch = self.sketch_of_max_keys();
                self.sketched.fetch_add(1, Ordering::Relaxed);
                return Ok(sketch.decide(hash, |estimate| {
                    // No fuller than a new bucket, nor than the sketch says.
                    word.fetch_max(estimate, Ordering::AcqRel);
                    let answer = f(Found {
                        shape: &data.shape,
                        cell: &fresh,
                        overflowed: true,
                        sketched: true,
                    });
                    (word.load(Ordering::Acquire), answer)
                }));
            }
        }
        let (_, cell) = data
            .table
            .iter()
            .next()
            .expect("the overflow cell always exists");
        Ok(f(Found {
            shape: &data.shape,
            cell,
            overflowed: true,
            sketched: false,
        }))
    }

    /// The sketch, made at the size of the cap when first needed.
    fn sketch_of_max_keys(&self) -> &MaxSketch {
        self.sketch
            .get_or_init(|| MaxSketch::for_max_keys(self.max_keys.load(Ordering::Acquire)))
    }

    /// Whether a sweep may run at `now`: none has freed nothing within the backoff.
    fn sweep_due(&self, now: Nanos) -> bool {
        let last = self.fruitless_sweep_at.load(Ordering::Acquire);
        last == 0 || now.saturating_sub(last) >= FRUITLESS_SWEEP_BACKOFF_NS
    }

    /// At the cap: sweeps, unless a recent sweep found nothing to drop. True if there is room.
    fn make_room(&self, now: Nanos) -> bool {
        if !self.sweep_due(now) {
            return false;
        }
        let room = self.sweep(now) > 0
            || self.len.load(Ordering::Acquire) < self.max_keys.load(Ordering::Acquire);
        self.fruitless_sweep_at
            .store(if room { 0 } else { now.max(1) }, Ordering::Release);
        room
    }

    /// Drops every idle cell that nothing outside the map holds. Returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut data = write(&shard.lock);
            let ShardData { shape, table } = &mut *data;
            let before = table.len();
            table.retain(|(_, cell)| !cell.is_idle(shape, now));
            dropped += before - table.len();
        }
        self.len.fetch_sub(dropped, Ordering::AcqRel);
        self.evictions.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Changes the shape: `convert` is called with the old and new shape for every cell
    /// (including the overflow cell), shard by shard, each under its shard's write lock, and the
    /// shard switches to the new shape under the same lock.
    pub fn reshape(&self, new: &S, convert: impl Fn(&S, &S, &C)) {
        let shards = self.shards.iter().map(|s| &s.lock);
        for lock in shards.chain(std::iter::once(&self.overflow_cell)) {
            let mut data = write(lock);
            for (_, cell) in data.table.iter() {
                convert(&data.shape, new, cell);
            }
            if std::ptr::eq(lock, &self.overflow_cell)
                && let Some(sketch) = self.sketch.get()
            {
                // Each word as a cell of its own, converted as a key's would be.
                sketch.convert(|value| {
                    let cell = C::new(&data.shape, 0);
                    match cell.word(&data.shape) {
                        Some(word) => {
                            word.store(value, Ordering::Release);
                            convert(&data.shape, new, &cell);
                            word.load(Ordering::Acquire)
                        }
                        None => value,
                    }
                });
            }
            data.shape = new.clone();
        }
    }

    /// Changes the cap and the overflow behaviour. Lowering the cap drops nothing by itself:
    /// the next new key sweeps.
    pub fn set_bounds(&self, max_keys: usize, overflow: Overflow) {
        self.max_keys.store(max_keys, Ordering::Release);
        *write(&self.overflow) = overflow;
        self.fruitless_sweep_at.store(0, Ordering::Release);
    }

    /// Runs `f` on `key`'s cell if it is tracked (or on the overflow cell, if `overflowed`),
    /// without creating anything. Used to give back what an admission took, and by waiters,
    /// whose held cell keeps the key in the map.
    pub fn with_existing<R>(
        &self,
        key: &str,
        overflowed: bool,
        f: impl FnOnce(Found<'_, S, C>) -> R,
    ) -> Option<R> {
        if overflowed {
            // A key decided in the sketch gets the overflow cell here, which no decision uses
            // while the sketch is in force: what it took stays taken in the sketch (its words
            // only ever stricter), and a give-back lands where it changes nothing.
            let data = read(&self.overflow_cell);
            let (_, cell) = data.table.iter().next()?;
            return Some(f(Found {
                shape: &data.shape,
                cell,
                overflowed: true,
                sketched: false,
            }));
        }
        let hash = self.hasher.hash_one(key);
        let data = read(&self.shard_of(hash).lock);
        let (_, cell) = data.table.find(hash, |(k, _)| **k == *key)?;
        Some(f(Found {
            shape: &data.shape,
            cell,
            overflowed: false,
            sketched: false,
        }))
    }

    /// The shape in force (read from the overflow cell's copy, which a reshape converts last).
    pub fn shape(&self) -> S {
        read(&self.overflow_cell).shape.clone()
    }

    /// Calls `f` with each key's cell (not the overflow cell), one shard read-locked at a time.
    /// A walk over every key: for rare, bounded uses (a busy signal's top-k), never per request.
    pub fn for_each(&self, mut f: impl FnMut(&str, &S, &C)) {
        for shard in self.shards.iter() {
            let data = read(&shard.lock);
            for (key, cell) in data.table.iter() {
                f(key, &data.shape, cell);
            }
        }
    }

    /// What the map has done so far.
    pub fn counters(&self) -> StoreCounters {
        StoreCounters {
            keys: self.len.load(Ordering::Acquire) as u64,
            evictions: self.evictions.load(Ordering::Relaxed),
            overflow_hits: self.overflow_hits.load(Ordering::Relaxed),
            sketched: self.sketched.load(Ordering::Relaxed),
            sketch_bytes: self.sketch.get().map_or(0, |s| s.bytes() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// A cell whose idleness a test sets by hand; held "outside the map" while `holders > 0`.
    #[derive(Debug)]
    struct TestCell {
        busy: AtomicBool,
        holders: Arc<AtomicUsize>,
        created_at: Nanos,
    }

    impl Cell<u64> for TestCell {
        fn new(_shape: &u64, now: Nanos) -> Self {
            TestCell {
                busy: AtomicBool::new(false),
                holders: Arc::new(AtomicUsize::new(0)),
                created_at: now,
            }
        }
        fn is_idle(&self, _shape: &u64, _now: Nanos) -> bool {
            !self.busy.load(Ordering::Relaxed) && self.holders.load(Ordering::Relaxed) == 0
        }
    }

    fn touch(store: &Store<u64, TestCell>, key: &str, now: Nanos, busy: bool) -> bool {
        store
            .with(key, now, |found| {
                found.cell.busy.store(busy, Ordering::Relaxed);
                found.overflowed
            })
            .expect("shared overflow never refuses")
    }

    #[test]
    fn existing_keys_keep_their_cell() {
        let store = Store::<u64, TestCell>::new(7, 10, Overflow::Shared, 0);
        store.with("a", 5, |_| ()).unwrap();
        let created = store.with("a", 9, |f| f.cell.created_at).unwrap();
        assert_eq!(created, 5);
        assert_eq!(store.with("a", 9, |f| *f.shape).unwrap(), 7);
        assert_eq!(store.counters().keys, 1);
    }

    #[test]
    fn at_the_cap_idle_keys_are_swept_and_busy_ones_kept() {
        let store = Store::<u64, TestCell>::new(0, 2, Overflow::Shared, 0);
        assert!(!touch(&store, "busy", 1, true));
        assert!(!touch(&store, "idle", 1, false));
        assert!(!touch(&store, "new", 2, false), "the idle key made room");
        let counters = store.counters();
        assert_eq!((counters.keys, counters.evictions), (2, 1));
        // Both tracked keys are now busy: the next new key overflows.
        touch(&store, "new", 3, true);
        assert!(touch(&store, "another", 4, false));
        assert_eq!(store.counters().overflow_hits, 1);
        // A fruitless sweep is not repeated at once, even if a key has gone idle meanwhile...
        touch(&store, "new", 5, false);
        assert!(touch(&store, "third", 6, false));
        // ...but it is after the back-off.
        assert!(!touch(
            &store,
            "third",
            6 + FRUITLESS_SWEEP_BACKOFF_NS,
            false
        ));
    }

    #[test]
    fn cells_held_outside_the_map_are_never_swept() {
        let store = Store::<u64, TestCell>::new(0, 1, Overflow::Reject, 0);
        let held = store
            .with("held", 1, |f| Arc::clone(&f.cell.holders))
            .unwrap();
        held.fetch_add(1, Ordering::Relaxed);
        assert_eq!(store.sweep(2), 0);
        assert_eq!(store.with("other", 3, |_| ()), Err(KeysExhausted));
        held.fetch_sub(1, Ordering::Relaxed);
        assert_eq!(store.sweep(FRUITLESS_SWEEP_BACKOFF_NS * 2), 1);
        assert!(
            store
                .with("other", FRUITLESS_SWEEP_BACKOFF_NS * 2, |_| ())
                .is_ok()
        );
    }

    #[test]
    fn reshape_visits_every_cell_and_switches_the_shape() {
        let store = Store::<u64, TestCell>::new(1, 100, Overflow::Shared, 0);
        for i in 0..50 {
            store.with(&format!("k{i}"), 0, |_| ()).unwrap();
        }
        let visited = AtomicUsize::new(0);
        store.reshape(&2, |old, new, _| {
            assert_eq!((*old, *new), (1, 2));
            visited.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(
            visited.load(Ordering::Relaxed),
            51,
            "50 keys and the overflow cell"
        );
        store.for_each(|_, shape, _| assert_eq!(*shape, 2));
    }
}
