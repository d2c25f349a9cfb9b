//! How a node's cluster state reads from outside: its counters and `/v1/cluster`'s view.

use super::{
    ClusterCounters, ClusterMember, ClusterMode, ClusterView, DEFAULT_VNODES, RingSummary,
    SystemClock,
};
use weir::Clock;

impl ClusterMode {
    /// What two-tier admission did on this node, over every policy, and the buckets it owns.
    pub fn counters(&self) -> ClusterCounters {
        use std::sync::atomic::Ordering::Relaxed;
        let mut counters = ClusterCounters {
            buckets_owned: self.pool.buckets() as u64,
            forwarded: self.rates.forwarded.load(Relaxed),
            forward_failed: self.rates.forward_failed.load(Relaxed),
            decided_for_others: self.rates.decided_for_others.load(Relaxed),
            rate_buckets_handed_over: self.rates.handed_over.load(Relaxed),
            rate_buckets_taken_on: self.rates.taken_on.load(Relaxed),
            rate_learning: self.rates.learning.load(Relaxed),
            refused_while_lent: self.pool.refused_while_lent(),
            ..ClusterCounters::default()
        };
        self.count_assignments(&mut counters);
        for (_, coordinator) in self
            .coordinators
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            counters.shared += coordinator.counters.shared.load(Relaxed);
            counters.fail_open += coordinator.counters.fail_open.load(Relaxed);
            counters.local_share += coordinator.counters.local_share.load(Relaxed);
            counters.unavailable += coordinator.counters.unavailable.load(Relaxed);
            counters.handed_off += coordinator.counters.handed_off.load(Relaxed);
            counters.raced += coordinator.counters.raced.load(Relaxed);
            counters.from_loan += coordinator.counters.from_loan.load(Relaxed);
            counters.learning += coordinator.counters.learning.load(Relaxed);
            counters.given_back += coordinator.counters.given_back.load(Relaxed);
            counters.borrowed += coordinator.lent().units;
        }
        counters
    }

    /// Members, ring and counters, for `/v1/cluster`.
    pub fn describe(&self) -> ClusterView {
        let versions = self.config_versions();
        let voters = self.policy_log.voter_states();
        let votes = |id: &str| voters.iter().any(|voter| voter.id == id);
        let mut members: Vec<ClusterMember> = self
            .members
            .borrow()
            .iter()
            .map(|m| ClusterMember {
                id: m.id.clone(),
                grpc: m.grpc.clone(),
                // Only a member stepping down advertises that it owns nothing.
                state: if m.owner { "alive" } else { "leaving" }.to_owned(),
                unseen_for_ms: None,
                votes: votes(&m.id),
                protocol: m.protocol,
                owner: m.owner,
                config_version: versions.members.get(&m.id).cloned(),
                build: versions.builds.get(&m.id).cloned(),
            })
            .collect();
        // A voter gossip no longer sees is still part of the cluster — it counts in every
        // majority — so it is shown, as suspect or gone, not left out.
        let unseen: Vec<_> = voters
            .into_iter()
            .filter(|voter| voter.state != "alive" && !members.iter().any(|m| m.id == voter.id))
            .collect();
        members.extend(unseen.into_iter().map(|voter| ClusterMember {
            grpc: self.policy_log.voter_address(&voter.id).unwrap_or_default(),
            id: voter.id,
            state: voter.state,
            unseen_for_ms: voter.unseen_for_ms,
            votes: true,
            protocol: 0,
            owner: false,
            config_version: None,
            build: None,
        }));
        ClusterView {
            config_differs: versions.differing(),
            // Named by asking the members (`App::config_drift`), not here.
            config_drift: Vec::new(),
            mode: "cluster".to_owned(),
            members,
            ring: RingSummary {
                members: self.ring.load().members().len(),
                vnodes: DEFAULT_VNODES,
                unchanged_for_ms: self
                    .owner
                    .ring_unchanged_for(SystemClock::new().now())
                    .as_millis() as u64,
                handed_over: self.owner.handed_over(),
            },
            counters: self.counters(),
            lent: self.lent(),
            policy_log: Some(self.policy_log.status()),
            // What this node's own config cannot run: the app fills it in.
            cannot_run: Vec::new(),
        }
    }
}
