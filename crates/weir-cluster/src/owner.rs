//! The owner's side of a lease request: the ownership fence in front of the pool.
//!
//! A coordinator picks an owner with *its* view of the ring; during a membership change the
//! views of two nodes can differ. So an owner grants only for buckets its own ring says it
//! owns, and answers "not the owner" otherwise — the coordinator then treats the pool as
//! unavailable for this request (the policy's `on_unavailable` decides), rather than two nodes
//! each granting the whole shared limit for the same bucket.
//!
//! A request from a policy that must hold its ceiling (`on_unavailable = "closed"`) is
//! *fenced*: it is granted only once this node has held the bucket for one lease TTL (its
//! [`Tenure`]), so that no lease another owner granted can still be live and uncounted — and,
//! in a cluster, only while this node hears from a majority ([`Quorum`]), which adds the
//! quorum's margin to the TTL. Before that, the answer is [`TransportError::Settling`]; without
//! a majority, [`TransportError::NoMajority`] (and fenced renewals fail); the caller refuses.
//!
//! A fenced request is granted before the tenure is long enough when the [`Census`] of the
//! current ring is settled: every live member has said what it holds here, and nobody has
//! seen a member vanish without stepping down within the tenure's window.
//!
//! An unfenced request may carry a *learning period* instead: a shorter tenure (at most the
//! TTL) during which a new owner lets the leases other nodes hold be re-registered (the
//! handoff) before it grants, trading a short refusal for not granting what is already out.

use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::census::{Answer, Census, Quiet};
use crate::messages::{Ask, Fence, LeaseRequest, TransportError};
use crate::pool::{Grant, SharedPool};
use crate::quorum::Quorum;
use crate::ring::SharedRing;
use crate::tenure::{DEFAULT_PAUSE_AFTER, Tenure};

/// One node's pool behind the ownership fence.
#[derive(Debug)]
pub struct Owner {
    node_id: String,
    ring: Arc<SharedRing>,
    pool: Arc<SharedPool>,
    tenure: Tenure,
    quorum: Option<Arc<Quorum>>,
    census: Mutex<Census>,
    /// Whether this process has heard a majority yet: a node still joining has not, and
    /// losing one it never had is not being cut off.
    had_majority: AtomicBool,
}

impl Owner {
    /// Node `node_id`'s pool, fenced by its view of the ring.
    pub fn new(node_id: &str, ring: Arc<SharedRing>, pool: Arc<SharedPool>) -> Self {
        Owner {
            node_id: node_id.to_owned(),
            tenure: Tenure::new(node_id, DEFAULT_PAUSE_AFTER),
            ring,
            pool,
            quorum: None,
            census: Mutex::new(Census::new()),
            had_majority: AtomicBool::new(false),
        }
    }

    fn census(&self) -> std::sync::MutexGuard<'_, Census> {
        self.census.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fingerprint of the ring this node runs.
    pub fn fingerprint(&self) -> u64 {
        self.ring.load().fingerprint()
    }

    /// The members live now (this node among them or not): the census of the ring in force
    /// waits for their answers.
    pub fn expect(&self, live: impl IntoIterator<Item = String>) {
        let fingerprint = self.fingerprint();
        self.census().expect(fingerprint, live);
    }

    /// This process is its node's first run (its data dir held no run of its own): said in its
    /// census answers, and a census where everyone says so needs no watched window.
    pub fn first_run(&self) {
        self.census().first_run();
    }

    /// A member departed at `now`; `stepped_down`: it had stopped owning first.
    pub fn departed(&self, stepped_down: bool, now: weir::Nanos) {
        self.census().departed(stepped_down, now);
    }

    /// What this node has seen, as of `now`: for its answers to others' census.
    pub fn quiet(&self, now: weir::Nanos) -> Quiet {
        self.census().quiet(self.tenure.awake_since(now), now)
    }

    /// The live members whose answer the census of the ring in force still waits for.
    pub fn unanswered(&self) -> Vec<String> {
        let fingerprint = self.fingerprint();
        self.census().missing(fingerprint, &self.node_id)
    }

    /// Whether every live member has answered the census of the ring in force: each has
    /// handed over what that ring moved here (its leases, its cluster-scoped rate buckets).
    pub fn handed_over(&self) -> bool {
        let fingerprint = self.fingerprint();
        self.census().answered_all(&self.node_id, fingerprint)
    }

    /// Counts `member`'s answer at `now`: what it holds for this node's buckets and this node
    /// does not know (a handoff that failed, a lease of this node's previous process) is
    /// counted here until it expires. False (nothing counted) if it answered on another ring
    /// than the census counts, or has been counted on it already.
    pub fn counted(&self, member: &str, answer: &Answer, now: weir::Nanos) -> bool {
        let mut census = self.census();
        if answer.fingerprint != self.fingerprint()
            || !census.answer(member, answer.fingerprint, answer.quiet)
        {
            return false;
        }
        tracing::debug!(
            node = %self.node_id,
            member,
            held = answer.held.len(),
            "census answer counted"
        );
        for held in &answer.held {
            // A lease this pool numbered is counted here while it is live; one it no longer
            // holds has ended here (released while the answer was on its way, or expired), so
            // it is not counted again. Only what another owner granted, or this node's
            // previous process, is new.
            let known = held.owner == self.node_id && self.pool.issued(held.id);
            if !known && self.fence(&held.bucket).is_ok() {
                let expires_at = weir::clock::after(now, held.remaining);
                let id = self
                    .pool
                    .adopt(&held.bucket, member, expires_at, held.units, false);
                tracing::debug!(
                    node = %self.node_id,
                    bucket = %held.bucket,
                    member,
                    from = %held.owner,
                    was = held.id,
                    id,
                    "a lease it did not know, counted from a census answer"
                );
            }
        }
        true
    }

    /// Whether the census lets this node grant leases of `window` (TTL and margin) at `now`
    /// before its tenure is that long.
    fn census_settled(&self, window: Duration, now: weir::Nanos) -> bool {
        let (fingerprint, own) = (self.fingerprint(), self.quiet(now));
        self.census()
            .settled(&self.node_id, fingerprint, own, window)
    }

    /// Fences with `quorum` too: fenced requests need a majority (a cluster's owners; a single
    /// node or a fixed membership has none).
    pub fn with_quorum(mut self, quorum: Arc<Quorum>) -> Self {
        self.quorum = Some(quorum);
        self
    }

    /// `NoMajority` if this node has a quorum and does not hear from a majority at `now`.
    fn check_majority(&self, now: weir::Nanos) -> Result<(), TransportError> {
        let Some(quorum) = &self.quorum else {
            return Ok(());
        };
        let majority = quorum.majority(now);
        match majority.holds() {
            true => Ok(()),
            false => Err(TransportError::NoMajority {
                owner: self.node_id.clone(),
                heard: majority.heard,
                known: majority.known,
            }),
        }
    }

    /// A beat of this node's clock: keeps its [`Tenure`] current (the rings it sees, and any
    /// pause of its own). Call it every 100 ms or so.
    ///
    /// While this node hears no majority its tenure of every bucket restarts at each beat: cut
    /// off, it may have had its buckets given to an owner on the majority's side, which granted
    /// on them, though its own ring never moved them. Once it hears a majority again it waits
    /// a tenure like a new owner, so the leases the interim owner granted have expired (or been
    /// handed over) before it grants beside them (`docs/guarantees.md`, the heal).
    ///
    /// Nor may a census cut that wait short: cut off, this node's ring may hold no one but
    /// itself, whose census is answered at once, and the members that granted in the meantime
    /// are not on it to say so. So being cut off after having heard a majority counts as an
    /// unclean departure at every beat, and the census is not quiet until a whole window after
    /// the heal.
    pub fn beat(&self, now: weir::Nanos) {
        match self.check_majority(now) {
            Ok(()) => self.had_majority.store(true, Relaxed),
            Err(_) => {
                self.tenure.restart(now);
                if self.had_majority.load(Relaxed) {
                    self.census().departed(false, now);
                }
            }
        }
        self.tenure.observe(&self.ring, now);
    }

    /// How long this node has owned `bucket` without a gap or a pause of its own, as of `now`;
    /// `None` if it does not own it.
    pub fn held_for(&self, bucket: &str, now: weir::Nanos) -> Option<std::time::Duration> {
        let since = self.tenure.held_since(bucket, &self.ring, now)?;
        Some(std::time::Duration::from_nanos(now.saturating_sub(since)))
    }

    /// How long this node has seen no other ring and no pause of its own, as of `now`: the
    /// shortest time it has held any bucket it owns.
    pub fn ring_unchanged_for(&self, now: weir::Nanos) -> std::time::Duration {
        let since = self.tenure.unchanged_since(&self.ring, now);
        std::time::Duration::from_nanos(now.saturating_sub(since))
    }

    /// Grants a lease if this node owns the bucket in its own view of the ring — and, for a
    /// fenced request, has held it for the request's TTL or has a settled census.
    pub fn grant(&self, request: &LeaseRequest) -> Result<Grant, TransportError> {
        self.fence(&request.bucket)?;
        let tenure = match (request.ask, request.fence) {
            // A loan's renewal adds nothing: like a lease's, it waits for no tenure (a loan
            // handed over here must be renewable at once), but a fenced one needs a majority.
            (Ask::RenewLoan, Fence::Closed) => {
                self.check_majority(request.now)?;
                Duration::ZERO
            }
            (Ask::RenewLoan, Fence::Learning(_)) => Duration::ZERO,
            (_, Fence::Closed) => {
                self.check_majority(request.now)?;
                let margin = self.quorum.as_ref().map_or(Duration::ZERO, |q| q.margin());
                request.ttl.saturating_add(margin)
            }
            (_, Fence::Learning(learning)) => learning,
        };
        if !tenure.is_zero() {
            let wait = self
                .tenure
                .wait(&request.bucket, tenure, &self.ring, request.now)
                .ok_or_else(|| TransportError::NotOwner(self.node_id.clone()))?;
            // A learning period waits for handoffs too: a settled census has them all.
            if !wait.is_zero() && !self.census_settled(tenure, request.now) {
                return Err(TransportError::Settling {
                    owner: self.node_id.clone(),
                    wait,
                });
            }
        }
        Ok(self.pool.lend(request))
    }

    /// Takes over a lease of `units` units (a loan, if `lent`) granted by the bucket's
    /// previous owner, if this node owns the bucket now; returns its id here.
    pub fn adopt(
        &self,
        bucket: &str,
        holder: &str,
        expires_at: weir::Nanos,
        units: u64,
        lent: bool,
    ) -> Result<u64, TransportError> {
        self.fence(bucket)?;
        let id = self.pool.adopt(bucket, holder, expires_at, units, lent);
        tracing::debug!(
            node = %self.node_id,
            bucket,
            holder,
            id,
            units,
            "a lease adopted in a handoff"
        );
        Ok(id)
    }

    /// Takes `units` idle units of a loan back (whoever owns the bucket now, as a release).
    pub fn give_back(&self, bucket: &str, lease: u64, units: u64) {
        self.pool.give_back(bucket, lease, units);
    }

    /// Extends a live lease to `now + ttl`; false if it is unknown or expired here, or if the
    /// renewal is fenced and this node does not hear from a majority (a cut-off owner must let
    /// its leases run out, or the other side's new owner would grant over them).
    pub fn renew(
        &self,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: weir::Nanos,
        fenced: bool,
    ) -> bool {
        if fenced && self.check_majority(now).is_err() {
            return false;
        }
        self.pool.renew(bucket, lease, ttl, now).is_some()
    }

    /// Releases a lease (whoever owns the bucket now: a release is never refused).
    pub fn release(&self, bucket: &str, lease: u64) {
        self.pool.release(bucket, lease);
    }

    /// Lease `lease` of `bucket`, granted here, now lives with the bucket's new owner: it ends
    /// here, unless this node's own ring still names it the owner. Then the holder's ring is
    /// ahead of this node's, which may still grant; freeing the units in use would let it
    /// grant them again while the new owner counts them too. So they stay counted here until
    /// the lease expires (it is renewed on the new owner only), and only a loan's `idle` units
    /// come back.
    pub fn moved_away(&self, bucket: &str, lease: u64, idle: u64) {
        let still_owner = self.fence(bucket).is_ok();
        tracing::debug!(
            node = %self.node_id,
            bucket,
            lease,
            still_owner,
            "a lease moved to the bucket's new owner"
        );
        match still_owner {
            true if idle > 0 => {
                self.pool.give_back(bucket, lease, idle);
            }
            true => {}
            false => {
                self.pool.release(bucket, lease);
            }
        }
    }

    /// `NotOwner` unless this node's own ring names it `bucket`'s owner.
    fn fence(&self, bucket: &str) -> Result<(), TransportError> {
        match self.ring.is_owner(bucket, &self.node_id) {
            true => Ok(()),
            false => Err(TransportError::NotOwner(self.node_id.clone())),
        }
    }
}

#[cfg(test)]
mod tests;
