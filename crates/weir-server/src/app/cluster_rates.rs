//! Cluster-scoped rate policies (`scope = "cluster"`): a request whose bucket another node owns
//! is decided there; a request forwarded here for a bucket this node owns is decided with the
//! policy itself, waiting in its line if the policy waits.
//!
//! When the ring moves a bucket away from this node it hands the bucket's state to the new
//! owner (see [`weir_cluster::rates`]); a new owner whose policy has a `learning_period` holds
//! each bucket it owns, for that long after it took it on, to the share of its capacity the
//! period allows — handed over or not, since a handover may arrive after the first requests.
//!
//! A node asked for a bucket its ring gives to another passes the ask on to that owner, once
//! (rings change on every node at a slightly different moment).
//!
//! When the owner cannot decide — unreachable, or its ring or policies differ from this node's
//! for a moment while membership or config changes — this node decides on its own bucket of
//! the key and counts it (`forward_failed` in `/v1/cluster`): the cluster then admits up to
//! the rate once per node that decides alone, never less than one node would. A node without
//! cluster mode decides every bucket itself.

use std::sync::Arc;
use std::time::Duration;

use weir::SystemClock;
use weir::keyed::Shape;
use weir::policy::{BucketShape, Mode, OnExhausted, Policy, Request, Scope};
use weir_cluster::assignment::{Local, REPORT_EVERY, Whole};
use weir_cluster::rates::{
    Assignment, Decided, Handover, RateAsk, RateDecision, RateOwner, RateRequest, bucket_of,
};
use weir_cluster::transport::BoxFuture;

use super::App;
use super::admission::{AcquireInput, AcquireOutcome, AdmissionTier};

impl App {
    /// For a cluster-scoped policy whose bucket for `input.key` another node owns: its
    /// decision, or `None` to decide here (this node owns it, no cluster, or the owner could
    /// not decide).
    pub(super) async fn forward_rate(
        &self,
        policy: &Policy<SystemClock>,
        input: &AcquireInput,
        cost: u64,
        limit: Option<f64>,
    ) -> Option<AcquireOutcome> {
        // A single node decides every bucket itself: not even the policy's config is read.
        let cluster = self.cluster.as_ref()?;
        let (max_wait, monitors) = policy.with_config(|config| {
            let waits = config.on_exhausted == OnExhausted::Wait && config.mode == Mode::Enforce;
            (config.scope == Scope::Cluster).then(|| {
                let max_wait = match (waits, input.max_wait_ms) {
                    (false, _) => Duration::ZERO,
                    (true, Some(ms)) => Duration::from_millis(ms).min(config.max_wait),
                    (true, None) => config.max_wait,
                };
                (max_wait, config.mode == Mode::Monitor)
            })
        })?;
        if max_wait.is_zero() && assignable(policy, input.kind.as_deref()).is_some() {
            let decided = match cluster.decide_assigned(policy.name(), &input.key, cost) {
                Local::Admitted => Some(false),
                Local::Refused { .. } if monitors => Some(true),
                Local::Refused { retry_after } => {
                    return Some(AcquireOutcome::Refused {
                        retry_after: Some(retry_after),
                        reason: format!(
                            "policy `{}`: rate limited (this node's share of the cluster's rate); retry after {retry_after:?}",
                            policy.name()
                        ),
                        limit,
                    });
                }
                Local::Forward => None,
            };
            if let Some(would_throttle) = decided {
                return Some(AcquireOutcome::Admitted {
                    waited: Duration::ZERO,
                    lease: None,
                    would_throttle,
                    limit,
                    tier: AdmissionTier::Assigned,
                });
            }
        }
        match self
            .ask_owner(policy, &input.key, input.kind.as_deref(), cost, max_wait)
            .await?
        {
            Decided::Admitted {
                waited,
                would_throttle,
                ..
            } => Some(AcquireOutcome::Admitted {
                waited,
                lease: None,
                would_throttle,
                limit,
                tier: AdmissionTier::Owner,
            }),
            Decided::Refused {
                retry_after,
                reason,
                ..
            } => Some(AcquireOutcome::Refused {
                retry_after,
                reason,
                limit,
            }),
        }
    }

    /// Asks the owner of `key`'s bucket of `policy` to decide `cost`, waiting up to `max_wait`
    /// there: its answer, or `None` to decide here — this node owns the bucket (then held
    /// while learning), there is no cluster, or the owner could not decide (unreachable, or
    /// its ring or policies differ from this node's for a moment).
    pub(super) async fn ask_owner(
        &self,
        policy: &Policy<SystemClock>,
        key: &str,
        kind: Option<&str>,
        cost: u64,
        max_wait: Duration,
    ) -> Option<Decided> {
        let cluster = self.cluster.as_ref()?;
        let Some(owner) = cluster.rate_owner(policy.name(), key) else {
            self.hold_while_learning(policy, kind, key);
            self.set_aside_lent(policy, kind, key, cost);
            return None;
        };
        let request = RateRequest::Decide(RateAsk {
            policy: policy.name().to_owned(),
            key: key.to_owned(),
            kind: kind.map(str::to_owned),
            cost,
            max_wait,
            relayed: false,
        });
        match cluster.forward(&owner, request).await {
            Ok(RateDecision::Decided(decided)) => {
                // A kept bucket's copy here follows the owner's answers: should the owner
                // crash, this node may own the bucket next, and a day's quota must not start
                // full on it.
                if let (Some(kept), Some(quota)) = (&self.kept, decided.quota()) {
                    policy.absorb_answer(kind, key, quota, kept.slower_than());
                }
                Some(decided)
            }
            Ok(
                RateDecision::NotOwner | RateDecision::UnknownPolicy | RateDecision::Assigned(_),
            ) => None,
            Err(why) => {
                tracing::debug!(policy = %policy.name(), %owner, "deciding here: {why}");
                None
            }
        }
    }

    /// Decides a request another node forwarded: only for a cluster-scoped policy whose
    /// bucket this node owns by its own ring.
    pub(super) async fn decide_for_other(&self, request: RateRequest) -> RateDecision {
        let Some(cluster) = &self.cluster else {
            return RateDecision::NotOwner;
        };
        let policy = self
            .policies
            .get(request.policy())
            .filter(|p| p.with_config(|c| c.scope == Scope::Cluster));
        let request = match request {
            RateRequest::Decide(ask) => ask,
            RateRequest::Report { holder, report } => {
                if !cluster.owns_rate(&report.policy, &report.key) {
                    return RateDecision::NotOwner;
                }
                let Some(policy) = policy else {
                    return RateDecision::UnknownPolicy;
                };
                let Some(whole) = assignable(&policy, None) else {
                    return RateDecision::Assigned(Assignment::none());
                };
                let (mut assignment, aside) = cluster.answer_report(&holder, &report, whole);
                // Set aside before the holder hears of it: its share is never counted twice,
                // and what the owner's bucket held beyond its own share moves to the holder.
                assignment.tokens = policy.set_aside(
                    None,
                    &report.key,
                    (aside.before, aside.elapsed, aside.after),
                );
                return RateDecision::Assigned(assignment);
            }
            RateRequest::HandOver(handover) => {
                // Taken on even before this node's ring names it the owner: rings change on
                // every node at a slightly different moment, and the state is only ever
                // emptier.
                if let Some(policy) = &policy {
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
                return RateDecision::Decided(Decided::Admitted {
                    waited: Duration::ZERO,
                    would_throttle: false,
                    quota: None,
                });
            }
        };
        if !cluster.owns_rate(&request.policy, &request.key)
            && !cluster.was_handed(&request.policy, &request.key)
        {
            // The asker's ring still names this node (it is leaving, or the ring moved the
            // bucket to a node that joined and the asker's ring has not followed yet): the ask
            // is passed on, once, to the owner this node's ring names. Answered "not the
            // owner", the asker would decide on a bucket of its own, admitting up to a burst
            // more for every node whose ring lags — what a join measured (3 % over rate ×
            // time + burst).
            if !request.relayed
                && let Some(owner) = cluster.rate_owner(&request.policy, &request.key)
            {
                let relayed = RateAsk {
                    relayed: true,
                    ..request
                };
                return cluster
                    .forward(&owner, RateRequest::Decide(relayed))
                    .await
                    .unwrap_or(RateDecision::NotOwner);
            }
            return RateDecision::NotOwner;
        }
        let Some(policy) = policy else {
            return RateDecision::UnknownPolicy;
        };
        self.hold_while_learning(&policy, request.kind.as_deref(), &request.key);
        self.set_aside_lent(&policy, request.kind.as_deref(), &request.key, request.cost);
        cluster.decided_for_other();
        let mut asked = Request::new(&request.key)
            .cost(request.cost)
            .max_wait(request.max_wait);
        asked.kind = request.kind.as_deref();
        if request.max_wait.is_zero() {
            // What an RLS rule's answer carries back, read with the decision itself.
            let (decided, quota) = policy.try_acquire_with_quota(&asked);
            return decision_of(decided, quota);
        }
        let decided = tokio::select! {
            decided = policy.acquire(&asked) => decided,
            () = self.shutting_down() => {
                return RateDecision::Decided(Decided::Refused {
                    retry_after: None,
                    reason: "the bucket's owner is shutting down".to_owned(),
                    quota: None,
                });
            }
        };
        decision_of(decided, policy.quota(request.kind.as_deref(), &request.key))
    }
}

impl App {
    /// For a bucket this node owns: while it has owned it for less than the policy's
    /// `learning_period`, holds it to the share of its capacity that period allows (an owner
    /// that crashed handed nothing over).
    /// And while the ring has just given it the bucket and its previous owner's handover may
    /// still be on the way, holds it likewise for at most
    /// [`HANDOVER_HOLD`](crate::cluster::HANDOVER_HOLD).
    fn hold_while_learning(&self, policy: &Policy<SystemClock>, kind: Option<&str>, key: &str) {
        if let Some(cluster) = &self.cluster
            && let Some(held_for) = cluster.awaiting_handover(policy.name(), key)
        {
            policy.hold_to_tenure(kind, key, held_for, crate::cluster::HANDOVER_HOLD);
            cluster.held_while_learning();
        }
        let learning = policy.with_config(|config| config.learning_period);
        if learning.is_zero() {
            return;
        }
        let Some(cluster) = &self.cluster else {
            return;
        };
        if let Some(held_for) = cluster.rate_tenure(policy.name(), key)
            && held_for < learning
        {
            policy.hold_to_tenure(kind, key, held_for, learning);
            cluster.held_while_learning();
        }
    }

    /// As the owner of the bucket a request of `kind` for `key` is counted in, before deciding
    /// `cost` of it: sets aside of it what is lent to other nodes, if any.
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

    /// Handovers of this node's cluster-scoped rate buckets that `moving` picks.
    fn rate_handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
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

/// The whole shape of the bucket a request of `kind` is counted in, if the owner may assign
/// shares of it to other nodes: a cluster-scoped policy's default buckets (a kind's own
/// buckets stay forwarded) that are [`shareable`].
fn assignable(policy: &Policy<SystemClock>, kind: Option<&str>) -> Option<Whole> {
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
pub(super) fn shareable(policy: &Policy<SystemClock>) -> Option<Whole> {
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

/// A decision made here, as the asking node reads it.
fn decision_of(
    decided: Result<weir::policy::Admission<SystemClock>, weir::policy::Rejection>,
    quota: Option<weir::limiter::Quota>,
) -> RateDecision {
    match decided {
        Ok(admission) => RateDecision::Decided(Decided::Admitted {
            waited: admission.waited(),
            would_throttle: admission.would_throttle(),
            quota,
        }),
        Err(rejection) => RateDecision::Decided(Decided::Refused {
            retry_after: rejection.retry_after(),
            reason: rejection.to_string(),
            quota,
        }),
    }
}

/// The owner's side of cluster-scoped rate policies, over an [`App`].
#[derive(Debug, Clone)]
pub struct AppRates(pub Arc<App>);

impl RateOwner for AppRates {
    fn decide(&self, request: RateRequest) -> BoxFuture<'_, RateDecision> {
        Box::pin(self.0.decide_for_other(request))
    }

    fn handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
        self.0.rate_handovers(moving)
    }
}
