//! Admitting one request: the decision every front door asks for, on this node and, in
//! cluster mode, through the shared pool.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use weir::policy::{Policy, RejectReason, Rejection, Request};
use weir::{Clock, SystemClock};
use weir_cluster::admission::{RefusalReason, shared_bucket_of};

use super::{App, MAX_KEY_BYTES};
use crate::error::{ApiError, ErrorKind};
use crate::leases::{Held, Hold};

/// An acquisition, as either API received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireInput {
    /// The policy's name.
    pub policy: String,
    /// The bucket key.
    pub key: String,
    /// The kind, if the request has one.
    pub kind: Option<String>,
    /// The cost (absent: 1).
    pub cost: Option<u64>,
    /// The longest the caller waits.
    pub max_wait_ms: Option<u64>,
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

/// How an acquisition ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// Admitted.
    Admitted {
        /// How long it waited.
        waited: Duration,
        /// The lease to release (concurrency policies), with its time to live.
        lease: Option<(String, Duration)>,
        /// Admitted only because the policy monitors.
        would_throttle: bool,
        /// The limit of the policy's buckets, for the RateLimit header fields.
        limit: Option<f64>,
        /// Which tier admitted it.
        tier: AdmissionTier,
    },
    /// Refused.
    Refused {
        /// When asking again could succeed, if known.
        retry_after: Option<Duration>,
        /// Why, in a sentence.
        reason: String,
        /// The limit of the policy's buckets.
        limit: Option<f64>,
    },
}

impl App {
    /// Admits (or refuses) one request; waits if the policy says so, unless shutdown begins.
    ///
    /// Traced (see the `traces` module): one span per admission, with how it ended.
    pub async fn acquire(&self, input: &AcquireInput) -> Result<AcquireOutcome, ApiError> {
        let span = tracing::trace_span!(
            target: "weir::admission",
            "admission",
            policy = %input.policy,
            kind = input.kind.as_deref().unwrap_or_default(),
            key = %input.key,
            cost = input.cost.unwrap_or(1),
            tier = tracing::field::Empty,
            decision = tracing::field::Empty,
        );
        if span.is_disabled() {
            return self.decide(input).await;
        }
        let outcome = tracing::Instrument::instrument(self.decide(input), span.clone()).await;
        let decision = match &outcome {
            Ok(AcquireOutcome::Admitted {
                tier,
                would_throttle,
                ..
            }) => {
                span.record("tier", tier.name());
                if *would_throttle {
                    "would_throttle"
                } else {
                    "admitted"
                }
            }
            Ok(AcquireOutcome::Refused { .. }) => "refused",
            Err(_) => "error",
        };
        span.record("decision", decision);
        outcome
    }

    /// [`acquire`](Self::acquire)'s decision.
    async fn decide(&self, input: &AcquireInput) -> Result<AcquireOutcome, ApiError> {
        if input.key.is_empty() {
            return Err(ApiError::invalid("`key` must not be empty"));
        }
        if input.key.len() > MAX_KEY_BYTES {
            return Err(ApiError::invalid(format!(
                "`key` is {} bytes long; the most is {MAX_KEY_BYTES}",
                input.key.len()
            )));
        }
        let policy = self
            .policies
            .get(&input.policy)
            .ok_or_else(|| ApiError::unknown_policy(&input.policy))?;
        // Only what the decision needs: the config itself is not copied per request.
        let (max_cost, lease_ttl, shares, in_redis) = policy.with_config(|config| {
            let concurrency = config.concurrency();
            (
                config.max_cost.unwrap_or(self.max_cost),
                concurrency.map(|c| c.lease_ttl),
                concurrency.is_some_and(|c| c.shared.shared_limit > 0)
                    && config.mode == weir::policy::Mode::Enforce,
                config.scope == weir::policy::Scope::Redis,
            )
        });
        if in_redis && self.redis.is_none() {
            // Committed by the cluster through a member that has a Redis: decided here per
            // node, it would admit the policy's limit on every member.
            return Err(ApiError::new(
                ErrorKind::NotReady,
                format!(
                    "policy `{}` keeps its buckets in Redis (`scope = \"redis\"`), and this node's config has no `[redis]`: it cannot decide it; send the request to a member with one, or give this node the cluster's `[redis]`",
                    input.policy
                ),
            ));
        }
        let cost = input.cost.unwrap_or(1);
        if cost == 0 || cost > max_cost {
            return Err(ApiError::invalid(format!(
                "`cost` must be between 1 and {max_cost} for policy `{}`, got {cost}",
                input.policy
            )));
        }
        let mut request = Request::new(&input.key).cost(cost);
        request.kind = input.kind.as_deref();
        if let Some(ms) = input.max_wait_ms {
            request = request.max_wait(Duration::from_millis(ms));
        }
        let limit = policy.limit_for(input.kind.as_deref());
        if let Some(decided) = self.decide_in_redis(&policy, input, cost, limit).await {
            return decided;
        }
        if let Some(decided) = self.forward_rate(&policy, input, cost, limit).await {
            return Ok(decided);
        }
        self.set_aside_quota(&policy, input.kind.as_deref(), &input.key, cost);
        // Most requests are decided on their first poll; only one that waits needs to hear of
        // a shutdown, and listening for one costs a subscription per request.
        let acquire = policy.acquire(&request);
        let mut acquire = std::pin::pin!(acquire);
        let decided = match std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await
        {
            Poll::Ready(decided) => decided,
            Poll::Pending => tokio::select! {
                decided = acquire => decided,
                () = self.shutting_down() => return Err(ApiError::shutting_down()),
            },
        };
        match decided {
            Ok(admission) => {
                let waited = admission.waited();
                let would_throttle = admission.would_throttle();
                let lease = match lease_ttl {
                    Some(ttl) if admission.applied() => {
                        match self.hold(&policy, &input.policy, Hold::Node(admission), ttl) {
                            Some(lease) => Some(lease),
                            None => return Ok(removed_while_waiting(&input.policy, limit)),
                        }
                    }
                    // A rate limiter's admission is done as soon as it is answered.
                    _ => None,
                };
                Ok(AcquireOutcome::Admitted {
                    waited,
                    lease,
                    would_throttle,
                    limit,
                    tier: AdmissionTier::Node,
                })
            }
            // A full node tier of a concurrency policy with a shared limit: in cluster mode,
            // ask the bucket's owner for a shared lease.
            Err(Rejection {
                reason: RejectReason::InFlightFull,
                ..
            }) if shares && self.cluster.is_some() => {
                Ok(self.acquire_shared(&policy, input, limit).await)
            }
            Err(rejection) => Ok(AcquireOutcome::Refused {
                retry_after: rejection.retry_after(),
                reason: rejection.to_string(),
                limit,
            }),
        }
    }

    /// The shared tier: a lease from the bucket's owner, for a request the node tier refused.
    async fn acquire_shared(
        &self,
        policy: &Policy<SystemClock>,
        input: &AcquireInput,
        limit: Option<f64>,
    ) -> AcquireOutcome {
        let cluster = self.cluster.as_ref().expect("only asked in cluster mode");
        let config = policy.config();
        let concurrency = config
            .concurrency()
            .expect("only asked for concurrency policies");
        let coordinator = cluster.coordinator(&input.policy, concurrency, config.max_keys);
        match coordinator
            .acquire(&shared_bucket_of(&input.policy, &input.key))
            .await
        {
            Ok(admission) => {
                let tier = AdmissionTier::from(admission.tier);
                let Some(lease) = self.hold(
                    policy,
                    &input.policy,
                    Hold::Shared(admission, coordinator),
                    concurrency.lease_ttl,
                ) else {
                    return removed_while_waiting(&input.policy, limit);
                };
                AcquireOutcome::Admitted {
                    waited: Duration::ZERO,
                    lease: Some(lease),
                    would_throttle: false,
                    limit,
                    tier,
                }
            }
            Err(refusal) => {
                // The coordinator is shared-only (the policy's own keyed limiter is the node
                // tier, and it was full too): a full bucket here is full on both tiers.
                let reason = match refusal.reason {
                    RefusalReason::Full { shared_limit, .. } => RefusalReason::Full {
                        node_limit: concurrency.node_limit,
                        shared_limit,
                    },
                    other => other,
                };
                AcquireOutcome::Refused {
                    retry_after: refusal.retry_after,
                    reason: format!("policy `{}`: bucket `{}` {reason}", input.policy, input.key),
                    limit,
                }
            }
        }
    }

    /// Holds an admission of `policy` (named `name`) as a lease; returns its id and time to
    /// live, or `None` — the admission released — if the policy was removed meanwhile (a
    /// waiter handed a permit its removal freed). Checked after the lease is in the table: a
    /// removal then either came before (seen here) or releases the lease itself.
    fn hold(
        &self,
        policy: &Policy<SystemClock>,
        name: &str,
        admission: Hold,
        ttl: Duration,
    ) -> Option<(String, Duration)> {
        let held = Held {
            policy: name.to_owned(),
            admission,
        };
        let (id, _) = self.leases.insert(held, ttl, self.clock.now());
        let current = self
            .policies
            .get(name)
            .is_some_and(|running| std::ptr::eq(Arc::as_ptr(&running), policy));
        if !current {
            self.leases.release(id);
            return None;
        }
        Some((id.to_string(), ttl))
    }
}

/// The answer to a request whose policy was removed while it waited for its turn.
fn removed_while_waiting(policy: &str, limit: Option<f64>) -> AcquireOutcome {
    AcquireOutcome::Refused {
        retry_after: None,
        reason: format!("policy `{policy}` was removed while the request waited"),
        limit,
    }
}
