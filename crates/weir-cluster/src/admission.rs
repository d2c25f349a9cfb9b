//! Two-tier admission: the coordinator's side of a cluster-wide concurrency ceiling.
//!
//! A request for a bucket is first tried against this node's own tier (a concurrency limit of
//! `node_limit` per bucket, when `node_limit > 0`). Only when that is full does the coordinator
//! ask the bucket's owner — named by the ring — for a lease from the shared pool of
//! `shared_limit`: no network hop when this node is the owner. So across `N` coordinators at
//! most `node_limit × N + shared_limit` requests per bucket are in flight.
//!
//! A coordinator remembers the shared leases it holds. When the ring changes, [`TwoTier::rehome`]
//! hands each lease whose bucket moved over to the bucket's new owner, so the new owner counts
//! it and a rebalance does not double the ceiling.
//!
//! When the owner cannot be asked (the ring is empty, the owner is unreachable or too slow, or
//! it says it is not the owner), the policy's `on_unavailable` decides: `open` admits and counts
//! a fail-open, `closed` refuses ("could not check its shared limit"), and `local_share` admits
//! at most `ceil(shared_limit / N)` extra on this node — a bounded fail-open.
//!
//! A `closed` policy's requests are *fenced*: its owner grants only once it has held the bucket
//! for one lease TTL (see [`tenure`](crate::tenure)), and until then the refusal says when it
//! will (`retry_after`). The other modes are not fenced; they may have a *learning period*
//! instead (`learning_period`, at most the TTL): a new owner grants only once it has held the
//! bucket that long, so that the handoff of the leases other nodes hold reaches it first —
//! until then, a refusal with `retry_after` too (not a fail-open: the owner answered).
//!
//! With `max_loan > 1` the shared tier costs no call in steady state: the owner lends this node
//! a block of units, which requests take and put back here, and [`TwoTier::upkeep`] renews
//! and trims (see [`loan`]). A handoff moves a loan's units in use to the new
//! owner whole.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::keyed::{KeyedLimiter, Overflow, Shape, Taken};
use weir::policy::OnUnavailable;
use weir::{Clock, Nanos};

use crate::loan::{self, Ask, LoanBook, Moved, Owed, Unit};
use crate::owner::Owner;
use crate::pool::Grant;
use crate::ring::SharedRing;
use crate::transport::{BoxFuture, LeaseRequest, Transport, TransportError};

/// A bucket's cluster-wide concurrency settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TwoTierConfig {
    /// In flight per bucket on each node (0: no node tier).
    pub node_limit: u64,
    /// In flight per bucket across the cluster, beyond the node tiers.
    pub shared_limit: u64,
    /// How long a shared lease lives unless renewed.
    pub lease_ttl: Duration,
    /// What to do when the owner cannot be asked.
    pub on_unavailable: OnUnavailable,
    /// How long to wait for the owner's answer.
    pub acquire_timeout: Duration,
    /// Most buckets tracked by the node tier.
    pub max_keys: usize,
    /// Most units a bucket's owner lends this node at once, for requests to take with no call
    /// (1: one lease per request, asked of the owner each time).
    pub max_loan: u64,
    /// Unfenced policies: how long a bucket's new owner waits for the leases other nodes hold
    /// to be handed over before it grants (zero: it grants at once; fenced policies wait a
    /// lease TTL whatever this says).
    pub learning_period: Duration,
}

/// Which tier admitted a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// This node's own tier.
    Node,
    /// A lease from the bucket's shared pool.
    Shared,
    /// The owner could not be asked; admitted anyway (`on_unavailable = "open"`).
    FailOpen,
    /// The owner could not be asked; admitted within this node's share of the pool.
    LocalShare,
}

/// What an admission holds until it is released.
#[derive(Debug)]
enum Holding {
    Permit(#[allow(dead_code)] Taken),
    /// A shared lease, by its handle in the coordinator's registry.
    Lease(u64),
    /// A unit of a loan.
    Unit(Unit),
    Nothing,
}

/// A shared lease held by this coordinator, to renew it (see [`ClusterAdmission::shared`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLease(Shared);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Shared {
    Lease(u64),
    Unit(Unit),
}

/// An admitted request. Hand it back to [`TwoTier::release`] when the request is done. A lost
/// release of a lease expires with the lease's TTL; a unit of a loan has no expiry of its own
/// (its loan lives while this node renews it), so whoever holds it must release it, also when
/// it gives up on it (the server's lease sweep does).
#[derive(Debug)]
#[must_use = "release the admission when the request is done"]
pub struct ClusterAdmission {
    /// The tier that admitted it.
    pub tier: Tier,
    hold: Holding,
}

impl ClusterAdmission {
    /// The shared lease it holds, if it holds one (to [`TwoTier::renew`] it).
    pub fn shared(&self) -> Option<SharedLease> {
        match &self.hold {
            Holding::Lease(handle) => Some(SharedLease(Shared::Lease(*handle))),
            Holding::Unit(unit) => Some(SharedLease(Shared::Unit(unit.clone()))),
            Holding::Permit(_) | Holding::Nothing => None,
        }
    }
}

/// The name of a concurrency policy's shared-pool bucket on the ring and on its owner: the
/// policy and the key, so that two policies limiting the same key count apart (a rate
/// bucket's name, [`bucket_of`](crate::rates::bucket_of), is apart from both).
pub fn shared_bucket_of(policy: &str, key: &str) -> String {
    format!("{policy}\u{0}{key}")
}

/// Why a request was refused: the two-tier refusal reasons a 429 carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bucket `{bucket}` {reason}")]
pub struct ClusterRefusal {
    /// The bucket.
    pub bucket: String,
    /// Why, typed; its text is the sentence a 429 carries.
    pub reason: RefusalReason,
    /// When the request could succeed, if that is known (the owner is settling into the
    /// bucket and said when it will grant).
    pub retry_after: Option<Duration>,
}

/// Why the two tiers refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// The limits were reached: the node tier's (if it has one) and the shared pool's.
    Full {
        /// The per-node limit (0: no node tier).
        node_limit: u64,
        /// The shared limit (0: no shared pool).
        shared_limit: u64,
    },
    /// The shared limit could not be checked, and the policy refuses then (`closed`).
    Unchecked {
        /// The shared limit.
        shared_limit: u64,
        /// What the owner answered, if it answered (it is settling into the bucket, or does
        /// not hear from a majority).
        owner_said: Option<String>,
    },
    /// The shared limit could not be checked, and this node's share of it (`local_share`) is
    /// in use.
    ShareInUse {
        /// The shared limit.
        shared_limit: u64,
        /// This node's share of it.
        share: u64,
    },
}

impl RefusalReason {
    /// Whether the limits were reached (rather than the shared one could not be checked).
    pub fn is_full(&self) -> bool {
        matches!(self, RefusalReason::Full { .. })
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RefusalReason::Full {
                node_limit: n,
                shared_limit: m,
            } => match (n > 0, m > 0) {
                (true, true) => {
                    write!(
                        f,
                        "reached its per-node limit of {n} and its shared limit of {m}"
                    )
                }
                (true, false) => write!(f, "reached its per-node limit of {n}"),
                (false, _) => write!(f, "reached its shared limit of {m}"),
            },
            RefusalReason::Unchecked {
                shared_limit,
                ref owner_said,
            } => {
                write!(f, "could not check its shared limit of {shared_limit}")?;
                match owner_said {
                    Some(said) => write!(f, ": {said}"),
                    None => Ok(()),
                }
            }
            RefusalReason::ShareInUse {
                shared_limit,
                share,
            } => write!(
                f,
                "could not check its shared limit of {shared_limit}, and this node's share of it ({share}) is in use"
            ),
        }
    }
}

/// A shared lease this coordinator holds: where it lives now.
#[derive(Debug, Clone)]
struct HeldLease {
    bucket: String,
    owner: String,
    id: u64,
    expires_at: Nanos,
}

/// Counters of what admission did.
#[derive(Debug, Default)]
pub struct AdmissionCounters {
    /// Leases granted by owners.
    pub shared: AtomicU64,
    /// Fail-opens (`on_unavailable = "open"`).
    pub fail_open: AtomicU64,
    /// Admissions within the local share.
    pub local_share: AtomicU64,
    /// Times the owner could not be asked.
    pub unavailable: AtomicU64,
    /// Leases handed over to a bucket's new owner.
    pub handed_off: AtomicU64,
    /// Grants returned because the ring moved their bucket while they were on the way.
    pub raced: AtomicU64,
    /// Fenced requests refused: the owner took the bucket over too recently, or does not hear
    /// from a majority.
    pub fenced: AtomicU64,
    /// Shared admissions on a unit lent to this node, with no call (counted in `shared` too).
    pub from_loan: AtomicU64,
    /// Unfenced requests refused because the bucket's owner was in its learning period.
    pub learning: AtomicU64,
    /// Lent units given back to their owners.
    pub given_back: AtomicU64,
}

/// The coordinator side of two-tier admission; see the [module docs](self).
pub struct TwoTier<C: Clock + Clone, T: Transport> {
    node_id: String,
    config: TwoTierConfig,
    ring: Arc<SharedRing>,
    transport: Arc<T>,
    /// This node as an owner, for the buckets it owns.
    owner: Arc<Owner>,
    node_tier: Option<KeyedLimiter<C>>,
    local_share: KeyedLimiter<C>,
    clock: C,
    /// The shared leases held, by handle.
    held: Mutex<HashMap<u64, HeldLease>>,
    next_handle: AtomicU64,
    /// The units owners lent this node (with `max_loan > 1`).
    book: Mutex<LoanBook>,
    /// Who holds this coordinator's loans on their owners: the node, and a number drawn for
    /// this book, so that another book of the node (another policy with a bucket of the same
    /// name, the policy's next version, the process after a restart) never grows its loans.
    loan_holder: String,
    /// What admission did.
    pub counters: AdmissionCounters,
}

impl<C: Clock + Clone, T: Transport> std::fmt::Debug for TwoTier<C, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwoTier")
            .field("node_id", &self.node_id)
            .field("config", &self.config)
            .finish()
    }
}

/// A number for a new loan book, different from every other book's with near certainty (drawn
/// from the standard library's per-process random hash keys, and a counter).
fn book_number() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static BOOKS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(BOOKS.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// A unit taken for a request that is not yet the caller's: put back if the caller goes away
/// first.
struct Handing<'a, C: Clock + Clone, T: Transport> {
    tier: &'a TwoTier<C, T>,
    unit: Option<Unit>,
}

impl<C: Clock + Clone, T: Transport> Drop for Handing<'_, C, T> {
    fn drop(&mut self) {
        if let Some(unit) = self.unit.take() {
            // What it owes (idle units beyond `keep`) goes back with the next upkeep.
            let _ = self.tier.book().put_back(&unit);
        }
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

impl<C: Clock + Clone, T: Transport> TwoTier<C, T> {
    /// Admission on node `node_id`, which is `owner` for the buckets it owns, reaching other
    /// owners over `transport`.
    pub fn new(
        node_id: &str,
        config: TwoTierConfig,
        ring: Arc<SharedRing>,
        transport: Arc<T>,
        owner: Arc<Owner>,
        clock: C,
    ) -> Self {
        let node_tier = (config.node_limit > 0).then(|| {
            KeyedLimiter::new(
                Shape::Concurrency {
                    limit: config.node_limit,
                },
                config.max_keys,
                Overflow::Shared,
                clock.clone(),
            )
        });
        let members = ring.load().members().len() as u64;
        let local_share = KeyedLimiter::new(
            Shape::Concurrency {
                limit: ceil_div(config.shared_limit, members),
            },
            config.max_keys,
            Overflow::Shared,
            clock.clone(),
        );
        TwoTier {
            node_id: node_id.to_owned(),
            book: Mutex::new(LoanBook::new(config.max_loan)),
            loan_holder: format!("{node_id}/{:016x}", book_number()),
            config,
            ring,
            transport,
            owner,
            node_tier,
            local_share,
            clock,
            held: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(0),
            counters: AdmissionCounters::default(),
        }
    }

    fn refusal(&self, bucket: &str, reason: RefusalReason) -> ClusterRefusal {
        ClusterRefusal {
            bucket: bucket.to_owned(),
            reason,
            retry_after: None,
        }
    }

    fn full(&self) -> RefusalReason {
        RefusalReason::Full {
            node_limit: self.config.node_limit,
            shared_limit: self.config.shared_limit,
        }
    }

    /// Admits a request for `bucket`, or says why not.
    pub async fn acquire(&self, bucket: &str) -> Result<ClusterAdmission, ClusterRefusal> {
        if let Some(node_tier) = &self.node_tier
            && let Ok(grant) = node_tier.try_acquire(bucket, 1)
        {
            return Ok(ClusterAdmission {
                tier: Tier::Node,
                hold: Holding::Permit(grant.taken),
            });
        }
        if self.config.shared_limit == 0 {
            return Err(self.refusal(bucket, self.full()));
        }
        if self.lends() {
            return self.acquire_lent(bucket).await;
        }
        self.acquire_lease(bucket).await
    }

    /// The shared tier without loans: a lease from the bucket's owner.
    async fn acquire_lease(&self, bucket: &str) -> Result<ClusterAdmission, ClusterRefusal> {
        // A grant that comes back after the ring moved the bucket is returned and asked for
        // again of the new owner: the handoff of that change may already have run without it,
        // and the new owner would not count it. Twice in a row means the ring is churning.
        for _ in 0..2 {
            let ring = self.ring.load();
            let Some(owner) = ring.owner_of(bucket) else {
                return self.unavailable(bucket, ring.members().len());
            };
            let grant = self.ask_owner(bucket, owner, Ask::ONE).await;
            match grant {
                Ok(Grant::Granted { id, expires_at, .. }) => {
                    // Checked and recorded under the registry's lock: `rehome` loads the ring
                    // before it takes that lock, so it either sees this lease or this check
                    // sees its ring.
                    let handle = {
                        let mut held = self.held_leases();
                        self.ring.is_owner(bucket, owner).then(|| {
                            let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
                            held.insert(
                                handle,
                                HeldLease {
                                    bucket: bucket.to_owned(),
                                    owner: owner.to_owned(),
                                    id,
                                    expires_at,
                                },
                            );
                            handle
                        })
                    };
                    let Some(handle) = handle else {
                        self.counters.raced.fetch_add(1, Ordering::Relaxed);
                        self.release_lease(owner, bucket, id).await;
                        continue;
                    };
                    self.counters.shared.fetch_add(1, Ordering::Relaxed);
                    return Ok(ClusterAdmission {
                        tier: Tier::Shared,
                        hold: Holding::Lease(handle),
                    });
                }
                answer => return self.not_granted(bucket, answer, ring.members().len()),
            }
        }
        let members = self.ring.load().members().len();
        self.unavailable(bucket, members)
    }

    /// Whether this policy's owners lend blocks of units (`max_loan > 1`).
    fn lends(&self) -> bool {
        self.config.max_loan > 1
    }

    /// The shared tier with loans: a unit lent to this node if one is free, else the loan
    /// grown by asking the owner (see [`loan`]).
    async fn acquire_lent(&self, bucket: &str) -> Result<ClusterAdmission, ClusterRefusal> {
        for _ in 0..2 {
            let ring = self.ring.load();
            let Some(owner) = ring.owner_of(bucket) else {
                return self.unavailable(bucket, ring.members().len());
            };
            let now = self.clock.now();
            // A unit must not outlive its loan: the loan has at least a lease TTL left.
            let hold_until = weir::clock::after(now, self.config.lease_ttl);
            let ask = {
                let mut book = self.book();
                if let Some(unit) = book.take(bucket, owner, hold_until, now) {
                    return Ok(self.lent_unit(unit, true));
                }
                if book.moving(bucket, owner) {
                    None
                } else {
                    Some(book.ask(bucket, owner, hold_until))
                }
            };
            let Some(ask) = ask else {
                // The ring moved this bucket and the handoff has yet to move its loan.
                drop(ring);
                return Box::pin(self.acquire_lease(bucket)).await;
            };
            match self.ask_owner(bucket, owner, ask).await {
                Ok(Grant::Granted {
                    id,
                    expires_at,
                    units,
                    keep,
                }) => {
                    // As for a lease: checked and recorded under the book's lock, which
                    // `rehome` takes after loading the ring.
                    let (unit, owed) = {
                        let mut book = self.book();
                        match self.ring.is_owner(bucket, owner) {
                            true => {
                                let owed = book.granted(bucket, owner, id, units, keep, expires_at);
                                (book.take(bucket, owner, hold_until, now), owed)
                            }
                            false => {
                                self.counters.raced.fetch_add(1, Ordering::Relaxed);
                                // Only what this grant added: the loan, if it was there
                                // before, is the handoff's to move.
                                let owed = (units > 0).then(|| Owed::GiveBack {
                                    bucket: bucket.to_owned(),
                                    owner: owner.to_owned(),
                                    id,
                                    units,
                                });
                                (None, owed)
                            }
                        }
                    };
                    // Should the caller go away while the owed call is made, the unit goes
                    // back to the loan rather than stay in use for ever.
                    let mut handing = Handing { tier: self, unit };
                    if let Some(owed) = owed {
                        self.pay(owed).await;
                    }
                    if let Some(unit) = handing.unit.take() {
                        return Ok(self.lent_unit(unit, false));
                    }
                    // Taken by racing requests, or the ring moved: once more.
                }
                Ok(Grant::Full) if ask == Ask::RENEW => {
                    // The owner no longer has the loan (its renewals failed for too long): it
                    // lends nothing more, and the next try starts another.
                    let mut book = self.book();
                    if let Some(id) = book.loan_id(bucket, owner) {
                        book.gone(bucket, owner, id);
                    }
                }
                answer => return self.not_granted(bucket, answer, ring.members().len()),
            }
        }
        Err(self.refusal(bucket, self.full()))
    }

    /// A shared admission on a lent unit.
    fn lent_unit(&self, unit: Unit, no_call: bool) -> ClusterAdmission {
        self.counters.shared.fetch_add(1, Ordering::Relaxed);
        if no_call {
            self.counters.from_loan.fetch_add(1, Ordering::Relaxed);
        }
        ClusterAdmission {
            tier: Tier::Shared,
            hold: Holding::Unit(unit),
        }
    }

    /// An owner's answer other than a grant: full, fenced out, or the owner could not be
    /// asked (the policy's `on_unavailable` decides).
    fn not_granted(
        &self,
        bucket: &str,
        answer: Result<Grant, TransportError>,
        members: usize,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        match answer {
            Ok(Grant::Full) => Err(self.refusal(bucket, self.full())),
            Err(error @ TransportError::Settling { wait, .. }) => {
                self.fenced_out(bucket, &error, Some(wait))
            }
            Err(error @ TransportError::NoMajority { .. }) => self.fenced_out(bucket, &error, None),
            Ok(Grant::Granted { .. } | Grant::TooManyBuckets) | Err(_) => {
                self.unavailable(bucket, members)
            }
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, LoanBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a lease (or a loan, which must outlast the units taken from it) lives.
    fn ttl(&self) -> Duration {
        match self.lends() {
            true => self.config.lease_ttl.saturating_add(loan::LOAN_MARGIN),
            false => self.config.lease_ttl,
        }
    }

    /// Asks `owner` for a lease on `bucket` (or for a loan to grow, or be renewed): this
    /// node's own pool without a hop, else one call bounded by the acquire timeout.
    async fn ask_owner(
        &self,
        bucket: &str,
        owner: &str,
        ask: Ask,
    ) -> Result<Grant, TransportError> {
        let request = LeaseRequest {
            bucket: bucket.to_owned(),
            limit: self.config.shared_limit,
            holder: match ask.lend {
                true => self.loan_holder.clone(),
                false => self.node_id.clone(),
            },
            ttl: self.ttl(),
            now: self.clock.now(),
            fenced: self.fenced(),
            units: ask.units,
            lend: ask.lend,
            learning: match self.fenced() {
                true => Duration::ZERO,
                false => self.config.learning_period,
            },
        };
        if owner == self.node_id {
            return self.owner.grant(&request);
        }
        tokio::time::timeout(
            self.config.acquire_timeout,
            self.transport.acquire(owner, request),
        )
        .await
        .unwrap_or_else(|_| Err(TransportError::Unreachable(owner.to_owned())))
    }

    /// Whether this policy's requests are fenced: it must hold its ceiling.
    fn fenced(&self) -> bool {
        self.config.on_unavailable == OnUnavailable::Closed
    }

    /// A call to an owner, bounded by the acquire timeout; `None` if it failed or timed out.
    async fn call<R>(&self, call: BoxFuture<'_, Result<R, TransportError>>) -> Option<R> {
        tokio::time::timeout(self.config.acquire_timeout, call)
            .await
            .ok()?
            .ok()
    }

    /// A request the owner would not grant yet (it is settling into the bucket — its tenure, or
    /// an unfenced policy's learning period — or does not hear from a majority): refused,
    /// saying why and, if known, when to come back.
    fn fenced_out(
        &self,
        bucket: &str,
        error: &TransportError,
        wait: Option<Duration>,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        match self.fenced() {
            true => self.counters.fenced.fetch_add(1, Ordering::Relaxed),
            false => self.counters.learning.fetch_add(1, Ordering::Relaxed),
        };
        Err(ClusterRefusal {
            retry_after: wait,
            ..self.refusal(
                bucket,
                RefusalReason::Unchecked {
                    shared_limit: self.config.shared_limit,
                    owner_said: Some(error.to_string()),
                },
            )
        })
    }

    /// The owner could not be asked: the policy's `on_unavailable` decides.
    fn unavailable(
        &self,
        bucket: &str,
        members: usize,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        let m = self.config.shared_limit;
        match self.config.on_unavailable {
            OnUnavailable::Open => {
                self.counters.fail_open.fetch_add(1, Ordering::Relaxed);
                Ok(ClusterAdmission {
                    tier: Tier::FailOpen,
                    hold: Holding::Nothing,
                })
            }
            OnUnavailable::Closed => Err(self.refusal(
                bucket,
                RefusalReason::Unchecked {
                    shared_limit: m,
                    owner_said: None,
                },
            )),
            OnUnavailable::LocalShare => {
                let share = ceil_div(m, members as u64);
                let shape = Shape::Concurrency { limit: share };
                // The share follows the ring's size; reshaping walks the keys, so only on change.
                if self.local_share.shape() != shape {
                    self.local_share.reshape(shape);
                }
                match self.local_share.try_acquire(bucket, 1) {
                    Ok(grant) => {
                        self.counters.local_share.fetch_add(1, Ordering::Relaxed);
                        Ok(ClusterAdmission {
                            tier: Tier::LocalShare,
                            hold: Holding::Permit(grant.taken),
                        })
                    }
                    Err(_) => Err(self.refusal(
                        bucket,
                        RefusalReason::ShareInUse {
                            shared_limit: m,
                            share,
                        },
                    )),
                }
            }
        }
    }

    fn held_leases(&self) -> std::sync::MutexGuard<'_, HashMap<u64, HeldLease>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Releases a lease where it lives: on this node's pool, or with one call to its owner (if
    /// that call fails, the lease expires with its TTL).
    async fn release_lease(&self, owner: &str, bucket: &str, id: u64) {
        if owner == self.node_id {
            self.owner.release(bucket, id);
        } else {
            let _ = self.call(self.transport.release(owner, bucket, id)).await;
        }
    }

    /// Makes a call upkeep, a release or a grant owes an owner (best effort: what is not given
    /// back expires with its loan).
    async fn pay(&self, owed: Owed) {
        match owed {
            Owed::GiveBack {
                bucket,
                owner,
                id,
                units,
            } => {
                self.counters.given_back.fetch_add(units, Ordering::Relaxed);
                if owner == self.node_id {
                    self.owner.give_back(&bucket, id, units);
                } else {
                    let _ = self
                        .call(self.transport.give_back(&owner, &bucket, id, units))
                        .await;
                }
            }
            Owed::Renew { bucket, owner, id } => {
                self.renew_loan(&bucket, &owner, id).await;
            }
        }
    }

    /// Renews loan `id` of `bucket` on `owner`; gives back what the answer does not let this
    /// node keep. False if the owner no longer has it (or could not be asked).
    async fn renew_loan(&self, bucket: &str, owner: &str, id: u64) -> bool {
        match self.ask_owner(bucket, owner, Ask::RENEW).await {
            Ok(Grant::Granted {
                id: renewed,
                expires_at,
                keep,
                ..
            }) if renewed == id => {
                let owed = self.book().renewed(bucket, owner, id, keep, expires_at);
                if let Some(owed) = owed {
                    Box::pin(self.pay(owed)).await;
                }
                true
            }
            Ok(_) => {
                self.book().gone(bucket, owner, id);
                false
            }
            Err(_) => false,
        }
    }

    /// Renews this node's loans that are due and gives back what they may not keep, or what
    /// has been idle for [`loan::IDLE_AFTER`]. Call it every [`loan::UPKEEP_EVERY`] (it does
    /// nothing for a policy that does not lend).
    pub async fn upkeep(&self) {
        if !self.lends() {
            return;
        }
        let now = self.clock.now();
        // Renewed once half the margin is spent: well before a unit could outlive its loan.
        let renew_by = weir::clock::after(
            now,
            self.config.lease_ttl.saturating_add(loan::LOAN_MARGIN / 2),
        );
        let owed = self.book().upkeep(now, loan::IDLE_AFTER, renew_by);
        for owed in owed {
            self.pay(owed).await;
        }
    }

    /// Units lent to this node: loans, units, in use.
    pub fn lent(&self) -> loan::Totals {
        self.book().totals()
    }

    /// Releases what `admission` holds: its node permit, its shared lease, or its lent unit.
    pub async fn release(&self, admission: ClusterAdmission) {
        match admission.hold {
            Holding::Permit(permit) => drop(permit),
            Holding::Nothing => {}
            Holding::Unit(unit) => {
                let owed = self.book().put_back(&unit);
                if let Some(owed) = owed {
                    self.pay(owed).await;
                }
            }
            Holding::Lease(handle) => {
                let held = self.held_leases().remove(&handle);
                if let Some(lease) = held {
                    self.release_lease(&lease.owner, &lease.bucket, lease.id)
                        .await;
                }
            }
        }
    }

    /// Extends a shared lease by `ttl` on its owner; true if it was still live there.
    pub async fn renew(&self, lease: SharedLease, ttl: Duration) -> bool {
        let handle = match lease.0 {
            Shared::Lease(handle) => handle,
            Shared::Unit(unit) => {
                // The loan outlives its units by its margin; renewing it renews them all.
                let Some((owner, id)) = self.book().loan_of(&unit) else {
                    return false;
                };
                return self.renew_loan(&unit.bucket, &owner, id).await;
            }
        };
        let Some(lease) = self.held_leases().get(&handle).cloned() else {
            return false;
        };
        let now = self.clock.now();
        let fenced = self.fenced();
        let renewed = if lease.owner == self.node_id {
            self.owner.renew(&lease.bucket, lease.id, ttl, now, fenced)
        } else {
            self.call(
                self.transport
                    .renew(&lease.owner, &lease.bucket, lease.id, ttl, now, fenced),
            )
            .await
            .unwrap_or(false)
        };
        if renewed && let Some(entry) = self.held_leases().get_mut(&handle) {
            entry.expires_at = weir::clock::after(now, ttl);
        }
        renewed
    }

    /// Drops the shared leases held past their expiry (their owners have dropped them too);
    /// returns how many. Releasing an admission whose lease is gone is then a no-op.
    pub fn forget_expired(&self) -> usize {
        let now = self.clock.now();
        let mut held = self.held_leases();
        let before = held.len();
        held.retain(|_, lease| lease.expires_at > now);
        before - held.len()
    }

    /// After a ring change: hands every loan whose bucket has a new owner over to it with its
    /// units in use, and gives it back to the old one. Returns how many moved.
    async fn rehome_loans(&self) -> usize {
        let moving: Vec<Moved> = {
            let ring = self.ring.load();
            self.book()
                .moved(|bucket| ring.owner_of(bucket).map(str::to_owned))
        };
        let mut moved = 0;
        for m in moving {
            let (from, old_id) = m.from.clone();
            let give_back = Owed::GiveBack {
                bucket: m.bucket.clone(),
                owner: from.clone(),
                id: old_id,
                units: m.units,
            };
            if m.in_use == 0 {
                self.book().forget(&m);
                self.pay(give_back).await;
                continue;
            }
            let adopted = if m.to == self.node_id {
                self.owner
                    .adopt(&m.bucket, &self.loan_holder, m.expires_at, m.in_use, true)
                    .ok()
            } else {
                self.call(self.transport.adopt(
                    &m.to,
                    &m.bucket,
                    &self.loan_holder,
                    m.expires_at,
                    m.in_use,
                    true,
                ))
                .await
            };
            let Some(id) = adopted else { continue };
            let rehomed = self.book().rehomed(&m, id);
            self.pay(give_back).await;
            if rehomed {
                moved += 1;
            } else {
                self.release_lease(&m.to, &m.bucket, id).await;
            }
        }
        moved
    }

    /// After a ring change: hands every held lease (and loan) whose bucket has a new owner over
    /// to it (and releases it at the old one, best effort). Returns how many moved. A lease
    /// that cannot be handed over stays where it is and expires there.
    pub async fn rehome(&self) -> usize {
        let loans = self.rehome_loans().await;
        let ring = self.ring.load();
        self.forget_expired();
        let moving: Vec<(u64, HeldLease, String)> = {
            let held = self.held_leases();
            held.iter()
                .filter_map(|(&handle, lease)| {
                    let owner = ring.owner_of(&lease.bucket)?;
                    (owner != lease.owner).then(|| (handle, lease.clone(), owner.to_owned()))
                })
                .collect()
        };
        let mut moved = 0;
        for (handle, lease, new_owner) in moving {
            let adopted = if new_owner == self.node_id {
                self.owner
                    .adopt(&lease.bucket, &self.node_id, lease.expires_at, 1, false)
                    .ok()
            } else {
                self.call(self.transport.adopt(
                    &new_owner,
                    &lease.bucket,
                    &self.node_id,
                    lease.expires_at,
                    1,
                    false,
                ))
                .await
            };
            let Some(id) = adopted else { continue };
            let still_held = match self.held_leases().get_mut(&handle) {
                Some(entry) => {
                    entry.owner = new_owner.clone();
                    entry.id = id;
                    true
                }
                None => false,
            };
            if still_held {
                self.release_lease(&lease.owner, &lease.bucket, lease.id)
                    .await;
                moved += 1;
            } else {
                // Released while it was being handed over: give back the adopted copy too.
                self.release_lease(&new_owner, &lease.bucket, id).await;
            }
        }
        let moved = moved + loans;
        self.counters
            .handed_off
            .fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}
