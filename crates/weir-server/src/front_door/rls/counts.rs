//! The reference rate limit server's own counters of each rule (total hits, over limit, near
//! limit, within limit, shadow mode), computed as it computes them, for dashboards built on
//! them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The most metric names a `detailed_metric` or `value_to_metric` rule keeps apart; hits of
/// further names count under the rule's path.
pub const MAX_METRIC_NAMES: usize = 1000;

/// The reference server's counters of one rule (or of one metric name of it).
#[derive(Debug, Default)]
pub struct Counts {
    /// Hits asked for.
    pub total_hits: AtomicU64,
    /// Hits past the limit.
    pub over_limit: AtomicU64,
    /// Hits between the near-limit mark and the limit.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Hits past the limit that shadow mode let through.
    pub shadow_mode: AtomicU64,
}

impl Counts {
    /// A snapshot: total, over, near, within, shadow.
    pub fn read(&self) -> [u64; 5] {
        [
            self.total_hits.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed),
            self.near_limit.load(Ordering::Relaxed),
            self.within_limit.load(Ordering::Relaxed),
            self.shadow_mode.load(Ordering::Relaxed),
        ]
    }

    /// Counts `hits` that took the key from `before` to `after` against `limit` (the
    /// reference server's arithmetic, partial crossings split).
    pub(super) fn record(&self, hits: u64, after: u64, limit: u64, near: u64, shadow: bool) {
        let before = after.saturating_sub(hits);
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        if after > limit {
            let over = if before >= limit { hits } else { after - limit };
            self.over_limit.fetch_add(over, Ordering::Relaxed);
            if before < limit {
                self.near_limit
                    .fetch_add(limit - before.max(near), Ordering::Relaxed);
            }
            if shadow {
                self.shadow_mode.fetch_add(over, Ordering::Relaxed);
            }
        } else {
            self.within_limit.fetch_add(hits, Ordering::Relaxed);
            if after > near {
                self.near_limit
                    .fetch_add(after - before.max(near), Ordering::Relaxed);
            }
        }
    }
}

/// A rule's counters: under its path, and under the names its metrics ask for.
#[derive(Debug, Default)]
pub struct RuleCounts {
    /// Under the rule's path.
    pub rule: Counts,
    /// Under request-dependent names (`detailed_metric`, `value_to_metric`), at most
    /// [`MAX_METRIC_NAMES`].
    pub named: Mutex<HashMap<String, Arc<Counts>>>,
}

impl RuleCounts {
    pub(super) fn of(&self, metric: &str) -> Option<Arc<Counts>> {
        let mut named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(counts) = named.get(metric) {
            return Some(Arc::clone(counts));
        }
        if named.len() >= MAX_METRIC_NAMES {
            return None;
        }
        let counts = Arc::new(Counts::default());
        named.insert(metric.to_owned(), Arc::clone(&counts));
        Some(counts)
    }
}
