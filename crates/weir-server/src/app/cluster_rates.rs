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
use weir::policy::{Mode, OnExhausted, Policy, Request, Scope};
use weir_cluster::rates::{
    Decided, Handover, RateAsk, RateDecision, RateOwner, RateRequest, bucket_of,
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
        self.cluster.as_ref()?;
        let max_wait = policy.with_config(|config| {
            let waits = config.on_exhausted == OnExhausted::Wait && config.mode == Mode::Enforce;
            (config.scope == Scope::Cluster).then(|| match (waits, input.max_wait_ms) {
                (false, _) => Duration::ZERO,
                (true, Some(ms)) => Duration::from_millis(ms).min(config.max_wait),
                (true, None) => config.max_wait,
            })
        })?;
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
            Ok(RateDecision::NotOwner | RateDecision::UnknownPolicy) => None,
            Err(why) => {
                tracing::debug!(policy = %policy.name(), %owner, "deciding here: {why}");
                None
            }
        }
    }

    /// Decides a request another node forwarded: only for a cluster-scoped policy whose
    /// bucket this node owns by its own ring.
    async fn decide_for_other(&self, request: RateRequest) -> RateDecision {
        let Some(cluster) = &self.cluster else {
            return RateDecision::NotOwner;
        };
        let policy = self
            .policies
            .get(request.policy())
            .filter(|p| p.with_config(|c| c.scope == Scope::Cluster));
        let request = match request {
            RateRequest::Decide(ask) => ask,
            RateRequest::HandOver(handover) => {
                // Taken on even before this node's ring names it the owner: rings change on
                // every node at a slightly different moment, and the state is only ever
                // emptier.
                if let Some(policy) = &policy {
                    policy.absorb(handover.kind.as_deref(), &handover.key, handover.quota);
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
                policy: name.to_owned(),
                key: bucket.key,
                kind: bucket.kind,
                quota: bucket.quota,
            }));
        }
        handovers
    }
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
