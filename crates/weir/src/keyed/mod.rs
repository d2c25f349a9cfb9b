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
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | `KeyedLimiter`: a map per kind of cell, and every operation on a key |
//! | `shape.rs` | `Shape`, made from each limiter's config, sorted by the map it needs |
//! | `cell.rs` | what a key holds: one word, or a shared concurrency limit |
//! | `decide.rs` | one non-blocking decision on a cell, and undoing it |
//! | `taken.rs` | what an admission took; why a keyed limiter refused |
//! | `handover.rs` | cluster mode: keys handed to a bucket's next owner, taken on, held while learning |
//! | `store.rs` | the sharded map: bounded by `max_keys`, idle keys dropped, overflow |
//! | `sketch.rs` | the max-sketch keys past the cap are decided in |
//! | `waiting.rs`, `lines.rs` | waiting acquires, and fair buckets' lines (feature `tokio`) |

mod cell;
mod decide;
mod handover;
#[cfg(feature = "tokio")]
mod lines;
// Without tokio nothing waits: the same name, for lines that are always empty.
#[cfg(not(feature = "tokio"))]
use crate::limiter::no_line as lines;
mod shape;
pub mod sketch;
pub(crate) mod store;
mod taken;
#[cfg(feature = "tokio")]
mod waiting;

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::error::{ConfigError, Refused};
use crate::limiter::gcra::{self, InShape, Params};
use crate::limiter::strict;
use crate::limiter::window::{Count, Quota, Window, WindowConfig};
use crate::limiter::{Concurrency, OwnedPermit};
use crate::limiter::{ConcurrencyConfig, LeakyBucketConfig, StrictConfig, TokenBucketConfig};
use crate::sync::AtomicU64;
pub use sketch::MaxSketch;
use store::{Cell, Found, KeysExhausted, Store};
pub use store::{Overflow, StoreCounters};

use cell::RateCell;
use decide::{Behind, admit_rate, hit_window, undo};
pub use shape::Shape;
use shape::{Kind, Limit, RateShape};
use taken::What;
pub use taken::{KeyedRefusal, Taken};

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
    fn refusal(&self, behind: Behind, key: &str, cost: u64, now: Nanos) -> KeyedRefusal {
        match behind {
            Behind::Refused(refused) => refused,
            Behind::Line {
                tat,
                params,
                overflowed,
            } => {
                let ahead = self.lines.unclaimed_cost(key, overflowed);
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
                    self.lines.with_claims_released(store, convert);
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
            // A new limit keeps the window's hits; a new length starts a new window. Another
            // count is another limiter.
            (Buckets::Window(store), Kind::Window(new)) if store.shape().count == new.count => {
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
}
