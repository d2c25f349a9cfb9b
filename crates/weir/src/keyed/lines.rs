//! The waiting lines of a fair keyed limiter's keys (feature `tokio`).
//!
//! Lines live beside the map, only for keys that have waiters, so a bucket costs nothing extra
//! for being fair. Joining a line and removing an empty one happen under one lock, so a waiter
//! can never join a line that is being thrown away. The waiting itself is the same loop a single
//! fair bucket runs ([`wait_in_line`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{RateCell, RateShape, Store};
use crate::clock::{Clock, Nanos};
use crate::limiter::fair_line::{FairLine, Ticket, wait_in_line};
use crate::limiter::gcra::{InShape, Reservation, Tat};

/// A line is per key, and the overflow cell's line apart from a tracked key of the same name.
type LineKey = (bool, Box<str>);

/// The lines of one keyed limiter's keys that have waiters.
#[derive(Debug, Default)]
pub(super) struct Lines {
    lines: Mutex<HashMap<LineKey, Arc<FairLine>>>,
}

impl Lines {
    fn lock(&self) -> MutexGuard<'_, HashMap<LineKey, Arc<FairLine>>> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Total cost of the waiters of `key` that have not claimed yet.
    pub fn unclaimed_cost(&self, key: &str, overflowed: bool) -> u64 {
        self.lock()
            .get(&(overflowed, Box::from(key)))
            .map_or(0, |line| line.unclaimed_cost())
    }

    fn join(&self, key: &str, overflowed: bool, cost: u64) -> (Arc<FairLine>, Ticket) {
        let mut lines = self.lock();
        let line = Arc::clone(lines.entry((overflowed, Box::from(key))).or_default());
        let ticket = line.join(cost);
        (line, ticket)
    }

    /// A waiter has left `line`; throws the line away if it was the last.
    fn done(&self, key: &str, overflowed: bool, line: &Arc<FairLine>) {
        let mut lines = self.lock();
        if line.len() == 0 {
            let line_key = (overflowed, Box::from(key));
            if lines.get(&line_key).is_some_and(|l| Arc::ptr_eq(l, line)) {
                lines.remove(&line_key);
            }
        }
    }

    /// Runs `change` (a reshape of `store`) with every line held still and each head's claim
    /// handed back in the shape it was taken in; once `change` is done, the heads claim again,
    /// in the new shape. Locks are taken in the order every other path takes them: the map of
    /// lines, then a line, then a shard of `store`.
    pub fn with_claims_released<R>(
        &self,
        store: &Store<RateShape, RateCell>,
        change: impl FnOnce() -> R,
    ) -> R {
        let lines = self.lock();
        let mut held: Vec<_> = lines
            .iter()
            .map(|((overflowed, key), line)| {
                let mut held = line.hold();
                let cell = KeyCell {
                    store,
                    key,
                    overflowed: *overflowed,
                };
                held.release_claim(|taken| cell.give_back(taken));
                held
            })
            .collect();
        let result = change();
        // Dropping the holds wakes every head, now under the new shape.
        held.clear();
        result
    }

    /// Waits in `key`'s line until admitted; returns the tokens the claim took and how long the
    /// request was held back. The caller has counted the waiter in the key's cell, which keeps
    /// the key in the map until [`Leaving`] counts it out.
    pub async fn wait<C: Clock>(
        &self,
        store: &Store<RateShape, RateCell>,
        key: &str,
        overflowed: bool,
        cost: u64,
        clock: &C,
    ) -> (u64, Duration) {
        let cell = KeyCell {
            store,
            key,
            overflowed,
        };
        let (line, ticket) = self.join(key, overflowed, cost);
        let _leaving = Leaving {
            lines: self,
            cell: &cell,
            line: &line,
        };
        wait_in_line(
            &line,
            ticket,
            clock,
            |cost, now| cell.reserve(cost, now),
            |taken| cell.give_back(taken),
        )
        .await
    }
}

/// The cell of a key with waiters.
struct KeyCell<'a> {
    store: &'a Store<RateShape, RateCell>,
    key: &'a str,
    overflowed: bool,
}

impl KeyCell<'_> {
    /// Runs `f` on the key's cell and its shape, read under one lock. The key is counted as
    /// waiting, so its cell is in the map (`None` would mean that invariant broke; nothing
    /// panics over it).
    fn with<R>(&self, f: impl FnOnce(&RateCell, InShape<'_>) -> R) -> Option<R> {
        let found = self
            .store
            .with_existing(self.key, self.overflowed, |found| {
                f(found.cell, found.cell.bucket(found.shape))
            });
        debug_assert!(found.is_some(), "a key with waiters is never evicted");
        found
    }

    fn reserve(&self, cost: u64, now: Nanos) -> Reservation {
        self.with(|_, bucket| bucket.reserve(cost, now))
            .unwrap_or(Reservation {
                ready: now,
                taken: 0,
            })
    }

    fn give_back(&self, tokens: u64) {
        self.with(|_, bucket| bucket.give_back(tokens));
    }
}

/// Counts a waiter out of its key when it is done, admitted or not, and throws the key's line
/// away if it was the last one in it. Runs after the waiter has left the line (and handed back
/// any claim), while its count still keeps the key in the map.
struct Leaving<'a> {
    lines: &'a Lines,
    cell: &'a KeyCell<'a>,
    line: &'a Arc<FairLine>,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.cell
            .with(|cell, _| cell.waiting.fetch_sub(1, Ordering::AcqRel));
        self.lines
            .done(self.cell.key, self.cell.overflowed, self.line);
    }
}
