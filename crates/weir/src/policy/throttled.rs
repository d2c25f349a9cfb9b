//! "Who is throttled": the keys a policy is holding back right now.
//!
//! An operator asks which tenants, users or tables are being limited, and how hard. Walking
//! every key would cost as much as the key map is large, so the table is built the other way
//! round: every refusal or wait records its key here (a slow path already), and the table keeps
//! at most `capacity` keys — the most recently throttled. A key stays in the table until it has
//! gone a whole window without being throttled.
//!
//! For each key the table also measures the rate of requests it sees, and the rate of those it
//! held back, over a sliding window of two fixed buckets. Refusals and waits are recorded on
//! their own; admitted requests are recorded only for keys in the table (the keyed limiter marks
//! their cells, and a decision made elsewhere asks [`ThrottledKeys::admitted`] only while the
//! table holds a key at all), so an untracked key's fast path pays nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{Nanos, duration_to_nanos};

/// How many keys the table keeps by default.
pub const DEFAULT_CAPACITY: usize = 100;
/// The default window: a key leaves the table after this long without being throttled, and
/// rates are measured over it.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// One row: a key being held back.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottledKey {
    /// The key.
    pub key: String,
    /// The kind of its most recent request (`None`: of no kind).
    pub kind: Option<String>,
    /// Requests per second seen for the key over the window.
    pub current_qps: f64,
    /// Of those, requests per second refused or made to wait.
    pub throttled_qps: f64,
    /// Refusals and waits since the key entered the table.
    pub throttled: u64,
    /// When the key was last throttled.
    pub last_throttled: Nanos,
}

#[derive(Debug)]
struct Entry {
    kind: Option<Box<str>>,
    /// When the table started following the key: rates cover at most this long.
    since: Nanos,
    last_throttled: Nanos,
    throttled: u64,
    window_start: Nanos,
    /// Requests seen in the current and the previous fixed bucket.
    requests: Buckets,
    /// Of those, the ones refused or made to wait.
    held: Buckets,
}

/// A count in two fixed buckets of a window: the current one and the one before.
#[derive(Debug, Default, Clone, Copy)]
struct Buckets {
    current: u64,
    previous: u64,
}

impl Entry {
    fn roll(&mut self, now: Nanos, window: u64) {
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= 2 * window {
            self.requests = Buckets::default();
            self.held = Buckets::default();
            self.window_start = now - now % window.max(1);
        } else if elapsed >= window {
            for buckets in [&mut self.requests, &mut self.held] {
                buckets.previous = buckets.current;
                buckets.current = 0;
            }
            self.window_start += window;
        }
    }

    /// Requests per second over the last `window` (or since the key is followed, if that is
    /// shorter, but never less than a second), weighting the previous bucket by how much of it still falls inside.
    fn rate(&self, counted: Buckets, now: Nanos, window: u64) -> f64 {
        let into_current = now.saturating_sub(self.window_start).min(window) as f64 / window as f64;
        let requests = counted.previous as f64 * (1.0 - into_current) + counted.current as f64;
        // At least a second (or the window, if shorter), so that two requests a few
        // microseconds apart do not read as a million per second.
        let covered = now
            .saturating_sub(self.since)
            .clamp(window.min(1_000_000_000), window);
        requests / (covered as f64 / 1e9)
    }
}

/// The bounded table of throttled keys. See the [module docs](self).
#[derive(Debug)]
pub struct ThrottledKeys {
    entries: Mutex<HashMap<Box<str>, Entry>>,
    /// How many keys `entries` holds, kept beside it so an admission can learn without the
    /// lock that no key is followed.
    followed: AtomicUsize,
    capacity: usize,
    /// The window in ns.
    window: u64,
}

impl Default for ThrottledKeys {
    fn default() -> Self {
        ThrottledKeys::new(DEFAULT_CAPACITY, DEFAULT_WINDOW)
    }
}

/// What recording a request did to the table, so the caller can mark or unmark key cells.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The key was not in the table and now is.
    pub added: bool,
    /// Keys (with their kinds) that left the table to make room or because they went quiet.
    pub removed: Vec<(String, Option<String>)>,
}

impl ThrottledKeys {
    /// A table of at most `capacity` keys, forgetting a key after `window` without throttling.
    pub fn new(capacity: usize, window: Duration) -> Self {
        ThrottledKeys {
            entries: Mutex::new(HashMap::new()),
            followed: AtomicUsize::new(0),
            capacity: capacity.max(1),
            window: duration_to_nanos(window).max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a request for `key` that was refused or had to wait.
    pub fn throttled(&self, key: &str, kind: Option<&str>, now: Nanos) -> Changes {
        let mut entries = self.lock();
        let mut changes = Changes::default();
        self.expire(&mut entries, now, &mut changes);
        if !entries.contains_key(key) {
            if entries.len() >= self.capacity {
                // Make room: the key throttled longest ago goes.
                if let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.last_throttled)
                    .map(|(k, _)| k.clone())
                {
                    let entry = entries.remove(&oldest).expect("just found");
                    changes
                        .removed
                        .push((oldest.into(), entry.kind.map(Into::into)));
                }
            }
            entries.insert(
                Box::from(key),
                Entry {
                    kind: kind.map(Box::from),
                    since: now,
                    last_throttled: now,
                    throttled: 0,
                    window_start: now - now % self.window,
                    requests: Buckets::default(),
                    held: Buckets::default(),
                },
            );
            self.followed.store(entries.len(), Ordering::Relaxed);
            changes.added = true;
        }
        let entry = entries.get_mut(key).expect("present");
        entry.roll(now, self.window);
        entry.requests.current += 1;
        entry.held.current += 1;
        entry.throttled += 1;
        entry.last_throttled = now;
        if entry.kind.as_deref() != kind {
            entry.kind = kind.map(Box::from);
        }
        changes
    }

    /// Records an admitted request for a key the table follows (another key is ignored; while
    /// the table is empty, without taking its lock).
    pub fn admitted(&self, key: &str, now: Nanos) {
        if self.followed.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(entry) = self.lock().get_mut(key) {
            entry.roll(now, self.window);
            entry.requests.current += 1;
        }
    }

    /// Drops keys that went a whole window without being throttled.
    fn expire(&self, entries: &mut HashMap<Box<str>, Entry>, now: Nanos, changes: &mut Changes) {
        let window = self.window;
        entries.retain(|key, entry| {
            let keep = now.saturating_sub(entry.last_throttled) < window;
            if !keep {
                changes
                    .removed
                    .push((key.to_string(), entry.kind.as_deref().map(str::to_owned)));
            }
            keep
        });
        self.followed.store(entries.len(), Ordering::Relaxed);
    }

    /// The keys throttled within the window, most requests per second first, at most `limit`.
    /// Also returns the keys that expired, so their cells can be unmarked.
    pub fn rows(&self, now: Nanos, limit: usize) -> (Vec<ThrottledKey>, Changes) {
        let mut entries = self.lock();
        let mut changes = Changes::default();
        self.expire(&mut entries, now, &mut changes);
        let mut rows: Vec<ThrottledKey> = entries
            .iter_mut()
            .map(|(key, entry)| {
                entry.roll(now, self.window);
                ThrottledKey {
                    key: key.to_string(),
                    kind: entry.kind.as_deref().map(str::to_owned),
                    current_qps: entry.rate(entry.requests, now, self.window),
                    throttled_qps: entry.rate(entry.held, now, self.window),
                    throttled: entry.throttled,
                    last_throttled: entry.last_throttled,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.current_qps
                .total_cmp(&a.current_qps)
                .then_with(|| a.key.cmp(&b.key))
        });
        rows.truncate(limit);
        (rows, changes)
    }

    /// Keys in the table now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn the_table_is_bounded_and_keeps_the_most_recently_throttled() {
        let table = ThrottledKeys::new(2, Duration::from_secs(10));
        assert!(table.throttled("a", Some("k"), S).added);
        table.throttled("b", Some("k"), 2 * S);
        let changes = table.throttled("c", Some("k"), 3 * S);
        assert_eq!(
            changes.removed,
            vec![("a".to_owned(), Some("k".to_owned()))]
        );
        assert_eq!(table.len(), 2);
        let (rows, _) = table.rows(4 * S, 10);
        let keys: Vec<_> = rows.iter().map(|r| r.key.as_str()).collect();
        // One request each: "c" over 1 s, "b" over 2 s.
        assert_eq!(keys, vec!["c", "b"]);
        assert_eq!(rows[0].current_qps, 1.0);
        assert_eq!(rows[1].current_qps, 0.5);
    }

    #[test]
    fn an_empty_table_ignores_admissions_and_follows_a_key_again_once_it_is_throttled() {
        let table = ThrottledKeys::new(10, Duration::from_secs(10));
        table.admitted("a", 0);
        table.throttled("a", None, S);
        table.admitted("a", 2 * S);
        let (rows, _) = table.rows(2 * S, 10);
        // Followed since its refusal: that and the admission after it, in one second.
        assert_eq!((rows[0].current_qps, rows[0].throttled_qps), (2.0, 1.0));
        // Gone quiet, the key leaves; an admission then is not counted for it.
        let (rows, _) = table.rows(12 * S, 10);
        assert!(rows.is_empty());
        table.admitted("a", 13 * S);
        table.throttled("a", None, 14 * S);
        let (rows, _) = table.rows(14 * S, 10);
        assert_eq!((rows[0].current_qps, rows[0].throttled_qps), (1.0, 1.0));
    }

    #[test]
    fn quiet_keys_leave_after_a_window() {
        let table = ThrottledKeys::new(10, Duration::from_secs(10));
        table.throttled("a", Some("k"), 0);
        let (rows, changes) = table.rows(10 * S, 10);
        assert!(rows.is_empty());
        assert_eq!(
            changes.removed,
            vec![("a".to_owned(), Some("k".to_owned()))]
        );
    }

    #[test]
    fn rates_count_admitted_and_throttled_requests_over_the_window() {
        let table = ThrottledKeys::new(10, Duration::from_secs(10));
        table.throttled("hot", Some("scan"), 0);
        for i in 1..99 {
            table.admitted("hot", i * S / 10);
        }
        table.throttled("hot", Some("scan"), 99 * S / 10);
        table.admitted("cold", S); // not in the table: ignored
        let (rows, _) = table.rows(10 * S - 1, 10);
        assert_eq!(rows.len(), 1);
        // 100 requests over the 10 s (less 1 ns) it has been followed.
        assert!(
            (rows[0].current_qps - 10.0).abs() < 1e-6,
            "{}",
            rows[0].current_qps
        );
        // Two of them held back.
        assert!(
            (rows[0].throttled_qps - 0.2).abs() < 1e-6,
            "{}",
            rows[0].throttled_qps
        );
        // Half a window later, half of the old bucket still counts. (Throttled again within a
        // window of the last time, the key stays in the table.)
        table.throttled("hot", Some("scan"), 15 * S);
        let (rows, _) = table.rows(15 * S, 10);
        assert!(
            (rows[0].current_qps - 5.1).abs() < 1e-9,
            "{}",
            rows[0].current_qps
        );
        // Half of the old bucket's two, and the new one.
        assert!(
            (rows[0].throttled_qps - 0.2).abs() < 1e-9,
            "{}",
            rows[0].throttled_qps
        );
        assert_eq!(rows[0].throttled, 3);
    }
}
