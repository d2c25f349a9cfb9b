//! The owner side of a shared pool: the leases each bucket has out.
//!
//! A bucket's shared permits are counted on its owner as *live leases*: a grant inserts a lease
//! `{id, units, expires_at, holder}` if the live units stay within `limit`, all under one lock,
//! so a check and its insert cannot be split by a racing grant. Because the count *is* the set
//! of live leases, releasing twice, releasing after a sweep, or sweeping twice cannot drift it.
//! A lease expires at `expires_at` inclusive (`expires_at == now` is expired): expired leases
//! are pruned lazily when a bucket looks full, and by a periodic sweep; empty buckets are
//! removed. A holder that leaves the cluster keeps its leases until they expire: it may only be
//! paused.
//!
//! A *loan* is a lease of one or more units lent to a node, which hands its units out itself
//! with no call to the owner (see [`loan`](crate::loan)); a node has at most one loan of a
//! bucket here, which its lend requests grow. The owner counts every lent
//! unit as used, so lending never lets the bucket exceed its limit; what it can cost is units
//! lent and idle while another node is refused. So a loan grows by at most a quarter of what is
//! free, down to one unit a call when the pool is nearly full, and each answer says how many
//! idle units the holder may *keep* — a quarter of what is still free, shared by the holders
//! of loans in the bucket, and none for two seconds
//! after a refusal while other holders had loans (a recall: they give their idle units back
//! at their next renewal, within about a second).
//!
//! The number of buckets an owner tracks is bounded (`max_buckets`; keyed per user, the map
//! could otherwise grow with every user that has a request in flight): beyond it a new bucket
//! is refused, and the caller applies the policy's "unavailable" behaviour.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use weir::Nanos;

#[cfg(doc)]
use crate::messages::Ask;
use crate::messages::LeaseRequest;

/// How long a refusal while units were lent elsewhere keeps every holder's `keep` at zero: long
/// enough for each holder's next renewal (about once a second) to hear it.
pub const RECALL_FOR: Duration = Duration::from_secs(2);

/// A shared permit (or, with more than one unit, a loan), as its owner records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLease {
    /// Unique within this pool.
    pub id: u64,
    /// Units it counts for (1 for a plain lease).
    pub units: u64,
    /// A loan: its holder's one loan of the bucket here, which its lend requests grow.
    pub lent: bool,
    /// Expired from this instant on.
    pub expires_at: Nanos,
    /// The node holding it (empty: unknown).
    pub holder: String,
}

/// The answer to a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Granted: a lease, or units added to the holder's loan.
    Granted {
        /// The lease id, to release or renew (a loan's id stays as it grows).
        id: u64,
        /// When it expires unless renewed.
        expires_at: Nanos,
        /// Units added by this grant (at least one).
        units: u64,
        /// How many idle units the holder may keep rather than give back.
        keep: u64,
    },
    /// The holder's loan renewed, nothing added ([`Ask::RenewLoan`]).
    Renewed {
        /// The loan's id.
        id: u64,
        /// When it expires unless renewed again.
        expires_at: Nanos,
        /// How many idle units the holder may keep rather than give back.
        keep: u64,
    },
    /// The bucket's limit is in use (lent units included).
    Full,
    /// The owner tracks `max_buckets` buckets already and this one is new.
    TooManyBuckets,
}

/// What a grant or a renewal leaves the holder: the lease's id and expiry, the units this
/// answer added (none for a renewal) and how many idle units it may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The lease's (or loan's) id.
    pub id: u64,
    /// When it expires unless renewed.
    pub expires_at: Nanos,
    /// Units this answer added: none for a renewal.
    pub added: u64,
    /// How many idle units the holder may keep rather than give back.
    pub keep: u64,
}

impl Grant {
    /// The terms a grant or a renewal leaves; `None` for a refusal.
    pub fn terms(&self) -> Option<Terms> {
        match *self {
            Grant::Granted {
                id,
                expires_at,
                units,
                keep,
            } => Some(Terms {
                id,
                expires_at,
                added: units,
                keep,
            }),
            Grant::Renewed {
                id,
                expires_at,
                keep,
            } => Some(Terms {
                id,
                expires_at,
                added: 0,
                keep,
            }),
            Grant::Full | Grant::TooManyBuckets => None,
        }
    }
}

#[derive(Debug, Default)]
struct Bucket {
    leases: Vec<PoolLease>,
    /// Units of `leases`, expired ones included until they are pruned.
    units: u64,
    /// Holders keep no idle units until then (a recall).
    recall_until: Nanos,
}

impl Bucket {
    fn prune(&mut self, now: Nanos) -> usize {
        let before = self.leases.len();
        self.leases.retain(|l| l.expires_at > now);
        self.units = self.leases.iter().map(|l| l.units).sum();
        before - self.leases.len()
    }
}

#[derive(Debug, Default)]
struct Buckets {
    /// The first id this pool numbered, and the next.
    first_id: u64,
    next_id: u64,
    buckets: HashMap<String, Bucket>,
    refused_while_lent: u64,
}

/// The most a loan grows by in one grant when `free` units are free: a quarter of them, at
/// least one while any is free.
fn block(free: u64) -> u64 {
    match free {
        0 => 0,
        free => (free / 4).max(1),
    }
}

/// The leases of every bucket this node owns; see the [module docs](self).
#[derive(Debug)]
pub struct SharedPool {
    state: Mutex<Buckets>,
    max_buckets: usize,
}

impl SharedPool {
    /// An empty pool tracking at most `max_buckets` buckets.
    pub fn new(max_buckets: usize) -> Self {
        SharedPool {
            state: Mutex::new(Buckets::default()),
            max_buckets,
        }
    }

    /// The same pool, numbering its leases from `first` on.
    pub fn with_first_id(self, first: u64) -> Self {
        let mut state = self.lock();
        (state.first_id, state.next_id) = (first, first);
        drop(state);
        self
    }

    /// Whether this pool numbered `id` (granted or adopted it), whether or not it is live now.
    pub fn issued(&self, id: u64) -> bool {
        let state = self.lock();
        (state.first_id..state.next_id).contains(&id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants `holder` a one-unit lease on `bucket` for `ttl` if fewer than `limit` units are
    /// live at `now`.
    pub fn acquire(
        &self,
        bucket: &str,
        limit: u64,
        holder: &str,
        ttl: Duration,
        now: Nanos,
    ) -> Grant {
        self.lend(&LeaseRequest::one(bucket, limit, holder, ttl, now))
    }

    /// Answers a lease request: a plain lease of one unit, or the holder's loan of the bucket
    /// grown by up to the units asked and renewed (or renewed only: `Full` if it has none),
    /// started if it has none live. A holder has one loan per
    /// bucket, so requests that race to start one grow the same. The units granted are at most
    /// a quarter of what is free (at least one while any is); none free is `Full`.
    pub fn lend(&self, request: &LeaseRequest) -> Grant {
        let (now, ttl) = (request.now, request.ttl);
        let mut state = self.lock();
        let state = &mut *state;
        if !state.buckets.contains_key(&request.bucket) {
            if state.buckets.len() >= self.max_buckets {
                // Make room by dropping buckets whose leases have all expired.
                state
                    .buckets
                    .retain(|_, b| b.leases.iter().any(|l| l.expires_at > now));
                if state.buckets.len() >= self.max_buckets {
                    return Grant::TooManyBuckets;
                }
            }
            if request.limit == 0 {
                return Grant::Full;
            }
            state
                .buckets
                .insert(request.bucket.clone(), Bucket::default());
        }
        let bucket = state.buckets.get_mut(&request.bucket).expect("present");
        let wanted = request.ask.units();
        let lend = request.ask.is_loan();
        if bucket.units.saturating_add(wanted) > request.limit {
            // Looks full: prune the expired before deciding.
            bucket.prune(now);
        }
        let free = request.limit.saturating_sub(bucket.units);
        let units = wanted.min(block(free));
        let expires_at = weir::clock::after(now, ttl);
        let loan = match lend {
            true => bucket
                .leases
                .iter()
                .position(|l| l.lent && l.holder == request.holder && l.expires_at > now),
            false => None,
        };
        if units == 0 && (loan.is_none() || wanted > 0) {
            // Loans elsewhere may hold idle units (their holders put units back without a
            // call): recall them.
            let lent_elsewhere = bucket
                .leases
                .iter()
                .any(|l| l.lent && l.holder != request.holder && l.expires_at > now);
            if lent_elsewhere && wanted > 0 {
                state.refused_while_lent += 1;
                bucket.recall_until = weir::clock::after(now, RECALL_FOR);
            }
            return Grant::Full;
        }
        let id = match loan {
            Some(i) => {
                let lease = &mut bucket.leases[i];
                lease.units += units;
                lease.expires_at = expires_at;
                lease.id
            }
            None => {
                let id = state.next_id;
                state.next_id += 1;
                bucket.leases.push(PoolLease {
                    id,
                    units,
                    lent: lend,
                    expires_at,
                    holder: request.holder.clone(),
                });
                id
            }
        };
        bucket.units += units;
        // What may lie idle is shared by every node holding a loan here: with many holders
        // each keeps less, so idle units never add up to more than a quarter of what is free.
        // (A plain lease keeps nothing; its grant does not walk the bucket's leases.)
        let keep = match lend && bucket.recall_until <= now {
            false => 0,
            true => {
                let holders = bucket
                    .leases
                    .iter()
                    .filter(|l| l.lent && l.expires_at > now)
                    .count()
                    .max(1) as u64;
                (free - units) / (4 * holders)
            }
        };
        match units {
            0 => Grant::Renewed {
                id,
                expires_at,
                keep,
            },
            units => Grant::Granted {
                id,
                expires_at,
                units,
                keep,
            },
        }
    }

    /// A rate assignment ([`assignment`](crate::assignment)) as a loan: `holder`'s one loan of
    /// `bucket` first given back down to `running` — what the holder says it runs now, having
    /// heard of a cut, so that a cut is counted here until the holder has made it — then grown
    /// towards `target` by what is free within `limit`, and renewed until `now + ttl`. Returns
    /// the loan's units after that (0: the loan ended) and when it expires. `cautious`, a loan
    /// grows by at most half of what is free: the owner has not yet seen what the nodes still
    /// forwarding need.
    pub fn assign(
        &self,
        bucket: &str,
        (limit, cautious): (u64, bool),
        holder: &str,
        (running, target): (u64, u64),
        ttl: Duration,
        now: Nanos,
    ) -> (u64, Nanos) {
        let expires_at = weir::clock::after(now, ttl);
        let mut state = self.lock();
        let state = &mut *state;
        if !state.buckets.contains_key(bucket) {
            if target == 0 || state.buckets.len() >= self.max_buckets {
                return (0, expires_at);
            }
            state.buckets.insert(bucket.to_owned(), Bucket::default());
        }
        let entry = state.buckets.get_mut(bucket).expect("present");
        entry.prune(now);
        let loan = entry
            .leases
            .iter()
            .position(|l| l.lent && l.holder == holder);
        let had = loan.map_or(0, |i| entry.leases[i].units);
        let kept = had.min(running);
        let free = limit.saturating_sub(entry.units - had + kept);
        let units = if target > kept {
            kept + (target - kept).min(if cautious { free.div_ceil(2) } else { free })
        } else {
            kept
        };
        entry.units = entry.units - had + units;
        match (loan, units) {
            (Some(i), 0) => {
                entry.leases.swap_remove(i);
            }
            (Some(i), units) => {
                entry.leases[i].units = units;
                entry.leases[i].expires_at = expires_at;
            }
            (None, 0) => {}
            (None, units) => {
                let id = state.next_id;
                state.next_id += 1;
                entry.leases.push(PoolLease {
                    id,
                    units,
                    lent: true,
                    expires_at,
                    holder: holder.to_owned(),
                });
            }
        }
        if state
            .buckets
            .get(bucket)
            .is_some_and(|b| b.leases.is_empty())
        {
            state.buckets.remove(bucket);
        }
        (units, expires_at)
    }

    /// Takes over a lease of `units` units (a loan, if `lent`) another owner granted (a handoff
    /// after the bucket moved here): it is recorded whatever the count, because it is already
    /// in use; it counts against the limit from now on. Returns its id here.
    ///
    /// A loan adopted replaces any loan the holder still has of the bucket here: a holder has
    /// one loan of a bucket (its book's), and the one it hands over is it, so another is what
    /// this owner kept of an earlier one — lent before the ring moved the bucket away and back
    /// (a partition of this owner healed), its units now counted in the loan handed over. Left
    /// beside it, the holder's requests for its loan (found by holder) would keep the old one
    /// alive while its renewals (by id) keep the new one: a unit counted here for ever that
    /// nobody holds.
    pub fn adopt(
        &self,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> u64 {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let bucket = state.buckets.entry(bucket.to_owned()).or_default();
        if lent {
            let before: u64 = bucket.leases.iter().map(|l| l.units).sum();
            bucket.leases.retain(|l| !(l.lent && l.holder == holder));
            let after: u64 = bucket.leases.iter().map(|l| l.units).sum();
            bucket.units -= before - after;
        }
        bucket.units += units;
        bucket.leases.push(PoolLease {
            id,
            units,
            lent,
            expires_at,
            holder: holder.to_owned(),
        });
        id
    }

    /// Ends a lease, every unit of it. Unknown ids (released, swept, never granted) are a
    /// no-op: false.
    pub fn release(&self, bucket: &str, id: u64) -> bool {
        self.give_back(bucket, id, u64::MAX)
    }

    /// Gives `units` units of a lease back (all of them: the lease ends). Unknown ids are a
    /// no-op: false.
    pub fn give_back(&self, bucket: &str, id: u64, units: u64) -> bool {
        let mut state = self.lock();
        let Some(b) = state.buckets.get_mut(bucket) else {
            return false;
        };
        let Some(i) = b.leases.iter().position(|l| l.id == id) else {
            return false;
        };
        let lease = &mut b.leases[i];
        let units = units.min(lease.units);
        lease.units -= units;
        b.units -= units;
        if lease.units == 0 {
            b.leases.swap_remove(i);
        }
        if b.leases.is_empty() {
            state.buckets.remove(bucket);
        }
        true
    }

    /// Extends a live lease to `now + ttl`; `None` if it is unknown or expired.
    pub fn renew(&self, bucket: &str, id: u64, ttl: Duration, now: Nanos) -> Option<Nanos> {
        let mut state = self.lock();
        let lease = state
            .buckets
            .get_mut(bucket)?
            .leases
            .iter_mut()
            .find(|l| l.id == id && l.expires_at > now)?;
        lease.expires_at = weir::clock::after(now, ttl);
        Some(lease.expires_at)
    }

    /// Drops every lease expired by `now` and every empty bucket; returns how many leases.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut state = self.lock();
        let mut dropped = 0;
        state.buckets.retain(|_, bucket| {
            dropped += bucket.prune(now);
            !bucket.leases.is_empty()
        });
        dropped
    }

    /// Live units of `bucket` at `now` (lent units included, idle or not).
    pub fn in_use(&self, bucket: &str, now: Nanos) -> usize {
        self.lock().buckets.get(bucket).map_or(0, |bucket| {
            bucket
                .leases
                .iter()
                .filter(|l| l.expires_at > now)
                .map(|l| l.units as usize)
                .sum()
        })
    }

    /// The live leases of `bucket` at `now`.
    pub fn leases_of(&self, bucket: &str, now: Nanos) -> Vec<PoolLease> {
        self.lock().buckets.get(bucket).map_or_else(Vec::new, |b| {
            b.leases
                .iter()
                .filter(|l| l.expires_at > now)
                .cloned()
                .collect()
        })
    }

    /// Live units by holding node at `now`, over every bucket: what each node has been lent.
    /// (A loan's holder is `node/book`: each of a node's loan books holds its own loans.)
    pub fn lent(&self, now: Nanos) -> BTreeMap<String, u64> {
        let mut lent = BTreeMap::new();
        for bucket in self.lock().buckets.values() {
            for lease in bucket.leases.iter().filter(|l| l.expires_at > now) {
                let node = lease.holder.split('/').next().unwrap_or_default();
                *lent.entry(node.to_owned()).or_default() += lease.units;
            }
        }
        lent
    }

    /// Requests refused while other holders had loans of the bucket: an upper bound on the
    /// refusals lending caused (some of those units were in use), counted since the start.
    pub fn refused_while_lent(&self) -> u64 {
        self.lock().refused_while_lent
    }

    /// Buckets tracked now.
    pub fn buckets(&self) -> usize {
        self.lock().buckets.len()
    }
}

#[cfg(test)]
mod tests;
