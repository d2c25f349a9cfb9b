//! Every policy's counters and gauges at one moment, as JSON: what `/metrics` says per policy,
//! plus what it cannot say without a label per key or per lease (leases by tier, the adaptive
//! step and the last busy signal) and the ring's shares. The live page polls it; a rate is
//! the difference of two readings over the difference of their `at_ms`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::App;

/// `GET /v1/stats`: this node's policies and leases now.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StatsView {
    /// This node's name.
    pub node_id: String,
    /// When the counters were read, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Every policy in force, by name.
    pub policies: Vec<PolicyStats>,
    /// Lease counters.
    pub leases: LeaseStats,
    /// The ring's owners and their shares (this node alone, owning all of it, outside a cluster).
    pub ring: RingShares,
    /// Whether policy changes need the admin token. Without one the server takes them from
    /// anyone who reaches it (loopback only), and the live page stays read-only.
    pub writes_need_token: bool,
}

/// One policy's counters and gauges. The counters run from the policy's start: a change over
/// the API or a reload keeps them; a policy removed and added again starts from zero.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PolicyStats {
    /// The policy.
    pub policy: String,
    /// Requests it applied to.
    pub started: u64,
    /// Admitted at once (not after waiting, not only because of monitor mode).
    pub admitted: u64,
    /// Admitted after waiting.
    pub throttled: u64,
    /// Refused.
    pub rejected: u64,
    /// Refused by the limiter but admitted by monitor mode.
    pub would_throttle: u64,
    /// Admitted without a bucket key.
    pub unkeyed: u64,
    /// Admitted and not finished now.
    pub in_flight: u64,
    /// Waiting for their turn now.
    pub waiters: u64,
    /// Keys (buckets) tracked now.
    pub keys: u64,
    /// Leases held now from this node's own buckets.
    pub leases_node: u64,
    /// Leases held now from the cluster's shared pool (or lent by another node).
    pub leases_shared: u64,
    /// The adaptive controller's state, for an adaptive policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveStats>,
}

impl PolicyStats {
    /// `policy` with every number 0.
    pub fn zero(policy: &str) -> Self {
        PolicyStats {
            policy: policy.to_owned(),
            started: 0,
            admitted: 0,
            throttled: 0,
            rejected: 0,
            would_throttle: 0,
            unkeyed: 0,
            in_flight: 0,
            waiters: 0,
            keys: 0,
            leases_node: 0,
            leases_shared: 0,
            adaptive: None,
        }
    }
}

/// An adaptive policy's controller now.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AdaptiveStats {
    /// Busy signals taken.
    pub busy_signals: u64,
    /// Times it tightened its hottest keys.
    pub upgrades: u64,
    /// Times it relaxed.
    pub downgrades: u64,
    /// The step: upgrade levels not yet undone (0 when not limiting, or when converging).
    pub level: usize,
    /// The converging controller's estimate of the calls a second the backend accepts.
    pub capacity: Option<f64>,
    /// Keys limited now, per kind.
    pub throttled_keys: BTreeMap<String, usize>,
    /// When the last busy signal came through this server's API, in milliseconds since the
    /// Unix epoch; `None` if none has since the start.
    pub last_busy_ms: Option<u64>,
}

/// Leases of every policy.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LeaseStats {
    /// Held now.
    pub active: u64,
    /// Reclaimed because their holder neither released nor renewed them.
    pub expired: u64,
    /// Released by their holder.
    pub released: u64,
}

/// The ring as this node sees it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RingShares {
    /// One more each time membership changed the ring (0 outside a cluster).
    pub generation: u64,
    /// Each owner's share of the bucket names, 0 to 1.
    pub shares: BTreeMap<String, f64>,
}

fn millis_since_epoch(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl App {
    /// This node's policies and leases now, for `GET /v1/stats`.
    pub fn stats(&self) -> StatsView {
        let mut leases_held = self.leases.held_by_policy();
        let last_busy = self.admin.last_busy();
        let policies = self
            .policies
            .policies()
            .iter()
            .map(|policy| {
                let name = policy.name().to_owned();
                let s = policy.stats();
                let (leases_node, leases_shared) = leases_held.remove(&name).unwrap_or_default();
                let adaptive = policy.backpressure_stats().map(|b| AdaptiveStats {
                    busy_signals: b.busy_signals,
                    upgrades: b.upgrades,
                    downgrades: b.downgrades,
                    level: b.level,
                    capacity: b.capacity,
                    throttled_keys: b.throttled_keys,
                    last_busy_ms: last_busy.get(&name).copied().map(millis_since_epoch),
                });
                PolicyStats {
                    // The same split as `weir_decisions_total`'s outcomes.
                    admitted: s
                        .admitted
                        .saturating_sub(s.throttled)
                        .saturating_sub(s.would_throttle),
                    policy: name,
                    started: s.started,
                    throttled: s.throttled,
                    rejected: s.rejected,
                    would_throttle: s.would_throttle,
                    unkeyed: s.unkeyed,
                    in_flight: s.in_flight,
                    waiters: s.waiters,
                    keys: s.keys,
                    leases_node,
                    leases_shared,
                    adaptive,
                }
            })
            .collect();
        let counters = self.leases.counters();
        let (generation, shares) = match &self.cluster {
            Some(cluster) => cluster.ring_shares(),
            None => (0, vec![(self.node_id.clone(), 1.0)]),
        };
        StatsView {
            node_id: self.node_id.clone(),
            at_ms: millis_since_epoch(SystemTime::now()),
            policies,
            leases: LeaseStats {
                active: counters.active,
                expired: counters.expired,
                released: counters.released,
            },
            ring: RingShares {
                generation,
                shares: shares.into_iter().collect(),
            },
            writes_need_token: self.access.writes_need_token(),
        }
    }
}
