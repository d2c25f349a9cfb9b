//! A cluster-scoped rate bucket (`scope = "cluster"`) as the node a request reaches decides it:
//! within the share of the bucket its owner assigned this node, when it has one and the
//! request does not wait; else asked of the bucket's owner; else (this node owns it, or the
//! owner could not decide) here.
//!
//! When the owner cannot decide — unreachable, or its ring or policies differ from this node's
//! for a moment while membership or config changes — this node decides on its own bucket of
//! the key and counts it (`forward_failed` in `/v1/cluster`): the cluster then admits up to
//! the rate once per node that decides alone, never less than one node would.
//!
//! A new owner whose policy has a `learning_period` holds each bucket it owns, for that long
//! after it took it on, to the share of its capacity the period allows — handed over or not,
//! since a handover may arrive after the first requests.

use std::sync::Arc;
use std::time::Duration;

use weir::SystemClock;
use weir::keyed::Shape;
use weir::policy::{BucketShape, Mode, OnExhausted, Policy, Scope};
use weir_cluster::assignment::{Assignment, Local, REPORT_EVERY, RateReport, Whole};
use weir_cluster::rates::{Decided, RateAsk, RateDecision, Report, ReportAnswer};

use super::waiting::Waiting;
use super::{AdmissionTier, Ask, Decider, Decision, NoQuota, Place, count_elsewhere};

impl Decider {
    /// `ask` of a cluster-scoped policy: decided within this node's assigned share, or by the
    /// bucket's owner; `None` to decide here (this node owns the bucket — then held while
    /// learning, what it lends set aside — or the owner could not decide).
    pub(super) async fn decide_by_owner(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Option<Decision> {
        let cluster = self.cluster.as_ref()?;
        let Waiting { max_wait, monitors } = Waiting::of(policy, ask.max_wait);
        if max_wait.is_zero() && assignable(policy, ask.kind).is_some() {
            let decided = cluster.decide_assigned(policy.name(), ask.key, ask.cost);
            // Decided here, within this node's share: counted here, as a decision of its own.
            if !matches!(decided, Local::Forward) {
                let refused = matches!(decided, Local::Refused { .. });
                count_elsewhere(policy, ask, refused, Place::Assigned);
            }
            match decided {
                Local::Admitted => return Some(assigned(false)),
                Local::Refused { .. } if monitors => return Some(assigned(true)),
                Local::Refused { retry_after } => {
                    return Some(Decision::Refused {
                        retry_after: Some(retry_after),
                        reason: format!(
                            "policy `{}`: rate limited (this node's share of the cluster's rate); retry after {retry_after:?}",
                            policy.name()
                        ),
                        quota: None,
                    });
                }
                Local::Forward => {}
            }
        }
        let Some(owner) = cluster.rate_owner(policy.name(), ask.key) else {
            self.before_deciding_as_owner(policy, ask.kind, ask.key, ask.cost);
            return None;
        };
        let request = RateAsk {
            policy: policy.name().to_owned(),
            key: ask.key.to_owned(),
            kind: ask.kind.map(str::to_owned),
            cost: ask.cost,
            max_wait,
            relayed: false,
        };
        let decided = match cluster.forward(&owner, request).await {
            Ok(RateDecision::Decided(decided)) => decided,
            Ok(RateDecision::NotOwner | RateDecision::UnknownPolicy) => return None,
            Err(why) => {
                tracing::debug!(policy = %policy.name(), %owner, "deciding here: {why}");
                return None;
            }
        };
        // A kept bucket's copy here follows the owner's answers: should the owner crash, this
        // node may own the bucket next, and a day's quota must not start full on it.
        if let (Some(slower_than), Some(quota)) = (self.kept_slower_than, decided.quota()) {
            policy.absorb_answer(ask.kind, ask.key, quota, slower_than);
        }
        Some(match decided {
            Decided::Admitted {
                waited,
                would_throttle,
                quota,
            } => Decision::Admitted {
                waited,
                would_throttle,
                quota,
                tier: AdmissionTier::Owner,
            },
            Decided::Refused {
                retry_after,
                reason,
                quota,
            } => Decision::Refused {
                retry_after,
                reason,
                quota,
            },
        })
    }

    /// Sends data plane `holder`'s report on a cluster-scoped bucket to the bucket's owner
    /// (this node, or another): its assignment.
    pub async fn report_to_owner(
        &self,
        holder: &str,
        report: RateReport,
    ) -> Result<Assignment, NoQuota> {
        let Some(cluster) = &self.cluster else {
            return Err(NoQuota::OwnerUnreachable("not in a cluster".to_owned()));
        };
        let report = Report {
            holder: holder.to_owned(),
            report,
        };
        let answer = match cluster.rate_owner(&report.report.policy, &report.report.key) {
            Some(owner) => cluster.report_to(&owner, report).await,
            None => Ok(self.answer_report(report)),
        };
        match answer {
            Ok(ReportAnswer::Assigned(assignment)) => Ok(assignment),
            Ok(ReportAnswer::NotOwner) => Err(NoQuota::OwnerUnreachable(
                "the node asked does not own the bucket (the ring is changing)".to_owned(),
            )),
            Ok(ReportAnswer::UnknownPolicy) => Err(NoQuota::OwnerUnreachable(
                "the bucket's owner does not have the policy (yet)".to_owned(),
            )),
            Err(why) => Err(NoQuota::OwnerUnreachable(why)),
        }
    }

    /// As the owner of the bucket a request of `kind` for `key` is counted in, before deciding
    /// `cost` of it: the bucket held while this node learns it, what is lent set aside.
    pub(super) fn before_deciding_as_owner(
        &self,
        policy: &Policy<SystemClock>,
        kind: Option<&str>,
        key: &str,
        cost: u64,
    ) {
        self.hold_while_learning(policy, kind, key);
        self.set_aside_lent(policy, kind, key, cost);
    }

    /// For a bucket this node owns: while it has owned it for less than the policy's
    /// `learning_period`, holds it to the share of its capacity that period allows (an owner
    /// that crashed handed nothing over). And while the ring has just given it the bucket and
    /// its previous owner's handover may still be on the way, holds it likewise for at most
    /// `HANDOVER_HOLD`.
    fn hold_while_learning(&self, policy: &Policy<SystemClock>, kind: Option<&str>, key: &str) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        if let Some(held_for) = cluster.awaiting_handover(policy.name(), key) {
            policy.hold_to_tenure(kind, key, held_for, crate::cluster::HANDOVER_HOLD);
            cluster.held_while_learning();
        }
        let learning = policy.with_config(|config| config.learning_period);
        if learning.is_zero() {
            return;
        }
        if let Some(held_for) = cluster.rate_tenure(policy.name(), key)
            && held_for < learning
        {
            policy.hold_to_tenure(kind, key, held_for, learning);
            cluster.held_while_learning();
        }
    }

    /// Sets aside of the bucket what this node, its owner, lends to other nodes, if any.
    fn set_aside_lent(
        &self,
        policy: &Policy<SystemClock>,
        kind: Option<&str>,
        key: &str,
        cost: u64,
    ) {
        if let Some(cluster) = &self.cluster
            && cluster.lends_rates()
            && assignable(policy, kind).is_some()
            && let Some(aside) = cluster.lent_before_deciding(policy.name(), key, cost)
        {
            // Decided here: nothing moves to a holder, and what the floor took out is gone
            // (no share grew).
            policy.set_aside(kind, key, (aside.before, aside.elapsed, aside.after));
        }
    }

    /// Reports this node's demand for the cluster-scoped rate buckets it asks for often,
    /// every [`REPORT_EVERY`], and takes on the shares their owners assign it; in cluster mode
    /// only, until the process ends.
    pub async fn keep_assignments(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let mut every = tokio::time::interval(REPORT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            cluster
                .report_demand(|name| {
                    self.policies
                        .get(name)
                        .and_then(|policy| assignable(&policy, None))
                })
                .await;
        }
    }
}

/// Admitted within this node's assigned share.
fn assigned(would_throttle: bool) -> Decision {
    Decision::Admitted {
        waited: Duration::ZERO,
        would_throttle,
        quota: None,
        tier: AdmissionTier::Assigned,
    }
}

/// The whole shape of the bucket a request of `kind` is counted in, if the owner may assign
/// shares of it to other nodes: a cluster-scoped policy's default buckets (a kind's own
/// buckets stay forwarded) that are [`shareable`].
pub(super) fn assignable(policy: &Policy<SystemClock>, kind: Option<&str>) -> Option<Whole> {
    if policy.with_config(|config| config.scope != Scope::Cluster)
        || !matches!(policy.shape_for(kind), BucketShape::Default(_))
    {
        return None;
    }
    shareable(policy)
}

/// The whole shape of a policy's default buckets, if their owner may lend shares of them (to
/// nodes, or to data planes): `assignments` on, it does not wait (a waiting request waits in
/// the owner's line, fair across the cluster), a token bucket that is not a fair leaky one, or
/// a strict limiter, that refills fast enough for a share of its rate to be worth lending
/// ([`Whole::worth_sharing`]). Fixed and sliding windows are not shared: a window's count is
/// not a rate to share.
pub(crate) fn shareable(policy: &Policy<SystemClock>) -> Option<Whole> {
    let decides_now = policy.with_config(|config| {
        config.assignments
            && !(config.on_exhausted == OnExhausted::Wait && config.mode == Mode::Enforce)
    });
    if !decides_now {
        return None;
    }
    let whole = match policy.shape_for(None) {
        BucketShape::Default(Shape::Gcra {
            interval,
            capacity,
            fair: false,
            ..
        }) => Whole { interval, capacity },
        BucketShape::Default(Shape::Strict { interval }) => Whole {
            interval,
            capacity: 1,
        },
        _ => return None,
    };
    whole.worth_sharing().then_some(whole)
}
