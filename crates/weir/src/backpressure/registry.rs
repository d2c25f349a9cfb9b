//! The QPS registry: how hot each (RPC type, key) is right now.
//!
//! Every call is recorded after it completes. A key's rate is the number of its calls in the last
//! `window` divided by the window, counted in three slots of `window / 3` each (the current,
//! partial one included), like a per-second counter sampled over a three-second window. A slot is
//! one atomic word (slot number and count), so recording is lock-free once the key's cell is found.
//!
//! Keys live in the same bounded map as keyed limiters: at `max_keys` keys per RPC type, keys
//! that saw no call within the window are dropped, and further new keys are counted together in
//! an overflow cell that never appears in a top-k. Each RPC type also counts all its calls and
//! its busy answers in two cells of its own, so the totals the converging controller decides on
//! include the overflow cell and need no walk over the keys. Only a top-k walks the keys, and
//! only a busy signal past the cooldown (rare) asks for one.

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
        self.count_last(window, now, SLOTS)
    }

    /// Calls in the last `slots` slots, the current (partial) one included.
    fn count_last(&self, window: &Window, now: Nanos, slots: u64) -> u64 {
        let current = window.slot_of(now) & 0xFFFF_FFFF;
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|packed| current.wrapping_sub(packed >> 32) & 0xFFFF_FFFF < slots)
            .map(|packed| packed & 0xFFFF_FFFF)
            .sum()
    }

    /// Calls in the recent span: the current slot and the one before.
    fn count_recent(&self, window: &Window, now: Nanos) -> u64 {
        self.count_last(window, now, 2)
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
    rpcs: ArcSwap<HashMap<String, Arc<Rpc>>>,
    adding: Mutex<()>,
}

/// What is counted of one RPC type.
struct Rpc {
    /// Calls per key.
    keys: Store<Window, Calls>,
    /// Every call of the type, the overflow cell's included: what a busy answer is a share of.
    calls: Calls,
    /// Busy answers to calls of the type: the converging controller's overload measure.
    busy: Calls,
}

fn calls() -> Calls {
    Calls {
        slots: Default::default(),
    }
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

    fn store(&self, rpc: &str, now: Nanos) -> Arc<Rpc> {
        if let Some(store) = self.rpcs.load().get(rpc) {
            return Arc::clone(store);
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let mut rpcs = HashMap::clone(&self.rpcs.load());
        let store = Arc::clone(rpcs.entry(rpc.to_owned()).or_insert_with(|| {
            Arc::new(Rpc {
                keys: Store::new(self.window, self.max_keys, Overflow::Shared, now),
                calls: calls(),
                busy: calls(),
            })
        }));
        self.rpcs.store(Arc::new(rpcs));
        store
    }

    /// Records one completed call.
    #[inline]
    pub fn record(&self, rpc: &str, key: &str, now: Nanos) {
        let rpcs = self.rpcs.load();
        let record = |store: &Rpc| {
            let _ = store
                .keys
                .with(key, now, |found| found.cell.record(found.shape, now));
            store.calls.record(&self.window, now);
        };
        match rpcs.get(rpc) {
            Some(store) => record(store),
            None => {
                drop(rpcs);
                record(&self.store(rpc, now));
            }
        }
    }

    /// The observed rate of `rpc`/`key`, requests per second.
    pub fn qps(&self, rpc: &str, key: &str, now: Nanos) -> f64 {
        let rpcs = self.rpcs.load();
        rpcs.get(rpc)
            .and_then(|store| {
                store
                    .keys
                    .with_existing(key, false, |found| found.cell.count(found.shape, now))
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
        store.keys.for_each(|key, window, calls| {
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

    /// Records one busy answer to a call of `rpc`.
    pub fn record_busy(&self, rpc: &str, now: Nanos) {
        self.store(rpc, now).busy.record(&self.window, now);
    }

    /// The span, in nanoseconds, that the recent counts cover at `now`: the previous slot and
    /// the elapsed part of the current one. The converging controller measures over it rather
    /// than the whole window, so that it sees a change within about a slot and a rate is not
    /// understated just after a slot boundary.
    pub fn recent_span(&self, now: Nanos) -> u64 {
        self.window.slot + now % self.window.slot
    }

    /// Calls of `rpc` (every key, the overflow cell's included) and busy answers to them, over
    /// the recent span.
    pub fn recent_totals(&self, rpc: &str, now: Nanos) -> (u64, u64) {
        self.rpcs.load().get(rpc).map_or((0, 0), |store| {
            (
                store.calls.count_recent(&self.window, now),
                store.busy.count_recent(&self.window, now),
            )
        })
    }

    /// Calls of `rpc`/`key` over the recent span.
    pub fn recent_calls(&self, rpc: &str, key: &str, now: Nanos) -> u64 {
        let rpcs = self.rpcs.load();
        rpcs.get(rpc)
            .and_then(|store| {
                store.keys.with_existing(key, false, |found| {
                    found.cell.count_recent(found.shape, now)
                })
            })
            .unwrap_or(0)
    }

    /// The `k` busiest keys of `rpc` over the recent span (a walk over its keys): (key, calls),
    /// most first, ties by key.
    pub fn recent_top(&self, rpc: &str, k: usize, now: Nanos) -> Vec<(String, u64)> {
        let rpcs = self.rpcs.load();
        let Some(store) = rpcs.get(rpc) else {
            return Vec::new();
        };
        let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::with_capacity(k + 1);
        store.keys.for_each(|key, window, calls| {
            let count = calls.count_recent(window, now);
            if count == 0 || k == 0 {
                return;
            }
            heap.push(Reverse(Ranked(count as f64, key.to_owned())));
            if heap.len() > k {
                heap.pop();
            }
        });
        let mut busiest: Vec<Ranked> = heap.into_iter().map(|Reverse(r)| r).collect();
        busiest.sort_by(|a, b| b.cmp(a));
        busiest
            .into_iter()
            .map(|Ranked(count, key)| (key, count as u64))
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
        self.rpcs
            .load()
            .values()
            .map(|s| s.keys.counters().keys)
            .sum()
    }

    #[cfg(test)]
    /// Drops keys with no call in the window; returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.rpcs.load().values().map(|s| s.keys.sweep(now)).sum()
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
    fn the_recent_span_is_the_previous_slot_and_the_current_part() {
        let registry = QpsRegistry::new(3 * S, 100);
        for (at, key, calls) in [(0, "a", 50), (S, "a", 20), (S, "b", 30), (2 * S, "b", 40)] {
            for _ in 0..calls {
                registry.record("PREP", key, at);
            }
        }
        for _ in 0..7 {
            registry.record_busy("PREP", S);
        }
        registry.record_busy("PREP", 0);
        registry.record_busy("COMMIT", S);
        let now = 2 * S + S / 4;
        assert_eq!(registry.recent_span(now), S + S / 4);
        assert_eq!(
            registry.recent_top("PREP", 1, now),
            vec![("b".to_owned(), 70)]
        );
        assert_eq!(
            registry.recent_totals("PREP", now),
            (90, 7),
            "the slot of 0 s is no longer recent"
        );
        assert_eq!(registry.recent_calls("PREP", "a", now), 20);
        assert_eq!(registry.recent_totals("COMMIT", now), (0, 1));
        assert!(registry.recent_top("COMMIT", 1, now).is_empty());
        assert_eq!(registry.recent_totals("OTHER", now), (0, 0));
    }

    #[test]
    fn the_total_counts_the_keys_past_the_bound_too() {
        // Two keys tracked; the other eight share the overflow cell, which is in no top-k but
        // is in the total a busy answer is a share of.
        let registry = QpsRegistry::new(3 * S, 2);
        for i in 0..10 {
            for _ in 0..5 {
                registry.record("PREP", &format!("table-{i}"), S);
            }
        }
        assert!(registry.keys() <= 2);
        assert_eq!(registry.recent_totals("PREP", S), (50, 0));
        let top = registry.recent_top("PREP", 10, S);
        assert!(
            top.iter().all(|(key, _)| key.starts_with("table-")),
            "{top:?}"
        );
        assert!(top.iter().map(|(_, n)| n).sum::<u64>() < 50);
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
