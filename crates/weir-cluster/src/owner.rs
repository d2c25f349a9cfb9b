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
    pub fn beat(&self, now: weir::Nanos) {
        if self.check_majority(now).is_err() {
            self.tenure.restart(now);
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
mod tests {
    use super::*;
    use crate::ring::{DEFAULT_VNODES, Member, Ring};

    fn request(bucket: &str) -> LeaseRequest {
        LeaseRequest::one(bucket, 5, "coordinator", Duration::from_nanos(1_000), 0)
    }

    #[test]
    fn an_owner_grants_only_for_buckets_it_owns_in_its_own_view() {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1), Member::owner("b", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)));
        let (mine, theirs): (Vec<String>, Vec<String>) = (0..100)
            .map(|i| format!("bucket-{i}"))
            .partition(|b| ring.owner_of(b).as_deref() == Some("a"));
        assert!(!mine.is_empty() && !theirs.is_empty());
        assert!(matches!(
            a.grant(&request(&mine[0])),
            Ok(Grant::Granted { .. })
        ));
        assert_eq!(
            a.grant(&request(&theirs[0])),
            Err(TransportError::NotOwner("a".into()))
        );
        // When its view changes (b left), it owns everything.
        ring.publish(Ring::new([Member::owner("a", 1)], DEFAULT_VNODES, 1));
        assert!(matches!(
            a.grant(&request(&theirs[0])),
            Ok(Grant::Granted { .. })
        ));
    }

    #[test]
    fn a_fenced_request_waits_for_one_ttl_of_tenure() {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)));
        a.beat(0);
        let fenced = |now| LeaseRequest {
            fence: Fence::Closed,
            now,
            ..request("b")
        };
        assert_eq!(
            a.grant(&fenced(400)),
            Err(TransportError::Settling {
                owner: "a".into(),
                wait: Duration::from_nanos(600)
            })
        );
        assert!(
            matches!(a.grant(&request("b")), Ok(Grant::Granted { .. })),
            "an unfenced request does not wait"
        );
        assert!(matches!(a.grant(&fenced(1_000)), Ok(Grant::Granted { .. })));
    }

    #[test]
    fn without_a_majority_fenced_grants_and_renewals_are_refused() {
        use crate::quorum::Quorum;
        const S: u64 = 1_000_000_000;
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let quorum = Arc::new(Quorum::new("a", Duration::from_secs(3), false));
        let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)))
            .with_quorum(Arc::clone(&quorum));
        let fenced = |now| LeaseRequest {
            fence: Fence::Closed,
            now,
            ttl: Duration::from_secs(10),
            ..request("b")
        };
        let beat = |from: u64, to: u64, heard: bool| {
            for t in from..=to {
                // Silent, b and c stay at the beat they had at 14 s.
                let beat = u128::from(if heard { t } else { 14 });
                quorum.observe([("b", beat), ("c", beat)], t * S);
                a.beat(t * S);
            }
        };
        beat(0, 13, true);
        // The tenure is the TTL plus the quorum's margin (3 s window + 1 s).
        assert_eq!(
            a.grant(&fenced(13 * S)),
            Err(TransportError::Settling {
                owner: "a".into(),
                wait: Duration::from_secs(1)
            })
        );
        beat(14, 14, true);
        let Ok(Grant::Granted { id, .. }) = a.grant(&fenced(14 * S)) else {
            panic!("granted after ttl + margin");
        };
        // b and c fall silent after 14 s: past the 3 s window, a is cut off.
        beat(15, 17, false);
        assert!(
            a.renew("b", id, Duration::from_secs(10), 17 * S, true),
            "still a majority at 17 s"
        );
        beat(18, 18, false);
        assert_eq!(
            a.grant(&fenced(18 * S)),
            Err(TransportError::NoMajority {
                owner: "a".into(),
                heard: 1,
                known: 3
            })
        );
        assert!(
            !a.renew("b", id, Duration::from_secs(10), 18 * S, true),
            "a cut-off owner lets its fenced leases run out"
        );
        assert!(
            a.renew("b", id, Duration::from_secs(10), 18 * S, false),
            "unfenced: renewed"
        );
        assert!(matches!(a.grant(&request("b")), Ok(Grant::Granted { .. })));
        // Cut off until 20 s; heard again from 21 s. Its ring never moved the bucket, but the
        // others may have given it to an owner on their side: a waits a whole tenure again.
        beat(19, 20, false);
        beat(21, 21, true);
        assert_eq!(
            a.grant(&fenced(21 * S)),
            Err(TransportError::Settling {
                owner: "a".into(),
                wait: Duration::from_secs(13)
            })
        );
        beat(22, 34, true);
        assert!(matches!(
            a.grant(&fenced(34 * S)),
            Ok(Grant::Granted { .. })
        ));
    }

    #[test]
    fn a_settled_census_lets_a_new_owner_grant_before_its_tenure_and_counts_what_is_held() {
        use crate::census::{Answer, Held, Quiet};
        const S: u64 = 1_000_000_000;
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("b", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let pool = Arc::new(SharedPool::new(100));
        let a = Owner::new("a", Arc::clone(&ring), Arc::clone(&pool));
        for t in 0..=100 {
            a.beat(t * S);
        }
        // a joins: the bucket moves to it from b.
        ring.publish(Ring::new(
            [Member::owner("a", 1), Member::owner("b", 1)],
            DEFAULT_VNODES,
            1,
        ));
        let bucket = (0..100)
            .map(|i| format!("bucket-{i}"))
            .find(|b| ring.owner_of(b).as_deref() == Some("a"))
            .expect("a bucket of a's");
        a.beat(101 * S);
        let fenced = |now| LeaseRequest {
            fence: Fence::Closed,
            now,
            ttl: Duration::from_secs(10),
            limit: 3,
            ..request(&bucket)
        };
        let settling = |result: Result<Grant, TransportError>| {
            matches!(result, Err(TransportError::Settling { .. }))
        };
        assert!(settling(a.grant(&fenced(101 * S))));
        a.expect(["a".to_owned(), "b".to_owned()]);
        assert_eq!(a.unanswered(), vec!["b".to_owned()]);
        assert!(settling(a.grant(&fenced(101 * S))), "b has not answered");
        let answer = |fingerprint, unclean: Option<u64>| Answer {
            fingerprint,
            quiet: Quiet {
                awake: Duration::from_secs(500),
                unclean_departure: unclean.map(Duration::from_secs),
                first_run: false,
            },
            // b still holds a lease from its own pool whose handoff failed: counted here.
            held: vec![Held {
                bucket: bucket.clone(),
                owner: "b".to_owned(),
                id: 9,
                units: 2,
                remaining: Duration::from_secs(5),
            }],
        };
        assert!(
            !a.counted("b", &answer(a.fingerprint() + 1, None), 101 * S),
            "an answer on another ring"
        );
        assert_eq!(pool.in_use(&bucket, 101 * S), 0);
        assert!(a.counted("b", &answer(a.fingerprint(), None), 101 * S));
        assert!(a.unanswered().is_empty());
        assert_eq!(pool.in_use(&bucket, 101 * S), 2);
        // Granted 85 s before the tenure would have been long enough, with b's two units
        // counted against the limit of 3.
        assert!(matches!(
            a.grant(&fenced(101 * S)),
            Ok(Grant::Granted { .. })
        ));
        assert!(matches!(a.grant(&fenced(101 * S)), Ok(Grant::Full)));
        // A member that vanished without stepping down: back to the tenure.
        a.departed(false, 102 * S);
        a.beat(102 * S);
        assert!(settling(a.grant(&fenced(102 * S))));
    }

    #[test]
    fn a_census_answer_lists_nothing_twice() {
        use crate::census::{Answer, Held, Quiet};
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1)],
            DEFAULT_VNODES,
            1,
        )));
        // This process numbers its leases from 1000; its previous one numbered below.
        let pool = Arc::new(SharedPool::new(100).with_first_id(1000));
        let a = Owner::new("a", Arc::clone(&ring), Arc::clone(&pool));
        let granted = || match a.grant(&request("b")) {
            Ok(Grant::Granted { id, .. }) => id,
            other => panic!("granted: {other:?}"),
        };
        let (live, released) = (granted(), granted());
        a.release("b", released);
        let listed = |ids: &[u64]| Answer {
            fingerprint: a.fingerprint(),
            quiet: Quiet {
                awake: Duration::from_secs(1),
                unclean_departure: None,
                first_run: false,
            },
            held: ids
                .iter()
                .map(|&id| Held {
                    bucket: "b".to_owned(),
                    owner: "a".to_owned(),
                    id,
                    units: 1,
                    remaining: Duration::from_nanos(500),
                })
                .collect(),
        };
        a.expect(["a".to_owned(), "c".to_owned(), "d".to_owned()]);
        // A live lease of this pool is counted once; one it released while the answer was on
        // its way is not counted again; one of its previous process is new, and counted.
        assert!(a.counted("c", &listed(&[live, released]), 0));
        assert_eq!(pool.in_use("b", 0), 1);
        assert!(a.counted("d", &listed(&[999]), 0));
        assert_eq!(pool.in_use("b", 0), 2);
        // A member's second answer on the same ring adds nothing.
        assert!(!a.counted("d", &listed(&[998]), 0));
        assert_eq!(pool.in_use("b", 0), 2);
    }
}
