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
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | `TwoTier`: its settings, the node tier, the shared tier's entry |
//! | `lease.rs` | a lease per request: asked of the owner, held, released, renewed, expired |
//! | `lent.rs` | loans: units taken with no call, and the upkeep the loan book owes |
//! | `refusal.rs` | why a request was refused; the owner unavailable or settling (`on_unavailable`, the fence) |
//! | `rehome.rs` | the handoff of leases and loans after a ring change |

mod lease;
mod lent;
mod refusal;
mod rehome;

pub use refusal::{ClusterRefusal, RefusalReason};

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::keyed::{KeyedLimiter, Overflow, Shape, Taken};
use weir::policy::OnUnavailable;
use weir::{Clock, Nanos};

use crate::loan::{self, LoanBook, Moved, Owed, Unit};
use crate::messages::{Ask, Fence};
use crate::owner::Owner;
use crate::pool::Grant;
use crate::ring::SharedRing;
use crate::transport::{Adoption, BoxFuture, LeaseRequest, Renewal, Transport, TransportError};

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
            loan_holder: format!("{node_id}/{:016x}", lent::book_number()),
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

    /// How long a lease (or a loan, which must outlast the units taken from it) lives.
    fn ttl(&self) -> Duration {
        match self.lends() {
            true => self.config.lease_ttl.saturating_add(loan::LOAN_MARGIN),
            false => self.config.lease_ttl,
        }
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
}
