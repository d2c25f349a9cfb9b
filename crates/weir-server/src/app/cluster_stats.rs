//! Every member's counters at once, for `GET /v1/stats?scope=cluster`: each member's policies
//! (this node's read here, the others' asked over gRPC, all at once) and their totals, with the
//! members whose policies differ named — the cluster seen whole, not one node at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::App;
use super::stats::PolicyStats;

/// How long a member has to answer before it is left out (and named in `unanswered`).
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// `GET /v1/stats?scope=cluster`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClusterStatsView {
    /// Each member that answered, this node first.
    pub members: Vec<MemberStats>,
    /// Each policy's counters and gauges summed over the members that answered.
    pub totals: Vec<PolicyStats>,
    /// The members whose config version is not this node's (see `/v1/cluster`).
    pub config_differs: Vec<String>,
    /// Live members that did not answer within a second.
    pub unanswered: Vec<String>,
}

/// One member's policies, as its `GET /v1/stats` has them (without the adaptive controllers').
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct MemberStats {
    /// Its node id.
    pub node_id: String,
    /// When it read its counters, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The version of the policies it runs.
    pub config_version: String,
    /// Its policies' counters and gauges.
    pub policies: Vec<PolicyStats>,
}

impl App {
    /// Every member's counters and their totals (module docs). Outside a cluster, this node's.
    pub async fn cluster_stats(&self) -> ClusterStatsView {
        let mine = self.stats();
        let mut members = vec![MemberStats {
            node_id: mine.node_id,
            at_ms: mine.at_ms,
            config_version: self.admin.config_version(),
            policies: mine.policies,
        }];
        let mut unanswered = Vec::new();
        let mut config_differs = Vec::new();
        if let Some(cluster) = &self.cluster {
            config_differs = cluster.config_versions().differing();
            let mut asking = tokio::task::JoinSet::new();
            for (peer, channel) in cluster.peers() {
                asking.spawn(async move {
                    let mut client = crate::proto::weir_client::WeirClient::new(channel);
                    let asked = client.stats(crate::proto::StatsRequest::default());
                    (peer, tokio::time::timeout(ANSWER_WITHIN, asked).await)
                });
            }
            while let Some(answered) = asking.join_next().await {
                let Ok((peer, asked)) = answered else {
                    continue;
                };
                let Ok(Ok(answer)) = asked else {
                    tracing::warn!(%peer, "no stats from a peer within 1 s");
                    unanswered.push(peer);
                    continue;
                };
                members.push(member_of(answer.into_inner()));
            }
            members[1..].sort_by(|a, b| a.node_id.cmp(&b.node_id));
            unanswered.sort();
        }
        ClusterStatsView {
            totals: totals(&members),
            members,
            config_differs,
            unanswered,
        }
    }
}

fn member_of(answer: crate::proto::StatsResponse) -> MemberStats {
    MemberStats {
        node_id: answer.node_id,
        at_ms: answer.at_ms,
        config_version: answer.config_version,
        policies: answer.policies.into_iter().map(Into::into).collect(),
    }
}

/// Each policy's numbers summed over `members`, by name.
fn totals(members: &[MemberStats]) -> Vec<PolicyStats> {
    let mut totals: BTreeMap<&str, PolicyStats> = BTreeMap::new();
    for stats in members.iter().flat_map(|m| &m.policies) {
        let total = totals
            .entry(&stats.policy)
            .or_insert_with(|| PolicyStats::zero(&stats.policy));
        total.started += stats.started;
        total.admitted += stats.admitted;
        total.throttled += stats.throttled;
        total.rejected += stats.rejected;
        total.would_throttle += stats.would_throttle;
        total.unkeyed += stats.unkeyed;
        total.in_flight += stats.in_flight;
        total.waiters += stats.waiters;
        total.keys += stats.keys;
        total.leases_node += stats.leases_node;
        total.leases_shared += stats.leases_shared;
    }
    totals.into_values().collect()
}

/// A member's policy as the gRPC `Stats` call carries it (without its adaptive controller).
impl From<crate::proto::PolicyStats> for PolicyStats {
    fn from(p: crate::proto::PolicyStats) -> Self {
        PolicyStats {
            policy: p.policy,
            started: p.started,
            admitted: p.admitted,
            throttled: p.throttled,
            rejected: p.rejected,
            would_throttle: p.would_throttle,
            unkeyed: p.unkeyed,
            in_flight: p.in_flight,
            waiters: p.waiters,
            keys: p.keys,
            leases_node: p.leases_node,
            leases_shared: p.leases_shared,
            adaptive: None,
        }
    }
}

/// This node's policy as the gRPC `Stats` call answers it: the same numbers, the adaptive
/// controller's left out.
impl From<PolicyStats> for crate::proto::PolicyStats {
    fn from(p: PolicyStats) -> Self {
        crate::proto::PolicyStats {
            policy: p.policy,
            started: p.started,
            admitted: p.admitted,
            throttled: p.throttled,
            rejected: p.rejected,
            would_throttle: p.would_throttle,
            unkeyed: p.unkeyed,
            in_flight: p.in_flight,
            waiters: p.waiters,
            keys: p.keys,
            leases_node: p.leases_node,
            leases_shared: p.leases_shared,
        }
    }
}
