//! The owner's side of cluster-scoped rate buckets: a decision another node forwards, a
//! bucket's state handed over by its previous owner, a node's or a data plane's report on a
//! bucket it holds a share of — and the handovers this node owes when the ring moves its
//! buckets away.
//!
//! A node asked for a bucket its ring gives to another passes the ask on to that owner, once
//! (rings change on every node at a slightly different moment).

use std::sync::Arc;

use weir::SystemClock;
use weir::policy::{Policy, Scope};
use weir_cluster::rates::{
    Assignment, Decided, Handover, RateAsk, RateDecision, RateOwner, Report, ReportAnswer,
    bucket_of,
};
use weir_cluster::transport::BoxFuture;

use super::owner::assignable;
use super::{Ask, Decider, Decision, Place};
use crate::cluster::ClusterMode;
use weir::policy::stats::Outcome;

impl Decider {
    /// Decides a request another node forwards: only for a cluster-scoped policy whose bucket
    /// this node owns by its own ring (or was just handed).
    pub async fn decide_for_other(&self, ask: RateAsk) -> RateDecision {
        let Some(cluster) = &self.cluster else {
            return RateDecision::NotOwner;
        };
        if !cluster.owns_rate(&ask.policy, &ask.key) && !cluster.was_handed(&ask.policy, &ask.key) {
            // The asker's ring still names this node (it is leaving, or the ring moved the
            // bucket to a node that joined and the asker's ring has not followed yet): the ask
            // is passed on, once, to the owner this node's ring names. Answered "not the
            // owner", the asker would decide on a bucket of its own, admitting up to a burst
            // more for every node whose ring lags — what a join was measured to do before
            // asks were relayed.
            if !ask.relayed
                && let Some(owner) = cluster.rate_owner(&ask.policy, &ask.key)
            {
                let relayed = RateAsk {
                    relayed: true,
                    ..ask
                };
                return cluster
                    .forward(&owner, relayed)
                    .await
                    .unwrap_or(RateDecision::NotOwner);
            }
            return RateDecision::NotOwner;
        }
        let Some(policy) = self.cluster_policy(&ask.policy) else {
            return RateDecision::UnknownPolicy;
        };
        cluster.decided_for_other();
        RateDecision::Decided(self.decide_as_owner(&policy, &ask).await)
    }

    /// Takes a bucket's state on from its previous owner. Taken on even before this node's
    /// ring names it the owner: rings change on every node at a slightly different moment,
    /// and the state is only ever emptier.
    fn take_on(&self, handover: Handover) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(policy) = self.cluster_policy(&handover.policy) else {
            if self.policies.get(&handover.policy).is_none() {
                self.await_policy(cluster, handover);
            }
            // A policy this node runs with another scope: the members' configs differ, and
            // `/v1/cluster` says so; the bucket is not this node's to keep.
            return;
        };
        policy.absorb(handover.kind.as_deref(), &handover.key, handover.quota);
        if handover.kind.is_none()
            && let Some(aside) =
                cluster.take_on_lent(&handover.policy, &handover.key, &handover.lent)
        {
            policy.set_aside(
                None,
                &handover.key,
                (aside.before, aside.elapsed, aside.after),
            );
        }
        cluster.took_on_rate_bucket(&handover.policy, &handover.key);
    }

    /// Keeps a handover that came before its policy until the policy starts here (the
    /// cluster's `awaiting.rs`).
    fn await_policy(&self, cluster: &ClusterMode, handover: Handover) {
        let policy = handover.policy.clone();
        let (waiting, dropped) = &self.awaiting_logged;
        if cluster.await_policy(handover) {
            if let Some(unlogged) = waiting.pass() {
                tracing::info!(
                    policy,
                    unlogged,
                    "buckets were handed to this node before it runs their policy (its policy log is catching up): kept until the policy starts here"
                );
            }
        } else if let Some(unlogged) = dropped.pass() {
            tracing::warn!(
                policy,
                unlogged,
                "a bucket handed to this node before it runs its policy was dropped, as many waiting already as may: it starts whole here"
            );
        }
    }

    /// Takes on the handovers that waited for a policy this node now runs: called as policies
    /// start, before they decide.
    pub fn take_on_awaiting(&self) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let ready = cluster.handovers_for(|name| self.cluster_policy(name).is_some());
        for handover in ready {
            self.take_on(handover);
        }
    }

    /// Answers a holder's report on a bucket this node owns: its share.
    pub(super) fn answer_report(&self, Report { holder, report }: Report) -> ReportAnswer {
        let Some(cluster) = &self.cluster else {
            return ReportAnswer::NotOwner;
        };
        if !cluster.owns_rate(&report.policy, &report.key) {
            return ReportAnswer::NotOwner;
        }
        let Some(policy) = self.cluster_policy(&report.policy) else {
            return ReportAnswer::UnknownPolicy;
        };
        let Some(whole) = assignable(&policy, None) else {
            return ReportAnswer::Assigned(Assignment::none());
        };
        let (mut assignment, aside) = cluster.answer_report(&holder, &report, whole);
        // Set aside before the holder hears of it: its share is never counted twice, and what
        // the owner's bucket held beyond its own share moves to the holder.
        assignment.tokens = policy.set_aside(
            None,
            &report.key,
            (aside.before, aside.elapsed, aside.after),
        );
        ReportAnswer::Assigned(assignment)
    }

    /// The cluster-scoped policy named `name`, if this node has it.
    fn cluster_policy(&self, name: &str) -> Option<Arc<Policy<SystemClock>>> {
        self.policies
            .get(name)
            .filter(|p| p.with_config(|c| c.scope == Scope::Cluster))
    }

    /// A forwarded request decided on this node's bucket, the owner's: the bucket held while
    /// learning and what is lent set aside first, as for a request of this node's own.
    async fn decide_as_owner(&self, policy: &Policy<SystemClock>, request: &RateAsk) -> Decided {
        let kind = request.kind.as_deref();
        self.before_deciding_as_owner(policy, kind, &request.key, request.cost);
        let ask = Ask {
            kind,
            key: &request.key,
            cost: request.cost,
            max_wait: Some(request.max_wait),
        };
        let decided = self.decide_here(policy, ask).await;
        // Counted here by the bucket, and told apart as decided for another node.
        let outcome = match &decided {
            Ok(Decision::Admitted {
                would_throttle: true,
                ..
            }) => Some(Outcome::WouldThrottle),
            Ok(Decision::Admitted { waited, .. }) if !waited.is_zero() => Some(Outcome::Throttled),
            Ok(Decision::Admitted { .. }) => Some(Outcome::Admitted),
            Ok(Decision::Refused { .. }) => Some(Outcome::Rejected),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            policy.count_place(kind, Place::Owner.index(), outcome);
        }
        match decided {
            // What a waiting request's asker keeps is read once it is decided.
            Ok(Decision::Admitted {
                waited,
                would_throttle,
                quota,
                ..
            }) => Decided::Admitted {
                waited,
                would_throttle,
                quota: quota.or_else(|| policy.quota(kind, &request.key)),
            },
            Ok(Decision::Refused {
                retry_after,
                reason,
                quota,
            }) => Decided::Refused {
                retry_after,
                reason,
                quota: quota.or_else(|| policy.quota(kind, &request.key)),
            },
            Err(_) => Decided::Refused {
                retry_after: None,
                reason: "the bucket's owner is shutting down".to_owned(),
                quota: None,
            },
        }
    }

    /// Handovers of this node's cluster-scoped rate buckets that `moving` picks: those spent,
    /// and those it lends shares of even when whole.
    ///
    /// A bucket lent of is hot: nodes ask for it while their rings follow the change at their
    /// own pace, and the new owner answers a lagging ring's asks only for a bucket handed to it.
    /// Were a whole one not handed, each lagging node would decide it on a bucket of its own,
    /// and the cluster admit up to a burst and more per such node (`docs/benchmarks.md`, "The
    /// busiest second").
    fn rate_handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
        let mut handovers = self.spent_handovers(moving);
        let Some(cluster) = &self.cluster else {
            return handovers;
        };
        let spent: std::collections::HashSet<(String, String)> = handovers
            .iter()
            .filter(|handover| handover.kind.is_none())
            .map(|handover| (handover.policy.clone(), handover.key.clone()))
            .collect();
        for (name, key) in cluster.lent_buckets() {
            if spent.contains(&(name.clone(), key.clone())) || !moving(&bucket_of(&name, &key)) {
                continue;
            }
            let Some(quota) = self
                .cluster_policy(&name)
                .and_then(|policy| policy.quota(None, &key))
            else {
                continue;
            };
            handovers.push(Handover {
                lent: cluster.lent_in(&name, &key),
                policy: name,
                key,
                kind: None,
                quota,
            });
        }
        handovers
    }

    /// Handovers of this node's spent cluster-scoped rate buckets that `moving` picks.
    fn spent_handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
        let mut handovers = Vec::new();
        for policy in self.policies.policies() {
            if policy.with_config(|c| c.scope != Scope::Cluster) {
                continue;
            }
            let name = policy.name();
            let spent = policy.spent_buckets(|key| moving(&bucket_of(name, key)));
            handovers.extend(spent.into_iter().map(|bucket| Handover {
                // Its assignment book moves with it (the default buckets' only).
                lent: match (&self.cluster, &bucket.kind) {
                    (Some(cluster), None) => cluster.lent_in(name, &bucket.key),
                    _ => Vec::new(),
                },
                policy: name.to_owned(),
                key: bucket.key,
                kind: bucket.kind,
                quota: bucket.quota,
            }));
        }
        handovers
    }
}

impl RateOwner for Decider {
    fn decide(&self, ask: RateAsk) -> BoxFuture<'_, RateDecision> {
        Box::pin(self.decide_for_other(ask))
    }

    fn take_on(&self, handover: Handover) {
        Decider::take_on(self, handover);
    }

    fn report(&self, report: Report) -> ReportAnswer {
        self.answer_report(report)
    }

    fn handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
        self.rate_handovers(moving)
    }
}
