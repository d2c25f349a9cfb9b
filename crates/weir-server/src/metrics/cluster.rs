//! Cluster mode's counters: admissions beyond the node tier, the owner's side, forwarding,
//! handovers, peers.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{family, single};
use crate::cluster::ClusterMode;

/// Cluster mode's counters, read at scrape time.
#[derive(Debug)]
pub(super) struct ClusterCollector {
    pub(super) cluster: Arc<ClusterMode>,
}

/// `{tier}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `{state}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// `{peer}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let c = self.cluster.counters();
        family(
            &mut encoder,
            "weir_cluster_admissions",
            "Admissions beyond the node tier: shared (a lease from the owner or a unit lent to this node), fail_open, local_share",
            MetricType::Counter,
            [
                ("shared", c.shared),
                ("fail_open", c.fail_open),
                ("local_share", c.local_share),
            ]
            .map(|(tier, v)| (TierLabel { tier }, ConstCounter::new(v))),
        )?;
        let versions = self.cluster.config_versions();
        single(
            &mut encoder,
            "weir_cluster_config_drift",
            "Live members whose config version (`weir_config_info{hash}`) differs from this node's: they run other policies, or have not yet applied a change the cluster made",
            MetricType::Gauge,
            ConstGauge::new(versions.differing().len() as i64),
        )?;
        let log = self.cluster.policy_log().status();
        for (name, help, value) in [
            (
                "weir_policy_log_leader",
                "1 if this node leads the cluster's policy log, else 0",
                i64::from(log.is_leader),
            ),
            (
                "weir_policy_log_term",
                "The policy log's Raft term: it grows with each election",
                i64::try_from(log.term).unwrap_or(i64::MAX),
            ),
            (
                "weir_policy_log_applied_index",
                "The index of the last policy change this node has applied",
                i64::try_from(log.applied_index).unwrap_or(i64::MAX),
            ),
            (
                "weir_policy_log_voters",
                "Members that vote in the policy log",
                i64::try_from(log.voters).unwrap_or(i64::MAX),
            ),
            (
                "weir_policy_log_running",
                "1 while this member's part of the policy log runs; 0 while it has stopped on an error (a full disk, a failing file) and is being started again — the node is then not ready",
                i64::from(self.cluster.policy_log().stopped().is_none()),
            ),
        ] {
            single(
                &mut encoder,
                name,
                help,
                MetricType::Gauge,
                ConstGauge::new(value),
            )?;
        }
        // What this member sees of the voters: an old leader cut off keeps `leader` at 1, so
        // whether a majority is in sight is exported apart, by every member.
        let voters_in = |state: &str| log.voter_states.iter().filter(|v| v.state == state).count();
        let alive = voters_in("alive");
        single(
            &mut encoder,
            "weir_policy_log_quorum",
            "1 if this member sees a majority of the policy log's voters alive (gossip), else 0: without one no policy change can be committed",
            MetricType::Gauge,
            ConstGauge::new(i64::from(alive * 2 > log.voter_states.len())),
        )?;
        family(
            &mut encoder,
            "weir_policy_log_voters_unseen",
            "Voters of the policy log this member's gossip does not see: suspect (for less than `forget_after`) or gone (for longer; still voting only when forgetting it would cost the live voters their majority)",
            MetricType::Gauge,
            ["suspect", "gone"].map(|state| {
                (
                    StateLabel { state },
                    ConstGauge::new(voters_in(state) as i64),
                )
            }),
        )?;
        family(
            &mut encoder,
            "weir_policy_log_changes",
            "Policy changes made through this node: committed by the cluster, refused for want of a majority (nothing written), or of unknown outcome (written by the leader, not confirmed by a majority in time)",
            MetricType::Counter,
            [
                ("committed", log.committed_here),
                ("no_quorum", log.refused_here),
                ("outcome_unknown", log.outcome_unknown_here),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        single(
            &mut encoder,
            "weir_policy_log_restarts",
            "Times this member's part of the policy log was started again after stopping on an error",
            MetricType::Counter,
            ConstCounter::new(self.cluster.policy_log().restarts()),
        )?;
        single(
            &mut encoder,
            "weir_cluster_unavailable",
            "Times a bucket's owner could not be asked",
            MetricType::Counter,
            ConstCounter::new(c.unavailable),
        )?;
        single(
            &mut encoder,
            "weir_cluster_leases_handed_off",
            "Shared leases re-registered with a bucket's new owner after a ring change",
            MetricType::Counter,
            ConstCounter::new(c.handed_off),
        )?;
        single(
            &mut encoder,
            "weir_cluster_admissions_from_loan",
            "Shared admissions on units lent to this node, made with no call to the owner",
            MetricType::Counter,
            ConstCounter::new(c.from_loan),
        )?;
        single(
            &mut encoder,
            "weir_cluster_learning_refusals",
            "Requests refused because the bucket's new owner was in its learning period",
            MetricType::Counter,
            ConstCounter::new(c.learning),
        )?;
        single(
            &mut encoder,
            "weir_cluster_units_given_back",
            "Lent units this node gave back to their owners",
            MetricType::Counter,
            ConstCounter::new(c.given_back),
        )?;
        single(
            &mut encoder,
            "weir_cluster_units_borrowed",
            "Shared units lent to this node now",
            MetricType::Gauge,
            ConstGauge::new(i64::try_from(c.borrowed).unwrap_or(i64::MAX)),
        )?;
        single(
            &mut encoder,
            "weir_cluster_refused_while_lent",
            "As an owner: requests refused while other nodes held loans of the bucket",
            MetricType::Counter,
            ConstCounter::new(c.refused_while_lent),
        )?;
        family(
            &mut encoder,
            "weir_cluster_units_lent",
            "As an owner: shared units lent out now, by the node holding them",
            MetricType::Gauge,
            self.cluster.lent().into_iter().map(|(peer, units)| {
                (
                    PeerLabel { peer },
                    ConstGauge::new(i64::try_from(units).unwrap_or(i64::MAX)),
                )
            }),
        )?;
        single(
            &mut encoder,
            "weir_cluster_grants_raced",
            "Grants given back because the ring moved their bucket while they were on the way",
            MetricType::Counter,
            ConstCounter::new(c.raced),
        )?;
        family(
            &mut encoder,
            "weir_cluster_rate_decisions",
            "Requests of cluster-scoped rate policies: forwarded (decided by the bucket's owner), forward_failed (decided here, the owner could not), decided_for_others (decided here as the owner)",
            MetricType::Counter,
            [
                ("forwarded", c.forwarded),
                ("forward_failed", c.forward_failed),
                ("decided_for_others", c.decided_for_others),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        family(
            &mut encoder,
            "weir_cluster_assigned_decisions",
            "Requests of cluster-scoped rate policies decided on this node within the share of the bucket its owner assigned it",
            MetricType::Counter,
            [
                ("admitted", c.assigned_admitted),
                ("refused", c.assigned_refused),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        family(
            &mut encoder,
            "weir_cluster_assignment_reports",
            "Reports of this node's demand for cluster-scoped rate buckets sent to their owners: answered, failed (no answer; a share held runs out at its TTL)",
            MetricType::Counter,
            [
                (
                    "answered",
                    c.assignment_reports - c.assignment_reports_failed,
                ),
                ("failed", c.assignment_reports_failed),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        single(
            &mut encoder,
            "weir_cluster_assignments_held",
            "Shares of cluster-scoped rate buckets this node holds and decides within",
            MetricType::Gauge,
            ConstGauge::new(i64::try_from(c.assignments_held).unwrap_or(i64::MAX)),
        )?;
        single(
            &mut encoder,
            "weir_cluster_rate_shares_lent",
            "Shares of the rate of the buckets this node owns lent to other nodes, over every bucket (1000 to a bucket)",
            MetricType::Gauge,
            ConstGauge::new(i64::try_from(c.shares_lent).unwrap_or(i64::MAX)),
        )?;
        family(
            &mut encoder,
            "weir_cluster_rate_buckets_handed",
            "Cluster-scoped rate buckets moved by the ring with their state: handed_over (by this node to the new owner), taken_on (by this node from the previous owner)",
            MetricType::Counter,
            [
                ("handed_over", c.rate_buckets_handed_over),
                ("taken_on", c.rate_buckets_taken_on),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        single(
            &mut encoder,
            "weir_cluster_rate_buckets_awaiting_policy",
            "Cluster-scoped rate buckets handed to this node before it runs their policy (its policy log catching up), kept until the policy starts here",
            MetricType::Gauge,
            ConstGauge::new(
                i64::try_from(self.cluster.handovers_awaiting_policy()).unwrap_or(i64::MAX),
            ),
        )?;
        single(
            &mut encoder,
            "weir_cluster_rate_learning_decisions",
            "Decisions on cluster-scoped rate buckets this node had owned for less than the policy's learning_period (each bucket held to what it refilled since)",
            MetricType::Counter,
            ConstCounter::new(c.rate_learning),
        )?;
        single(
            &mut encoder,
            "weir_cluster_members",
            "Live members seen by this node",
            MetricType::Gauge,
            ConstGauge::new(self.cluster.members() as i64),
        )?;
        single(
            &mut encoder,
            "weir_cluster_buckets_owned",
            "Buckets whose shared pool this node owns and tracks",
            MetricType::Gauge,
            ConstGauge::new(c.buckets_owned as i64),
        )
    }
}
