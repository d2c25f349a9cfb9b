//! Keyed limiters: one bucket per key, all of the same shape, in bounded memory.
//!
//! A [`KeyedLimiter`] is what a policy uses to keep one bucket per tenant, per user or per
//! table. Every bucket has the same *shape* (rate and capacity, or qps, or limit); per key only
//! the state is kept — one `u64` for a rate limiter (the GCRA theoretical arrival time, or the
//! strict limiter's next slot), a [`Concurrency`] for an in-flight limit. The map behind it
//! (`store.rs`) bounds memory by `max_keys` and drops idle buckets itself.
//!
//! Changing the shape keeps every bucket's state: a rate change keeps each bucket's fill, a limit
//! change keeps what is in flight. Changing the *kind* of limiter is not a reshape: the policy
//! builds a new keyed limiter and state starts afresh.

#[cfg(feature = "tokio")]
mod lines;
pub mod sketch;
pub(crate) mod store;
#[cfg(feature = "tokio")]
mod waiting;

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::error::{ConfigError, Refused};
use crate::limiter::fixed_window::{FixedWindowConfig, Quota, Window};
use crate::limiter::gcra::{self, InShape, Params, Tat};
use crate::limiter::strict;
use crate::limiter::{Concurrency, OwnedPermit};
use crate::limiter::{ConcurrencyConfig, LeakyBucketConfig, StrictConfig, TokenBucketConfig};
use crate::sync::AtomicU64;
pub use sketch::MaxSketch;
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
    /// At most `limit` hits per calendar-aligned window
    /// ([`fixed_window`](crate::limiter::fixed_window)). A fixed window has no place to queue:
    /// a waiting acquire decides at once.
    FixedWindow {
        /// A window's length in nanoseconds.
        window: u64,
        /// Hits per window.
        limit: u64,
    },
}

impl Shape {
    /// The shape as one of the two kinds of map: rate cells or in-flight permits. Calendar
    /// windows start at `unix_offset` before the clock's instant 0.
    fn kind(self, unix_offset: Nanos) -> Kind {
        match self {
            Shape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            } => Kind::Rate(RateShape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            }),
            Shape::Strict { interval } => Kind::Rate(RateShape::Strict { interval }),
            Shape::Concurrency { limit } => Kind::Concurrency(Limit(limit)),
            Shape::FixedWindow { window, limit } => Kind::Window(Window {
                length: window.max(1),
                limit,
                unix_offset,
            }),
        }
    }
}

/// A fixed window per key.
impl TryFrom<FixedWindowConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: FixedWindowConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let window = Window::from(config);
        Ok(Shape::FixedWindow {
            window: window.length,
            limit: window.limit,
        })
    }
}

/// A token bucket per key: full at first, refilling at `rate` up to `burst`.
impl TryFrom<TokenBucketConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: TokenBucketConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Gcra {
            interval: config.params().interval,
            capacity: config.burst,
            initial: config.burst,
            fair: false,
        })
    }
}

/// A leaky bucket per key, starting with `initial`.
impl TryFrom<LeakyBucketConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: LeakyBucketConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Gcra {
            interval: config.params().interval,
            capacity: config.max,
            initial: config.initial,
            fair: config.fair,
        })
    }
}

/// A strict limiter per key.
impl TryFrom<StrictConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: StrictConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Strict {
            interval: config.interval(),
        })
    }
}

/// A concurrency limit per key (every limit is valid).
impl From<ConcurrencyConfig> for Shape {
    fn from(config: ConcurrencyConfig) -> Self {
        Shape::Concurrency {
            limit: config.limit,
        }
    }
}

/// A [`Shape`] sorted by the map it needs.
enum Kind {
    Rate(RateShape),
    Concurrency(Limit),
    /// Fixed windows have a map of their own, although their cells are rate cells: a third
    /// rate shape cost every bucket's decision 4 to 11 ns (37 → 41–48 ns, `benches/keyed.rs`),
    /// however its arm was written.
    Window(Window),
}

/// The shape of a rate key's cell: the shapes whose whole state is one word.
///
/// It repeats `Shape`'s fields rather than holding a precomputed `Params`: keeping `Params`
/// here measured 4–8 % slower at 1 000 keys (three alternating runs, `benchmarks.md`), although
/// it saves a multiplication per decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RateShape {
    Gcra {
        interval: u64,
        capacity: u64,
        initial: u64,
        fair: bool,
    },
    Strict {
        interval: u64,
    },
}

impl RateShape {
    fn params(&self) -> Params {
        match *self {
            RateShape::Gcra {
                interval, capacity, ..
            } => Params::new(interval, capacity),
            RateShape::Strict { interval } => Params::new(interval, 1),
        }
    }

    /// What a key whose cell holds `value` has left at `now`.
    fn quota(&self, value: u64, now: Nanos) -> Quota {
        let params = self.params();
        let remaining = gcra::available(value, params, now);
        Quota {
            used: params.capacity() - remaining,
            remaining,
            reset_after: Duration::from_nanos(value.saturating_sub(now)),
        }
    }
}

impl From<RateShape> for Shape {
    fn from(shape: RateShape) -> Shape {
        match shape {
            RateShape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            } => Shape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            },
            RateShape::Strict { interval } => Shape::Strict { interval },
        }
    }
}

impl From<Window> for Shape {
    fn from(window: Window) -> Shape {
        Shape::FixedWindow {
            window: window.length,
            limit: window.limit,
        }
    }
}

/// The shape of a concurrency key's cell: permits per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limit(u64);

impl From<Limit> for Shape {
    fn from(Limit(limit): Limit) -> Shape {
        Shape::Concurrency { limit }
    }
}

/// The state of one key of a rate limiter: 16 bytes.
#[derive(Debug)]
pub(crate) struct RateCell {
    /// GCRA: the theoretical arrival time. Strict: the next free slot.
    value: AtomicU64,
    /// Requests waiting in this key's fair line (the line itself lives in `lines`).
    waiting: AtomicU32,
    /// The "who is throttled" table follows this key: report its traffic.
    tracked: AtomicBool,
}

impl RateCell {
    /// The cell's GCRA bucket, in `shape`.
    #[inline]
    fn bucket(&self, shape: &RateShape) -> InShape<'_> {
        InShape {
            word: &self.value,
            params: shape.params(),
        }
    }
}

impl Cell<RateShape> for RateCell {
    fn new(shape: &RateShape, now: Nanos) -> Self {
        let value = match *shape {
            RateShape::Gcra { initial, .. } => shape.params().tat_holding(initial, now),
            RateShape::Strict { .. } => 0,
        };
        RateCell {
            value: AtomicU64::new(value),
            waiting: AtomicU32::new(0),
            tracked: AtomicBool::new(false),
        }
    }

    fn is_idle(&self, _shape: &RateShape, now: Nanos) -> bool {
        // A GCRA bucket whose TAT has passed is full; a strict limiter whose next slot has
        // passed banks nothing. Either way a fresh cell would be no looser.
        self.waiting.load(Ordering::Acquire) == 0 && self.value.load(Ordering::Acquire) <= now
    }

    /// The TAT, or the next slot: later is emptier.
    fn word(&self) -> Option<&AtomicU64> {
        Some(&self.value)
    }
}

/// A fixed window's cell: the window's number and hits in `value` (`waiting` stays 0).
impl Cell<Window> for RateCell {
    fn new(_shape: &Window, _now: Nanos) -> Self {
        RateCell {
            // Window 0, no hits: empty whatever the time.
            value: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            tracked: AtomicBool::new(false),
        }
    }

    fn is_idle(&self, window: &Window, now: Nanos) -> bool {
        // A window with no hits now (an ended one) holds nothing a fresh cell would not.
        window.is_empty(self.value.load(Ordering::Acquire), now)
    }

    /// The window's number above its hits: a later window, or more hits in the same one, is
    /// a larger word.
    fn word(&self) -> Option<&AtomicU64> {
        Some(&self.value)
    }
}

/// A concurrency key's cell is shared with its permits and waiters, which hold it directly.
impl Cell<Limit> for Arc<Concurrency> {
    fn new(&Limit(limit): &Limit, _now: Nanos) -> Self {
        Arc::new(Concurrency::new(ConcurrencyConfig { limit }))
    }

    fn is_idle(&self, _shape: &Limit, _now: Nanos) -> bool {
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
    /// The request went to the shared overflow bucket, or was decided in the sketch.
    overflowed: bool,
}

#[derive(Debug)]
enum What {
    /// GCRA tokens (converted to time with the shape in force when given back).
    Tokens(u64),
    /// A strict slot starting at `slot`, `span` nanoseconds long.
    Slot { slot: Nanos, span: u64 },
    /// Hits counted in the window of `at`.
    Hits { cost: u64, at: Nanos },
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
    Rate(Store<RateShape, RateCell>),
    Concurrency(Store<Limit, Arc<Concurrency>>),
    Window(Store<Window, RateCell>),
}

impl Buckets {
    /// The map, for what every map does alike.
    fn map(&self) -> &dyn Map {
        match self {
            Buckets::Rate(store) => store,
            Buckets::Concurrency(store) => store,
            Buckets::Window(store) => store,
        }
    }
}

/// What a keyed map does whatever its cells hold: everything but the decisions.
trait Map: Debug + Send + Sync {
    fn shape(&self) -> Shape;
    fn set_bounds(&self, max_keys: usize, overflow: Overflow);
    fn sweep(&self, now: Nanos) -> usize;
    fn counters(&self) -> StoreCounters;
}

impl<S, C> Map for Store<S, C>
where
    S: Copy + Into<Shape> + Debug + Send + Sync,
    C: Cell<S> + Debug,
{
    fn shape(&self) -> Shape {
        Store::shape(self).into()
    }

    fn set_bounds(&self, max_keys: usize, overflow: Overflow) {
        Store::set_bounds(self, max_keys, overflow)
    }

    fn sweep(&self, now: Nanos) -> usize {
        Store::sweep(self, now)
    }

    fn counters(&self) -> StoreCounters {
        Store::counters(self)
    }
}

/// One bucket per key, all of one shape. See the [module docs](self).
#[derive(Debug)]
pub struct KeyedLimiter<C: Clock = crate::clock::SystemClock> {
    buckets: Buckets,
    clock: C,
    /// The clock's [`unix_offset`](Clock::unix_offset), read once: where calendar windows start.
    unix_offset: Nanos,
    #[cfg(feature = "tokio")]
    lines: lines::Lines,
}

/// An admission by a keyed limiter.
#[derive(Debug)]
pub struct KeyedAdmission {
    /// What was taken, to give back if the request is rolled back.
    pub taken: Taken,
    /// How long the request was held back: zero if it was admitted at once.
    pub waited: Duration,
    /// The key is followed by the "who is throttled" table.
    pub tracked: bool,
}

impl<C: Clock> KeyedLimiter<C> {
    /// A keyed limiter of `shape`, tracking at most `max_keys` keys.
    pub fn new(shape: Shape, max_keys: usize, overflow: Overflow, clock: C) -> Self {
        let now = clock.now();
        let unix_offset = clock.unix_offset();
        let buckets = match shape.kind(unix_offset) {
            Kind::Rate(shape) => Buckets::Rate(Store::new(shape, max_keys, overflow, now)),
            Kind::Concurrency(limit) => {
                Buckets::Concurrency(Store::new(limit, max_keys, overflow, now))
            }
            Kind::Window(window) => Buckets::Window(Store::new(window, max_keys, overflow, now)),
        };
        KeyedLimiter {
            buckets,
            clock,
            unix_offset,
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
        self.buckets.map().shape()
    }

    /// Admits `cost` for `key` now, or says why not.
    #[inline]
    pub fn try_acquire(&self, key: &str, cost: u64) -> Result<KeyedAdmission, KeyedRefusal> {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => {
                let decided = store.with(key, now, |found| admit_rate(&found, cost, now))?;
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
            Buckets::Window(store) => {
                store.with(key, now, |found| hit_window(&found, cost, now))?
            }
        }
    }

    /// [`try_acquire`](Self::try_acquire), and what the key has left just after: read from
    /// the cell the decision was made on (the shared overflow cell for a key past the cap),
    /// under the same lock, so no other decision comes between. `None` for a concurrency key
    /// or a refusal for want of room in the map.
    pub fn try_acquire_with_quota(
        &self,
        key: &str,
        cost: u64,
    ) -> (Result<KeyedAdmission, KeyedRefusal>, Option<Quota>) {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Window(store) => match store.with(key, now, |found| {
                let decided = hit_window(&found, cost, now);
                let quota = found
                    .shape
                    .quota(found.cell.value.load(Ordering::Acquire), now);
                (decided, quota)
            }) {
                Ok((decided, quota)) => (decided, Some(quota)),
                Err(full) => (Err(full.into()), None),
            },
            Buckets::Rate(store) => match store.with(key, now, |found| {
                let decided = admit_rate(&found, cost, now);
                let quota = found
                    .shape
                    .quota(found.cell.value.load(Ordering::Acquire), now);
                (decided, quota)
            }) {
                Ok((decided, quota)) => (
                    decided.map_err(|behind| self.refusal(behind, key, cost, now)),
                    Some(quota),
                ),
                Err(full) => (Err(full.into()), None),
            },
            Buckets::Concurrency(_) => (self.try_acquire(key, cost), None),
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
                KeyedRefusal::Limited(gcra::refusal_behind(tat, params, ahead, cost, now))
            }
        }
    }

    /// Gives back what an admission took. Permits are released by dropping them.
    pub fn give_back(&self, key: &str, taken: Taken) {
        match (&self.buckets, &taken.what) {
            (Buckets::Rate(store), _) => {
                store.with_existing(key, taken.overflowed, |found| {
                    undo(found.cell, &taken.what, found.shape)
                });
            }
            (Buckets::Window(store), &What::Hits { cost, at }) => {
                store.with_existing(key, taken.overflowed, |found| {
                    found.shape.give_back(&found.cell.value, cost, at)
                });
            }
            _ => {}
        }
    }

    /// Marks `key` as followed (or not) by the "who is throttled" table, so that its admitted
    /// requests are reported too. Returns false if the key is not tracked.
    pub fn set_tracked(&self, key: &str, tracked: bool) -> bool {
        let follow = |cell: &RateCell| cell.tracked.store(tracked, Ordering::Relaxed);
        match &self.buckets {
            Buckets::Rate(store) => store
                .with_existing(key, false, |found| follow(found.cell))
                .is_some(),
            Buckets::Window(store) => store
                .with_existing(key, false, |found| follow(found.cell))
                .is_some(),
            Buckets::Concurrency(_) => false,
        }
    }

    /// Changes the shape of every bucket, keeping each one's state. Returns false (and changes
    /// nothing) if `shape` is of another kind of limiter.
    pub fn reshape(&self, shape: Shape) -> bool {
        let now = self.clock.now();
        match (&self.buckets, shape.kind(self.unix_offset)) {
            (Buckets::Rate(store), Kind::Rate(new)) => match (store.shape(), new) {
                (RateShape::Gcra { .. }, RateShape::Gcra { .. }) => {
                    let convert = || {
                        store.reshape(&new, |old, new, cell| {
                            let _ = cell.value.fetch_update(
                                Ordering::AcqRel,
                                Ordering::Acquire,
                                |tat| Some(gcra::convert(tat, old.params(), new.params(), now)),
                            );
                        })
                    };
                    // As a single fair bucket does: the heads of the lines give back what they
                    // claimed in the old shape and claim again in the new one.
                    #[cfg(feature = "tokio")]
                    self.lines.with_claims_released(store, convert);
                    #[cfg(not(feature = "tokio"))]
                    convert();
                    true
                }
                // A strict limiter's next slot stays where it is; later slots use the new
                // spacing.
                (RateShape::Strict { .. }, RateShape::Strict { .. }) => {
                    store.reshape(&new, |_, _, _| {});
                    true
                }
                _ => false,
            },
            (Buckets::Concurrency(store), Kind::Concurrency(limit)) => {
                store.reshape(&limit, |_, &Limit(limit), cell| {
                    cell.reconfigure(ConcurrencyConfig { limit })
                });
                true
            }
            // A new limit keeps the window's hits; a new length starts a new window.
            (Buckets::Window(store), Kind::Window(new)) => {
                store.reshape(&new, |old, new, cell| {
                    if old.length != new.length {
                        cell.value.store(0, Ordering::Release);
                    }
                });
                true
            }
            _ => false,
        }
    }

    /// Changes the key cap and what happens to keys beyond it.
    pub fn set_bounds(&self, max_keys: usize, overflow: Overflow) {
        self.buckets.map().set_bounds(max_keys, overflow)
    }

    /// Drops idle buckets now. The limiter also does this by itself when it reaches its cap.
    pub fn sweep(&self) -> usize {
        self.buckets.map().sweep(self.clock.now())
    }

    /// Keys tracked, evictions and overflow hits so far.
    pub fn counters(&self) -> StoreCounters {
        self.buckets.map().counters()
    }

    /// What `key` has left now: for a rate key, what it may still spend and how long until it
    /// is whole again; for a concurrency key, the permits free (and no time). A key not tracked
    /// has its whole shape.
    pub fn quota(&self, key: &str) -> Quota {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => store
                .with_existing(key, false, |found| {
                    found
                        .shape
                        .quota(found.cell.value.load(Ordering::Acquire), now)
                })
                .unwrap_or_else(|| {
                    let shape = store.shape();
                    let fresh = <RateCell as Cell<RateShape>>::new(&shape, now);
                    shape.quota(fresh.value.into_inner(), now)
                }),
            Buckets::Window(store) => store
                .with_existing(key, false, |found| {
                    found
                        .shape
                        .quota(found.cell.value.load(Ordering::Acquire), now)
                })
                .unwrap_or_else(|| store.shape().quota(0, now)),
            Buckets::Concurrency(store) => {
                let Limit(limit) = store.shape();
                let in_flight = store
                    .with_existing(key, false, |found| found.cell.in_flight())
                    .unwrap_or(0);
                Quota {
                    used: in_flight,
                    remaining: limit.saturating_sub(in_flight),
                    reset_after: Duration::ZERO,
                }
            }
        }
    }

    /// Permits in flight and requests waiting for `key`, if it is tracked.
    pub fn occupancy(&self, key: &str) -> Option<(u64, u64)> {
        match &self.buckets {
            Buckets::Rate(store) => store.with_existing(key, false, |found| {
                (0, u64::from(found.cell.waiting.load(Ordering::Relaxed)))
            }),
            Buckets::Window(store) => store.with_existing(key, false, |_| (0, 0)),
            Buckets::Concurrency(store) => store.with_existing(key, false, |found| {
                (found.cell.in_flight(), found.cell.waiters() as u64)
            }),
        }
    }

    /// Every tracked rate key that is not whole now, with what it has left, for the keys
    /// `moving` picks: what this node hands a bucket's next owner when the ring moves the
    /// bucket away ([`absorb`](Self::absorb) on the other side). A walk over every key: for
    /// membership changes, never per request. Empty for a concurrency limiter.
    pub fn spent_keys(&self, mut moving: impl FnMut(&str) -> bool) -> Vec<(String, Quota)> {
        let now = self.clock.now();
        let mut spent = Vec::new();
        match &self.buckets {
            Buckets::Rate(store) => store.for_each(|key, shape, cell| {
                let quota = shape.quota(cell.value.load(Ordering::Acquire), now);
                if !quota.reset_after.is_zero() && moving(key) {
                    spent.push((key.to_owned(), quota));
                }
            }),
            Buckets::Window(store) => store.for_each(|key, shape, cell| {
                let quota = shape.quota(cell.value.load(Ordering::Acquire), now);
                if quota.used > 0 && moving(key) {
                    spent.push((key.to_owned(), quota));
                }
            }),
            Buckets::Concurrency(_) => {}
        }
        spent
    }

    /// Takes on what another node spent of `key` (its [`spent_keys`](Self::spent_keys)
    /// entry): the bucket is left no fuller than `handed` says, and never made fuller than it
    /// is. A rate bucket takes the time until it is whole again; a fixed window takes the count,
    /// only if `handed` is of the window in force here (its end within half a window of this
    /// one's). A key past the cap is taken on in the sketch; with a shared overflow cell it is
    /// left alone (that cell is everyone's).
    pub fn absorb(&self, key: &str, handed: Quota) {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => {
                let whole_at =
                    now.saturating_add(crate::clock::duration_to_nanos(handed.reset_after));
                let _ = store.with(key, now, |found| {
                    if !found.overflowed || found.sketched {
                        raise_to(&found.cell.value, whole_at);
                    }
                });
            }
            Buckets::Window(store) => {
                let _ = store.with(key, now, |found| {
                    let left = found.shape.quota(0, now).reset_after;
                    let same = left.abs_diff(handed.reset_after)
                        < Duration::from_nanos(found.shape.length / 2);
                    if same && (!found.overflowed || found.sketched) {
                        found
                            .shape
                            .hold_to(&found.cell.value, handed.remaining, now);
                    }
                });
            }
            Buckets::Concurrency(_) => {}
        }
    }

    /// What a bucket's new owner allows while it cannot know what the previous owner spent:
    /// leaves `key` holding the share of its capacity that `held_for` is of its refill time
    /// (or of `learning`, if shorter), never making it fuller than it is. With `learning` at
    /// least the refill time, the bucket holds what it refilled in `held_for` and refills at
    /// its rate from there, so it admits no more than one bucket would have; a shorter
    /// `learning` lets it fill sooner. A fixed window whose count began before `held_for` ago
    /// is full until it ends.
    pub fn hold_to_tenure(&self, key: &str, held_for: Duration, learning: Duration) {
        let now = self.clock.now();
        let held_for = crate::clock::duration_to_nanos(held_for);
        let learning = crate::clock::duration_to_nanos(learning);
        match &self.buckets {
            Buckets::Rate(store) => {
                let _ = store.with(key, now, |found| {
                    let tolerance = found.shape.params().tolerance;
                    let window = tolerance.min(learning).max(1);
                    let share = (held_for as f64 / window as f64).min(1.0);
                    // Rounded up: the bucket only ever comes out emptier.
                    let missing = (tolerance as f64 * (1.0 - share)).ceil() as u64;
                    if !found.overflowed || found.sketched {
                        raise_to(&found.cell.value, now.saturating_add(missing));
                    }
                });
            }
            Buckets::Window(store) => {
                let _ = store.with(key, now, |found| {
                    let left =
                        crate::clock::duration_to_nanos(found.shape.quota(0, now).reset_after);
                    let begun = found.shape.length - left;
                    if begun > held_for && (!found.overflowed || found.sketched) {
                        found.shape.hold_to(&found.cell.value, 0, now);
                    }
                });
            }
            Buckets::Concurrency(_) => {}
        }
    }
}

/// Moves a rate cell's TAT (or next slot) to `at` if it is earlier: the bucket only empties.
fn raise_to(value: &AtomicU64, at: Nanos) {
    let _ = value.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
        (tat < at).then_some(at)
    });
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

/// A non-blocking decision on a rate cell that did not admit.
enum Decided {
    /// The bucket refused.
    Refused(Refused),
    /// A fair bucket has waiters: the request would have to queue behind them.
    BehindLine,
}

/// Undoes what `what` took from a rate cell (read under the cell's shard lock, so `shape` is
/// the one the cell is in).
fn undo(cell: &RateCell, what: &What, shape: &RateShape) {
    match *what {
        What::Tokens(tokens) => cell.bucket(shape).give_back(tokens),
        What::Slot { slot, span } => strict::give_back(&cell.value, slot, span),
        What::Permit(_) | What::Hits { .. } | What::Nothing => {}
    }
}

/// A non-blocking decision on a rate cell, as an admission or what stands behind a refusal
/// (a fair line's retry-after is worked out outside the shard's lock).
#[inline]
fn admit_rate(
    found: &Found<'_, RateShape, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<KeyedAdmission, Behind> {
    let tracked = found.cell.tracked.load(Ordering::Relaxed);
    match try_rate(found, cost, now) {
        Ok(taken) => Ok(KeyedAdmission {
            taken,
            waited: Duration::ZERO,
            tracked,
        }),
        Err(Decided::BehindLine) => Err(Behind::Line {
            tat: found.cell.value.load(Ordering::Acquire),
            params: found.shape.params(),
            overflowed: found.overflowed,
        }),
        Err(Decided::Refused(refused)) => Err(Behind::Refused(KeyedRefusal::Limited(refused))),
    }
}

/// A decision on a fixed window's cell.
fn hit_window(
    found: &Found<'_, Window, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<KeyedAdmission, KeyedRefusal> {
    let tracked = found.cell.tracked.load(Ordering::Relaxed);
    found
        .shape
        .hit(&found.cell.value, cost, now)
        .map(|_| KeyedAdmission {
            taken: Taken::new(What::Hits { cost, at: now }, found.overflowed),
            waited: Duration::ZERO,
            tracked,
        })
        .map_err(KeyedRefusal::Limited)
}

/// One non-blocking decision on a rate cell.
#[inline]
fn try_rate(
    found: &Found<'_, RateShape, RateCell>,
    cost: u64,
    now: Nanos,
) -> Result<Taken, Decided> {
    let cell = found.cell;
    match *found.shape {
        RateShape::Gcra { fair, .. } => {
            let bucket = cell.bucket(found.shape);
            if fair
                && cell.waiting.load(Ordering::Acquire) > 0
                && cost.saturating_mul(bucket.params.interval) <= bucket.params.tolerance
            {
                return Err(Decided::BehindLine);
            }
            bucket
                .try_acquire(cost, now)
                .map(|()| Taken::new(What::Tokens(cost), found.overflowed))
                .map_err(Decided::Refused)
        }
        RateShape::Strict { interval } => {
            let span = cost.saturating_mul(interval);
            strict::take(&cell.value, span, now)
                .map(|()| Taken::new(What::Slot { slot: now, span }, found.overflowed))
                .map_err(Decided::Refused)
        }
    }
}
