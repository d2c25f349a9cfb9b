//! Keyed limiters: one bucket per key, all of the same shape, in bounded memory.
//!
//! A [`KeyedLimiter`] is what a policy uses to keep one bucket per tenant, per user or per
//! table. Every bucket has the same *shape* (rate and capacity, or qps, or limit); per key only
//! the state is kept — one `u64` for a rate limiter (the GCRA theoretical arrival time, or the
//! strict limiter's next slot), a [`Concurrency`] for an in-flight limit. The map behind it
//! ([`store`]) bounds memory by `max_keys` and drops idle buckets itself.
//!
//! Changing the shape keeps every bucket's state: a rate change keeps each bucket's fill, a limit
//! change keeps what is in flight. Changing the *kind* of limiter is not a reshape: the policy
//! builds a new keyed limiter and state starts afresh.

pub mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::error::Refused;
use crate::limiter::gcra::{self, Params};
use crate::limiter::strict;
use crate::limiter::{Concurrency, OwnedPermit};
use store::{Cell, Found, KeysExhausted, Store};
pub use store::{Overflow, StoreCounters};

/// The shape every bucket of a keyed limiter shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A token or leaky bucket.
    Gcra {
        /// Nanoseconds per token.
        interval: u64,
        /// The most tokens a bucket holds.
        capacity: u64,
        /// Tokens a new bucket starts with.
        initial: u64,
        /// Waiters are served strictly in arrival order.
        fair: bool,
    },
    /// Requests exactly `interval` nanoseconds apart.
    Strict {
        /// Nanoseconds between two requests.
        interval: u64,
    },
    /// At most `limit` in flight.
    Concurrency {
        /// Permits per key.
        limit: u64,
    },
}

impl Shape {
    fn params(&self) -> Params {
        match *self {
            Shape::Gcra {
                interval, capacity, ..
            } => Params::new(interval, capacity),
            Shape::Strict { interval } => Params::new(interval, 1),
            Shape::Concurrency { .. } => Params::new(1, 0),
        }
    }

    fn is_concurrency(&self) -> bool {
        matches!(self, Shape::Concurrency { .. })
    }
}

/// The state of one key of a rate limiter: 16 bytes.
#[derive(Debug)]
pub(crate) struct RateCell {
    /// GCRA: the theoretical arrival time. Strict: the next free slot.
    value: AtomicU64,
    /// Requests waiting in this key's fair line (the line itself lives in [`Lines`]).
    waiting: AtomicU32,
    /// The "who is throttled" table follows this key: report its traffic.
    tracked: AtomicBool,
}

impl Cell<Shape> for RateCell {
    fn new(shape: &Shape, now: Nanos) -> Self {
        let value = match *shape {
            Shape::Gcra { initial, .. } => shape.params().tat_holding(initial, now),
            Shape::Strict { .. } | Shape::Concurrency { .. } => 0,
        };
        RateCell {
            value: AtomicU64::new(value),
            waiting: AtomicU32::new(0),
            tracked: AtomicBool::new(false),
        }
    }

    fn is_idle(&self, _shape: &Shape, now: Nanos) -> bool {
        // A GCRA bucket whose TAT has passed is full; a strict limiter whose next slot has
        // passed banks nothing. Either way a fresh cell would be no looser.
        self.waiting.load(Ordering::Acquire) == 0 && self.value.load(Ordering::Acquire) <= now
    }
}

/// A concurrency key's cell is shared with its permits and waiters, which hold it directly.
impl Cell<Shape> for Arc<Concurrency> {
    fn new(shape: &Shape, _now: Nanos) -> Self {
        Arc::new(match *shape {
            Shape::Concurrency { limit } => Concurrency::new(limit),
            _ => Concurrency::new(0),
        })
    }

    fn is_idle(&self, _shape: &Shape, _now: Nanos) -> bool {
        Arc::strong_count(self) == 1 && self.in_flight() == 0 && self.waiters() == 0
    }
}

/// What an admission took, so that it can be given back if another policy refuses the request.
///
/// For a concurrency limiter it holds the permits, released when this is dropped.
#[derive(Debug)]
#[must_use = "dropping a concurrency admission releases its permit"]
pub struct Taken {
    what: What,
    /// The request went to the shared overflow bucket.
    overflowed: bool,
}

#[derive(Debug)]
enum What {
    /// GCRA tokens (converted to time with the shape in force when given back).
    Tokens(u64),
    /// A strict slot starting at `slot`, `span` nanoseconds long.
    Slot { slot: Nanos, span: u64 },
    /// In-flight permits, released when dropped.
    Permit(#[allow(dead_code)] OwnedPermit),
    /// Nothing.
    Nothing,
}

impl Taken {
    /// An admission that took nothing (monitor mode, an unlimited kind).
    pub fn nothing() -> Self {
        Taken {
            what: What::Nothing,
            overflowed: false,
        }
    }

    /// Whether the request was counted against the shared overflow bucket.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn new(what: What, overflowed: bool) -> Self {
        Taken { what, overflowed }
    }
}

/// Why a keyed limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedRefusal {
    /// The key's bucket refused.
    Limited(Refused),
    /// The map was at `max_keys` with nothing idle, and the policy refuses overflowing keys.
    KeysExhausted,
    /// A waiting acquire waited its whole `max_wait` without getting its turn.
    TimedOut,
}

impl From<KeysExhausted> for KeyedRefusal {
    fn from(_: KeysExhausted) -> Self {
        KeyedRefusal::KeysExhausted
    }
}

#[derive(Debug)]
enum Buckets {
    Rate(Store<Shape, RateCell>),
    Concurrency(Store<Shape, Arc<Concurrency>>),
}

/// One bucket per key, all of one shape. See the [module docs](self).
#[derive(Debug)]
pub struct KeyedLimiter<C: Clock> {
    buckets: Buckets,
    clock: C,
    #[cfg(feature = "tokio")]
    lines: lines::Lines,
}

/// An admission by a keyed limiter.
#[derive(Debug)]
pub struct KeyedAdmission {
    /// What was taken, to give back if the request is rolled back.
    pub taken: Taken,
    /// How long the request waited.
    pub waited: Duration,
    /// The key is followed by the "who is throttled" table.
    pub tracked: bool,
}

impl<C: Clock> KeyedLimiter<C> {
    /// A keyed limiter of `shape`, tracking at most `max_keys` keys.
    pub fn new(shape: Shape, max_keys: usize, overflow: Overflow, clock: C) -> Self {
        let now = clock.now();
        let buckets = if shape.is_concurrency() {
            Buckets::Concurrency(Store::new(shape, max_keys, overflow, now))
        } else {
            Buckets::Rate(Store::new(shape, max_keys, overflow, now))
        };
        KeyedLimiter {
            buckets,
            clock,
            #[cfg(feature = "tokio")]
            lines: Default::default(),
        }
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The shape in force.
    pub fn shape(&self) -> Shape {
        match &self.buckets {
            Buckets::Rate(store) => store.shape(),
            Buckets::Concurrency(store) => store.shape(),
        }
    }

    /// Admits `cost` for `key` now, or says why not.
    #[inline]
    pub fn try_acquire(&self, key: &str, cost: u64) -> Result<KeyedAdmission, KeyedRefusal> {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => {
                let decided = store.with(key, now, |found| {
                    let tracked = found.cell.tracked.load(Ordering::Relaxed);
                    match try_rate(&found, cost, now) {
                        Ok(taken) => Ok(KeyedAdmission {
                            taken,
                            waited: Duration::ZERO,
                            tracked,
                        }),
                        Err(KeyedRefusal::Limited(Refused::NoPermit)) => Err(Behind::Line {
                            tat: found.cell.value.load(Ordering::Acquire),
                            params: found.shape.params(),
                            overflowed: found.overflowed,
                        }),
                        Err(refused) => Err(Behind::Refused(refused)),
                    }
                })?;
                // The line's lock is only taken outside the shard's.
                decided.map_err(|behind| self.refusal(behind, key, cost, now))
            }
            Buckets::Concurrency(store) => store.with(key, now, |found| {
                found
                    .cell
                    .try_acquire_owned(cost)
                    .map(|permit| KeyedAdmission {
                        taken: Taken::new(What::Permit(permit), found.overflowed),
                        waited: Duration::ZERO,
                        tracked: false,
                    })
                    .map_err(KeyedRefusal::Limited)
            })?,
        }
    }

    /// The refusal for a request that cannot go now. Behind a fair line, its retry-after counts
    /// everyone queued ahead.
    #[cfg_attr(not(feature = "tokio"), allow(unused_variables))]
    fn refusal(&self, behind: Behind, key: &str, cost: u64, now: Nanos) -> KeyedRefusal {
        match behind {
            Behind::Refused(refused) => refused,
            Behind::Line {
                tat,
                params,
                overflowed,
            } => {
                #[cfg(feature = "tokio")]
                let ahead = self.lines.unclaimed_cost(key, overflowed);
                #[cfg(not(feature = "tokio"))]
                let ahead: u64 = 0;
                let due = tat
                    .max(now)
                    .saturating_add(ahead.saturating_add(cost).saturating_mul(params.interval))
                    .saturating_sub(params.tolerance);
                KeyedRefusal::Limited(Refused::RetryAfter {
                    retry_after: Duration::from_nanos(due.saturating_sub(now)),
                })
            }
        }
    }

    /// Gives back what an admission took. Permits are released by dropping them.
    pub fn give_back(&self, key: &str, taken: Taken) {
        let Buckets::Rate(store) = &self.buckets else {
            return;
        };
        store.with_existing(key, taken.overflowed, |found| {
            undo(&found.cell.value, &taken.what, found.shape)
        });
    }

    /// Marks `key` as followed (or not) by the "who is throttled" table, so that its admitted
    /// requests are reported too. Returns false if the key is not tracked.
    pub fn set_tracked(&self, key: &str, tracked: bool) -> bool {
        match &self.buckets {
            Buckets::Rate(store) => store
                .with_existing(key, false, |found| {
                    found.cell.tracked.store(tracked, Ordering::Relaxed)
                })
                .is_some(),
            Buckets::Concurrency(_) => false,
        }
    }

    /// Changes the shape of every bucket, keeping each one's state. Returns false (and changes
    /// nothing) if `shape` is of another kind of limiter.
    pub fn reshape(&self, shape: Shape) -> bool {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => {
                match (store.shape(), shape) {
                    (Shape::Gcra { .. }, Shape::Gcra { .. }) => {
                        store.reshape(&shape, |old, new, cell| {
                            let _ = cell.value.fetch_update(
                                Ordering::AcqRel,
                                Ordering::Acquire,
                                |tat| Some(gcra::convert(tat, old.params(), new.params(), now)),
                            );
                        });
                    }
                    // A strict limiter's next slot stays where it is; later slots use the new
                    // spacing.
                    (Shape::Strict { .. }, Shape::Strict { .. }) => {
                        store.reshape(&shape, |_, _, _| {});
                    }
                    _ => return false,
                }
                true
            }
            Buckets::Concurrency(store) => {
                let Shape::Concurrency { limit } = shape else {
                    return false;
                };
                store.reshape(&shape, |_, _, cell| cell.set_limit(limit));
                true
            }
        }
    }

    /// Changes the key cap and what happens to keys beyond it.
    pub fn set_bounds(&self, max_keys: usize, overflow: Overflow) {
        match &self.buckets {
            Buckets::Rate(store) => store.set_bounds(max_keys, overflow),
            Buckets::Concurrency(store) => store.set_bounds(max_keys, overflow),
        }
    }

    /// Drops idle buckets now. The limiter also does this by itself when it reaches its cap.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => store.sweep(now),
            Buckets::Concurrency(store) => store.sweep(now),
        }
    }

    /// Keys tracked, evictions and overflow hits so far.
    pub fn counters(&self) -> StoreCounters {
        match &self.buckets {
            Buckets::Rate(store) => store.counters(),
            Buckets::Concurrency(store) => store.counters(),
        }
    }

    /// Permits in flight and requests waiting for `key`, if it is tracked.
    pub fn occupancy(&self, key: &str) -> Option<(u64, u64)> {
        match &self.buckets {
            Buckets::Rate(store) => store.with_existing(key, false, |found| {
                (0, u64::from(found.cell.waiting.load(Ordering::Relaxed)))
            }),
            Buckets::Concurrency(store) => store.with_existing(key, false, |found| {
                (found.cell.in_flight(), found.cell.waiters() as u64)
            }),
        }
    }

    /// Waits up to `max_wait` for `cost` to be admitted for `key`.
    ///
    /// Where the wait is known in advance (a reservation on an unfair bucket or a strict
    /// limiter), a request that could not make it within `max_wait` is refused at once with its
    /// exact retry-after, and takes nothing. Fair buckets and concurrency limits wait in line
    /// and are refused when `max_wait` runs out. Cancel-safe: a dropped waiter gives back
    /// whatever it had reserved.
    #[cfg(feature = "tokio")]
    pub async fn acquire(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<KeyedAdmission, KeyedRefusal> {
        let grant = |taken, waited| KeyedAdmission {
            taken,
            waited,
            tracked: false,
        };
        match &self.buckets {
            Buckets::Rate(store) => self.acquire_rate(store, key, cost, max_wait).await,
            Buckets::Concurrency(store) => {
                let (cell, overflowed) = store.with(key, self.clock.now(), |found| {
                    (Arc::clone(found.cell), found.overflowed)
                })?;
                if let Ok(permit) = cell.try_acquire_owned(cost) {
                    return Ok(grant(
                        Taken::new(What::Permit(permit), overflowed),
                        Duration::ZERO,
                    ));
                }
                let start = self.clock.now();
                match tokio::time::timeout(max_wait, cell.acquire_owned(cost)).await {
                    Ok(permit) => Ok(grant(
                        Taken::new(What::Permit(permit), overflowed),
                        Duration::from_nanos(self.clock.now().saturating_sub(start)),
                    )),
                    Err(_) => Err(KeyedRefusal::TimedOut),
                }
            }
        }
    }

    #[cfg(feature = "tokio")]
    async fn acquire_rate(
        &self,
        store: &Store<Shape, RateCell>,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<KeyedAdmission, KeyedRefusal> {
        let now = self.clock.now();
        let max_wait_ns = crate::clock::duration_to_nanos(max_wait);
        // Under the shard's lock: admit now, reserve, or (fair) join the key's line.
        let plan = store.with(key, now, |found| {
            let tracked = found.cell.tracked.load(Ordering::Relaxed);
            (plan_wait(&found, cost, now, max_wait_ns), tracked)
        })?;
        let (plan, tracked) = plan;
        let grant = |taken, waited| KeyedAdmission {
            taken,
            waited,
            tracked,
        };
        match plan {
            Plan::Admitted(taken) => Ok(grant(taken, Duration::ZERO)),
            Plan::Refused(refused) => Err(KeyedRefusal::Limited(refused)),
            Plan::Sleep { ready, taken } => {
                // The reservation keeps the key's bucket busy (and so in the map) until it is
                // due, so it can be found again to give it back.
                let pending = Pending {
                    store,
                    key,
                    taken: Some(&taken),
                };
                let wait = Duration::from_nanos(ready - now);
                tokio::time::sleep(wait).await;
                pending.disarm();
                Ok(grant(taken, wait))
            }
            Plan::Line { overflowed } => {
                let in_line = lines::InLine {
                    lines: &self.lines,
                    store,
                    key,
                    overflowed,
                };
                match tokio::time::timeout(max_wait, in_line.wait(cost, &self.clock)).await {
                    Ok((taken_ns, waited)) => Ok(grant(
                        Taken::new(What::Tokens(taken_ns), overflowed),
                        waited,
                    )),
                    Err(_) => Err(KeyedRefusal::TimedOut),
                }
            }
        }
    }
}

/// Why a rate cell refused, as seen under its shard's lock.
enum Behind {
    Refused(KeyedRefusal),
    /// A fair bucket with waiters: the request would queue behind them.
    Line {
        tat: Nanos,
        params: Params,
        overflowed: bool,
    },
}

/// Undoes what `what` took from a rate cell's value (read under the cell's shard lock, so
/// `shape` is the one the value is in).
fn undo(value: &AtomicU64, what: &What, shape: &Shape) {
    match *what {
        What::Tokens(tokens) => gcra::give_back(value, tokens, shape.params()),
        What::Slot { slot, span } => strict::give_back(value, slot, span),
        What::Permit(_) | What::Nothing => {}
    }
}

/// One non-blocking decision on a rate cell. A fair bucket with waiters refuses with
/// `NoPermit`, which the caller turns into a retry-after behind the line.
#[inline]
fn try_rate(
    found: &Found<'_, Shape, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<Taken, KeyedRefusal> {
    let cell = found.cell;
    match *found.shape {
        Shape::Gcra { fair, .. } => {
            let params = found.shape.params();
            if fair
                && cell.waiting.load(Ordering::Acquire) > 0
                && cost.saturating_mul(params.interval) <= params.tolerance
            {
                return Err(KeyedRefusal::Limited(Refused::NoPermit));
            }
            gcra::try_acquire(&cell.value, params, cost, now)
                .map(|()| Taken::new(What::Tokens(cost), found.overflowed))
                .map_err(KeyedRefusal::Limited)
        }
        Shape::Strict { interval } => {
            let span = cost.saturating_mul(interval);
            strict::take(&cell.value, span, now)
                .map(|()| Taken::new(What::Slot { slot: now, span }, found.overflowed))
                .map_err(KeyedRefusal::Limited)
        }
        Shape::Concurrency { .. } => Err(KeyedRefusal::Limited(Refused::NoPermit)),
    }
}

/// What a waiting acquire on a rate cell does next.
#[cfg(feature = "tokio")]
enum Plan {
    Admitted(Taken),
    Refused(Refused),
    /// Reserved: sleep until `ready`; give it back if cancelled.
    Sleep {
        ready: Nanos,
        taken: Taken,
    },
    /// A fair bucket: wait in the key's line (already counted in the cell's `waiting`).
    Line {
        overflowed: bool,
    },
}

#[cfg(feature = "tokio")]
fn plan_wait(found: &Found<'_, Shape, RateCell>, cost: u64, now: Nanos, max_wait: u64) -> Plan {
    let cell = found.cell;
    let (ready, what) = match *found.shape {
        Shape::Gcra { fair: true, .. } => {
            if let Ok(taken) = try_rate(found, cost, now) {
                return Plan::Admitted(taken);
            }
            // Counted as waiting under the shard's lock: from here on the key cannot be
            // evicted until it leaves the line.
            cell.waiting.fetch_add(1, Ordering::AcqRel);
            return Plan::Line {
                overflowed: found.overflowed,
            };
        }
        Shape::Gcra { .. } => {
            let reservation = gcra::reserve(&cell.value, found.shape.params(), cost, now);
            (reservation.ready, What::Tokens(reservation.taken))
        }
        Shape::Strict { interval } => {
            let span = cost.saturating_mul(interval);
            let slot = strict::book(&cell.value, span, now);
            (slot, What::Slot { slot, span })
        }
        Shape::Concurrency { .. } => return Plan::Refused(Refused::NoPermit),
    };
    if ready <= now {
        return Plan::Admitted(Taken::new(what, found.overflowed));
    }
    if ready - now > max_wait {
        // It could not make it in time: take nothing, say exactly when it could.
        undo(&cell.value, &what, found.shape);
        return Plan::Refused(Refused::RetryAfter {
            retry_after: Duration::from_nanos(ready - now),
        });
    }
    Plan::Sleep {
        ready,
        taken: Taken::new(what, found.overflowed),
    }
}

/// Undoes a reservation if the waiting future is dropped before it is due.
#[cfg(feature = "tokio")]
struct Pending<'a> {
    store: &'a Store<Shape, RateCell>,
    key: &'a str,
    taken: Option<&'a Taken>,
}

#[cfg(feature = "tokio")]
impl Pending<'_> {
    fn disarm(mut self) {
        self.taken = None;
    }
}

#[cfg(feature = "tokio")]
impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            self.store
                .with_existing(self.key, taken.overflowed, |found| {
                    undo(&found.cell.value, &taken.what, found.shape)
                });
        }
    }
}

/// The waiting lines of fair keyed buckets (feature `tokio`).
///
/// Lines live beside the map, only for keys that have waiters, so a bucket costs nothing extra
/// for being fair. Joining a line and removing an empty one happen under one lock, so a waiter
/// can never join a line that is being thrown away.
#[cfg(feature = "tokio")]
mod lines {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;

    use super::{RateCell, Shape, Store};
    use crate::clock::{Clock, Nanos};
    use crate::limiter::fair_queue::{FairQueue, Ticket, Turn};
    use crate::limiter::gcra;
    use std::sync::atomic::Ordering;

    type LineKey = (bool, Box<str>);

    #[derive(Debug, Default)]
    pub(super) struct Lines {
        lines: Mutex<HashMap<LineKey, Arc<FairQueue>>>,
    }

    impl Lines {
        fn lock(&self) -> MutexGuard<'_, HashMap<LineKey, Arc<FairQueue>>> {
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

        fn join(&self, key: &str, overflowed: bool, cost: u64) -> (Arc<FairQueue>, Ticket) {
            let mut lines = self.lock();
            let line = Arc::clone(lines.entry((overflowed, Box::from(key))).or_default());
            let ticket = line.join(cost);
            (line, ticket)
        }

        /// A waiter has left `line`; throws the line away if it was the last.
        fn done(&self, key: &str, overflowed: bool, line: &Arc<FairQueue>) {
            let mut lines = self.lock();
            if line.len() == 0 {
                let line_key = (overflowed, Box::from(key));
                if lines.get(&line_key).is_some_and(|l| Arc::ptr_eq(l, line)) {
                    lines.remove(&line_key);
                }
            }
        }
    }

    /// A waiter in a fair key's line.
    pub(super) struct InLine<'a> {
        pub lines: &'a Lines,
        pub store: &'a Store<Shape, RateCell>,
        pub key: &'a str,
        pub overflowed: bool,
    }

    impl InLine<'_> {
        /// Waits until admitted; returns what the claim took and how long that was.
        pub async fn wait<C: Clock>(&self, cost: u64, clock: &C) -> (u64, Duration) {
            let start = clock.now();
            let (line, ticket) = self.lines.join(self.key, self.overflowed, cost);
            let mut place = Place {
                in_line: self,
                line: &line,
                ticket: ticket.number,
                admitted: false,
            };
            loop {
                let now = clock.now();
                match line.turn(ticket.number, |cost| self.claim(cost, now)) {
                    Turn::NotYet => ticket.wake.notified().await,
                    Turn::Claimed { ready, claim } => {
                        if ready > now {
                            let wait = Duration::from_nanos(ready - now);
                            if tokio::time::timeout(wait, ticket.wake.notified())
                                .await
                                .is_ok()
                            {
                                continue;
                            }
                        }
                        if let Some(taken) = line.admit(ticket.number, claim) {
                            place.admitted = true;
                            return (taken, Duration::from_nanos(clock.now() - start));
                        }
                    }
                }
            }
        }

        /// Runs `f` on the key's cell. The key is counted as waiting, so its cell is in the map
        /// (`None` would mean that invariant broke; nothing panics over it).
        fn with_cell<R>(&self, f: impl FnOnce(&RateCell, &Shape) -> R) -> Option<R> {
            let found = self
                .store
                .with_existing(self.key, self.overflowed, |found| {
                    f(found.cell, found.shape)
                });
            debug_assert!(found.is_some(), "a key with waiters is never evicted");
            found
        }

        /// Reserves `cost` on the key's bucket, with its shape read under the same lock.
        fn claim(&self, cost: u64, now: Nanos) -> gcra::Reservation {
            self.with_cell(|cell, shape| gcra::reserve(&cell.value, shape.params(), cost, now))
                .unwrap_or(gcra::Reservation {
                    ready: now,
                    taken: 0,
                })
        }
    }

    /// Leaves the line when the waiter is done (admitted) or dropped (handing back any claim).
    struct Place<'a, 'b> {
        in_line: &'a InLine<'b>,
        line: &'a Arc<FairQueue>,
        ticket: u64,
        admitted: bool,
    }

    impl Drop for Place<'_, '_> {
        fn drop(&mut self) {
            let in_line = self.in_line;
            if !self.admitted {
                self.line.leave(self.ticket, |taken| {
                    in_line.with_cell(|cell, shape| {
                        gcra::give_back(&cell.value, taken, shape.params())
                    });
                });
            }
            in_line.with_cell(|cell, _| cell.waiting.fetch_sub(1, Ordering::AcqRel));
            in_line
                .lines
                .done(in_line.key, in_line.overflowed, self.line);
        }
    }
}
