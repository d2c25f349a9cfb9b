//! One way a bucket is decided, whichever protocol asks.
//!
//! Every front door that decides a rate — HTTP and gRPC acquires, the Redis protocol's
//! `WEIR.*`, Envoy's rate limit service, a request another node forwards — asks
//! [`Decider::decide`] with the same [`Ask`] and reads the same [`Decision`]. Where the
//! policy's bucket lives is chosen in one place ([`Home::of`]): this node, the bucket's owner in
//! the cluster (within a share it assigned this node when it has), or Redis. A protocol never
//! branches on it.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`Ask`], [`Decision`], [`AdmissionTier`] and the [`Decider`] |
//! | `home.rs` | where a policy's buckets live, chosen once per decision from its config |
//! | `waiting.rs` | how long a request may wait, and whether the policy only monitors |
//! | `here.rs` | a bucket of this node's: what is lent set aside, decided in its line |
//! | `owner.rs` | a cluster-scoped bucket: within this node's assigned share, else asked of its owner |
//! | `for_others.rs` | the owner's side: a decision another node forwards, a handover, a report |
//! | `redis.rs` | a bucket kept in Redis: asked there, asked again while the request may wait |
//! | `lent.rs` | shares of this node's own buckets lent to data planes (RLQS) |
//! | `place.rs` | where a decision was made, as the counters tell it apart |
//!
//! Concurrency policies are not decided here: what they admit is a lease, held until released
//! (`app::admission`), and their cluster tier is the shared pool's.

mod for_others;
mod here;
mod home;
mod lent;
mod owner;
mod place;
mod redis;
mod waiting;

pub use home::Home;
pub use lent::{NoQuota, QuotaBook};
pub use place::{HERE, Place};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use weir::SystemClock;
use weir::limiter::Quota;
use weir::policy::{Policy, PolicySet};

use crate::cluster::ClusterMode;
use crate::error::ApiError;
use crate::redis_buckets::RedisBuckets;

/// One decision asked of a policy's bucket.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The request's kind, if it has one (a kind may have buckets of its own).
    pub kind: Option<&'a str>,
    /// The bucket's key.
    pub key: &'a str,
    /// What the request costs.
    pub cost: u64,
    /// The longest the caller waits for room (`None`: the policy's `max_wait`). `Some(ZERO)`
    /// decides at once and reads what the bucket has left with the decision.
    pub max_wait: Option<Duration>,
}

impl<'a> Ask<'a> {
    /// An ask decided at once, answering what the bucket has left (Envoy's rate limit
    /// service, Gubernator-style APIs).
    pub fn now(kind: Option<&'a str>, key: &'a str, cost: u64) -> Self {
        Ask {
            kind,
            key,
            cost,
            max_wait: Some(Duration::ZERO),
        }
    }

    fn decides_now(&self) -> bool {
        self.max_wait == Some(Duration::ZERO)
    }
}

/// Which tier admitted a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionTier {
    /// This node's own buckets.
    Node,
    /// The bucket's owner, another node, decided a cluster-scoped rate.
    Owner,
    /// A lease (or a lent unit) from the shared pool of a concurrency policy.
    Shared,
    /// The shared pool's owner (or the policy's Redis) could not be asked; admitted anyway
    /// (`on_unavailable = "open"`).
    FailOpen,
    /// The shared pool's owner could not be asked; admitted within this node's share.
    LocalShare,
    /// The Redis the policy's buckets live in decided (`scope = "redis"`).
    Redis,
    /// This node decided a cluster-scoped rate within the share of the bucket its owner
    /// assigned it.
    Assigned,
}

impl AdmissionTier {
    /// The name an answer carries: `node`, `owner`, `assigned`, `shared`, `fail_open`,
    /// `local_share`, `redis`.
    pub fn name(self) -> &'static str {
        match self {
            AdmissionTier::Node => "node",
            AdmissionTier::Owner => "owner",
            AdmissionTier::Shared => "shared",
            AdmissionTier::FailOpen => "fail_open",
            AdmissionTier::LocalShare => "local_share",
            AdmissionTier::Redis => "redis",
            AdmissionTier::Assigned => "assigned",
        }
    }
}

impl From<weir_cluster::admission::Tier> for AdmissionTier {
    fn from(tier: weir_cluster::admission::Tier) -> Self {
        match tier {
            weir_cluster::admission::Tier::Node => AdmissionTier::Node,
            weir_cluster::admission::Tier::Shared => AdmissionTier::Shared,
            weir_cluster::admission::Tier::FailOpen => AdmissionTier::FailOpen,
            weir_cluster::admission::Tier::LocalShare => AdmissionTier::LocalShare,
        }
    }
}

/// How one bucket decided an [`Ask`], wherever it lives.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admitted.
    Admitted {
        /// How long it waited.
        waited: Duration,
        /// Admitted only because the policy monitors.
        would_throttle: bool,
        /// What the bucket has spent and left just after, when known.
        quota: Option<Quota>,
        /// Who decided.
        tier: AdmissionTier,
    },
    /// Refused.
    Refused {
        /// When asking again could succeed, if known.
        retry_after: Option<Duration>,
        /// Why, in a sentence naming the policy.
        reason: String,
        /// What the bucket has spent and left, when known.
        quota: Option<Quota>,
    },
}

impl Decision {
    /// What the bucket has spent and left, when known.
    pub fn quota(&self) -> Option<Quota> {
        match self {
            Decision::Admitted { quota, .. } | Decision::Refused { quota, .. } => *quota,
        }
    }

    /// Over the limit: refused, or admitted only because the policy monitors.
    pub fn is_over(&self) -> bool {
        match self {
            Decision::Admitted { would_throttle, .. } => *would_throttle,
            Decision::Refused { .. } => true,
        }
    }
}

/// Counts a decision on `ask` that `policy`'s own buckets here did not make (within an
/// assigned share, or by Redis: `place`) in the policy's counters, as one of its own (`over`:
/// the bucket said no).
fn count_elsewhere(policy: &Policy<SystemClock>, ask: Ask<'_>, over: bool, place: Place) {
    let mut request = weir::policy::Request::new(ask.key).cost(ask.cost);
    request.kind = ask.kind;
    policy.count_decided_elsewhere(&request, over, place.index());
}

/// What deciding a bucket needs: where buckets may live, and what is lent out of them.
pub struct Decider {
    policies: Arc<PolicySet<SystemClock>>,
    cluster: Option<Arc<ClusterMode>>,
    redis: Option<Arc<RedisBuckets>>,
    /// Buckets that refill slower than this are kept across restarts: a copy of one another
    /// node owns follows its owner's answers.
    kept_slower_than: Option<Duration>,
    lent: Arc<QuotaBook>,
    shutdown: watch::Receiver<bool>,
    /// Handovers that came before their policy, or were dropped waiting for it: logged at most
    /// once a minute each.
    awaiting_logged: (crate::log_gate::LogGate, crate::log_gate::LogGate),
}

impl std::fmt::Debug for Decider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decider")
            .field("cluster", &self.cluster.is_some())
            .field("redis", &self.redis.is_some())
            .finish_non_exhaustive()
    }
}

/// What a [`Decider`] is made of.
pub struct DeciderParts {
    /// The policies in force.
    pub policies: Arc<PolicySet<SystemClock>>,
    /// Cluster mode, when this node is part of a cluster.
    pub cluster: Option<Arc<ClusterMode>>,
    /// The Redis `scope = "redis"` policies keep their buckets in, if one is configured.
    pub redis: Option<Arc<RedisBuckets>>,
    /// Buckets that refill slower than this are kept across restarts (`None`: none are).
    pub kept_slower_than: Option<Duration>,
    /// Shares of this node's buckets lent to data planes.
    pub lent: Arc<QuotaBook>,
    /// Turns true when the node starts shutting down.
    pub shutdown: watch::Receiver<bool>,
}

impl Decider {
    /// A decider over `parts`.
    pub fn new(parts: DeciderParts) -> Self {
        Decider {
            policies: parts.policies,
            cluster: parts.cluster,
            redis: parts.redis,
            kept_slower_than: parts.kept_slower_than,
            lent: parts.lent,
            shutdown: parts.shutdown,
            awaiting_logged: Default::default(),
        }
    }

    /// Decides `ask` of `policy`'s bucket, wherever it lives; waits if the policy and the ask
    /// allow, unless shutdown begins. An error only for a request that cannot be decided by
    /// this node at all (a Redis policy without `[redis]`) or that shutdown ended.
    pub async fn decide(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Result<Decision, ApiError> {
        // Decided here unless the bucket's home answers (an owner or a Redis out of reach
        // falls back here): one `decide_here` in the future, not one per home.
        match self.home_of(policy) {
            Home::Here => {}
            Home::Owner => {
                if let Some(decided) = self.decide_by_owner(policy, ask).await {
                    return Ok(decided);
                }
            }
            Home::Redis => {
                if let Some(decided) = self.decide_in_redis(policy, ask).await {
                    return decided;
                }
            }
            Home::RedisMissing => return Err(home::redis_missing(policy.name())),
        }
        self.decide_here(policy, ask).await
    }

    /// The shares lent to data planes, and their counters.
    pub fn lent(&self) -> &Arc<QuotaBook> {
        &self.lent
    }

    /// Resolves when shutdown begins.
    async fn shutting_down(&self) {
        let mut shutdown = self.shutdown.clone();
        let _ = shutdown.wait_for(|down| *down).await;
    }
}
