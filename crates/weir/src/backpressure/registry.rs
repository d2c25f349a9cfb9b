//! The QPS registry: how hot each (RPC type, key) is right now.
//!
//! Every call is recorded after it completes. A key's rate is the number of its calls in the last
//! `window` divided by the window, counted in three slots of `window / 3` each (the current,
//! partial one included), like a per-second counter sampled over a three-second window. A slot is
//! one atomic word (slot number and count), so recording is lock-free once the key's cell is found.
//!
//! Keys live in the same bounded map as keyed limiters: at `max_keys` keys per RPC type, keys
//! that saw no call within the window are dropped, and further new keys are counted together in
//! an overflow cell that never appears in a top-k. The top-k of an RPC type is computed by a walk
//! over its keys, which only a busy signal (rare, and limited by the cooldown) asks for.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::machine::HotKey;
use crate::clock::Nanos;
use crate::keyed::Overflow;
use crate::keyed::store::{Cell, Store};
use crate::sync::AtomicU64;

const SLOTS: u64 = 3;

/// The window's shape: the length of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The slot's length in ns.
    slot: u64,
}

impl Window {
    /// Slots `slot` nanoseconds long.
    #[cfg(all(test, loom))]
    pub(crate) fn of_slot(slot: u64) -> Self {
        Window { slot }
    }

    fn slot_of(&self, now: Nanos) -> u64 {
        now / self.slot
    }
}

/// Three slots, each `slot number << 32 | count`.
#[derive(Debug)]
pub(crate) struct Calls {
    slots: [AtomicU64; SLOTS as usize],
}

impl Calls {
    pub(crate) fn record(&self, window: &Window, now: Nanos) {
        let current = window.slot_of(now);
        let tag = current & 0xFFFF_FFFF;
        let slot = &self.slots[(current % SLOTS) as usize];
        let mut packed = slot.load(Ordering::Acquire);
        loop {
            let held = packed >> 32;
            let next = if held == tag {
                packed + u64::from(packed & 0xFFFF_FFFF < 0xFFFF_FFFF)
            } else if tag.wrapping_sub(held) & 0xFFFF_FFFF < 1 << 31 {
                // The slot still counts an older period: this call starts its new one.
                tag << 32 | 1
            } else {
                // A call that read the clock before another thread moved the slot on to a
                // newer period: it belongs to a period now out of the window, and must not
                // wipe the newer count (the loom model `a_late_call_does_not_wipe_a_newer_period`
                // found this).
                return;
            };
            match slot.compare_exchange_weak(packed, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => packed = actual,
            }
        }
    }

    /// Calls in the window ending now.
    pub(crate) fn count(&self, window: &Window, now: Nanos) -> u64 {
        let current = window.slot_of(now) & 0xFFFF_FFFF;
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|packed| current.wrapping_sub(packed >> 32) & 0xFFFF_FFFF < SLOTS)
            .map(|packed| packed & 0xFFFF_FFFF)
            .sum()
    }
}

impl Cell<Window> for Calls {
    fn new(_window: &Window, _now: Nanos) -> Self {
        Calls {
            slots: Default::default(),
        }
    }

    fn is_idle(&self, window: &Window, now: Nanos) -> bool {
        self.count(window, now) == 0
    }
}

/// Per (RPC type, key) call rates; see the [module docs](self).
pub struct QpsRegistry {
    window: Window,
    max_keys: usize,
    rpcs: ArcSwap<HashMap<String, Arc<Store<Window, Calls>>>>,
    adding: Mutex<()>,
}

impl std::fmt::Debug for QpsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpsRegistry")
            .field("window", &self.window)
            .field("rpcs", &self.rpcs.load().len())
            .finish()
    }
}

/// Orders hot keys for a top-k: higher rate first, then key.
#[derive(Debug, PartialEq)]
struct Ranked(f64, String);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    /// "Greater" means hotter: a higher rate, or the same rate and a smaller key.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.0
            .total_cmp(&other.0)
            .then_with(|| other.1.cmp(&self.1))
    }
}

impl QpsRegistry {
    /// A registry measuring over `window_ns`, keeping at most `max_keys` keys per RPC type.
    pub fn new(window_ns: u64, max_keys: usize) -> Self {
        QpsRegistry {
            window: Window {
                slot: (window_ns / SLOTS).max(1),
            },
            max_keys,
            rpcs: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
        }
    }

    fn window_seconds(&self) -> f64 {
        (self.window.slot * SLOTS) as f64 / 1e9
    }

    fn store(&self, rpc: &str, now: Nanos) -> Arc<Store<Window, Calls>> {
        if let Some(store) = self.rpcs.load().get(rpc) {
            return Arc::clone(store);
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let mut rpcs = HashMap::clone(&self.rpcs.load());
        let store = Arc::clone(rpcs.entry(rpc.to_owned()).or_insert_with(|| {
            Arc::new(Store::new(
                self.window,
                self.max_keys,
                Overflow::Shared,
                now,
            ))
        }));
        self.rpcs.store(Arc::new(rpcs));
        store
    }

    /// Records one completed call.
    #[inline]
    pub fn record(&self, rpc: &str, key: &str, now: Nanos) {
        let rpcs = self.rpcs.load();
        let _ = match rpcs.get(rpc) {
            Some(store) => store.with(key, now, |found| found.cell.record(found.shape, now)),
            None => {
                drop(rpcs);
                self.store(rpc, now)
                    .with(key, now, |found| found.cell.record(found.shape, now))
            }
        };
    }

    /// The observed rate of `rpc`/`key`, requests per second.
    pub fn qps(&self, rpc: &str, key: &str, now: Nanos) -> f64 {
        let rpcs = self.rpcs.load();
        rpcs.get(rpc)
            .and_then(|store| {
                store.with_existing(key, false, |found| found.cell.count(found.shape, now))
            })
            .map_or(0.0, |calls| calls as f64 / self.window_seconds())
    }

    /// The `k` hottest keys of `rpc` with a rate above zero: hottest first, ties by key.
    pub fn top_k(&self, rpc: &str, k: usize, now: Nanos) -> Vec<HotKey> {
        let rpcs = self.rpcs.load();
        let Some(store) = rpcs.get(rpc) else {
            return Vec::new();
        };
        // A min-heap of the k hottest seen so far.
        let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::with_capacity(k + 1);
        let seconds = self.window_seconds();
        store.for_each(|key, window, calls| {
            let count = calls.count(window, now);
            if count == 0 || k == 0 {
                return;
            }
            heap.push(Reverse(Ranked(count as f64 / seconds, key.to_owned())));
            if heap.len() > k {
                heap.pop();
            }
        });
        let mut hottest: Vec<Ranked> = heap.into_iter().map(|Reverse(r)| r).collect();
        hottest.sort_by(|a, b| b.cmp(a));
        hottest
            .into_iter()
            .map(|Ranked(qps, key)| HotKey {
                rpc: rpc.to_owned(),
                key,
                qps,
            })
            .collect()
    }

    /// The RPC types seen so far, in name order.
    pub fn rpcs(&self) -> Vec<String> {
        let rpcs = self.rpcs.load();
        let sorted: BTreeMap<_, _> = rpcs.iter().collect();
        sorted.into_keys().cloned().collect()
    }

    #[cfg(test)]
    /// Keys tracked, over every RPC type.
    pub fn keys(&self) -> u64 {
        self.rpcs.load().values().map(|s| s.counters().keys).sum()
    }

    #[cfg(test)]
    /// Drops keys with no call in the window; returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.rpcs.load().values().map(|s| s.sweep(now)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn rates_count_the_calls_of_the_window() {
        let registry = QpsRegistry::new(3 * S, 100);
        for _ in 0..300 {
            registry.record("PREP", "a", 10 * S);
        }
        assert_eq!(registry.qps("PREP", "a", 10 * S), 100.0);
        assert_eq!(
            registry.qps("PREP", "a", 12 * S + S / 2),
            100.0,
            "still in the window"
        );
        assert_eq!(
            registry.qps("PREP", "a", 13 * S),
            0.0,
            "three slots later it is gone"
        );
        assert_eq!(registry.qps("PREP", "b", 10 * S), 0.0);
    }

    #[test]
    fn top_k_is_hottest_first_ties_by_key_and_skips_idle_keys() {
        let registry = QpsRegistry::new(3 * S, 100);
        for (key, calls) in [("c", 30), ("a", 60), ("b", 60), ("d", 3)] {
            for _ in 0..calls {
                registry.record("PREP", key, 0);
            }
        }
        registry.record("COMMIT", "z", 0);
        let top: Vec<_> = registry
            .top_k("PREP", 3, S)
            .into_iter()
            .map(|h| (h.key, h.qps))
            .collect();
        assert_eq!(
            top,
            vec![("a".into(), 20.0), ("b".into(), 20.0), ("c".into(), 10.0)]
        );
        assert!(
            registry.top_k("PREP", 3, 5 * S).is_empty(),
            "all idle by then"
        );
        assert_eq!(
            registry.rpcs(),
            vec!["COMMIT".to_owned(), "PREP".to_owned()]
        );
    }

    #[test]
    fn memory_is_bounded_per_rpc_type() {
        let registry = QpsRegistry::new(3 * S, 10);
        for i in 0..1000 {
            registry.record("PREP", &format!("table-{i}"), (i / 10) * S);
        }
        assert!(registry.keys() <= 10);
        let tracked = registry.keys() as usize;
        assert_eq!(registry.sweep(10_000 * S), tracked, "all idle long after");
        assert_eq!(registry.keys(), 0);
    }
}
