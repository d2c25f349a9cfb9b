//! Admitting one request, as the HTTP, gRPC and Redis protocols' acquires ask: a rate decided
//! wherever its bucket lives (`crate::decide`); a concurrency admission held as a lease, on
//! this node and, in cluster mode, through the shared pool.

use std::sync::Arc;
use std::time::Duration;

use weir::policy::{Policy, RejectReason, Rejection, Request};
use weir::{Clock, SystemClock};
use weir_cluster::admission::{RefusalReason, shared_bucket_of};

use super::{App, MAX_KEY_BYTES};
pub use crate::decide::AdmissionTier;
use crate::decide::{Ask, Decision};
use crate::error::ApiError;
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
        let (max_cost, lease_ttl, shares) = policy.with_config(|config| {
            let concurrency = config.concurrency();
            (
                config.max_cost.unwrap_or(self.max_cost),
                concurrency.map(|c| c.lease_ttl),
                concurrency.is_some_and(|c| c.shared.shared_limit > 0)
                    && config.mode == weir::policy::Mode::Enforce,
            )
        });
        let cost = input.cost.unwrap_or(1);
        if cost == 0 || cost > max_cost {
            return Err(ApiError::invalid(format!(
                "`cost` must be between 1 and {max_cost} for policy `{}`, got {cost}",
                input.policy
            )));
        }
        let limit = policy.limit_for(input.kind.as_deref());
        let max_wait = input.max_wait_ms.map(Duration::from_millis);
        let Some(lease_ttl) = lease_ttl else {
            // A rate: decided wherever its bucket lives, done as soon as it is answered.
            let ask = Ask {
                kind: input.kind.as_deref(),
                key: &input.key,
                cost,
                max_wait,
            };
            return Ok(match self.decider.decide(&policy, ask).await? {
                Decision::Admitted {
                    waited,
                    would_throttle,
                    tier,
                    ..
                } => AcquireOutcome::Admitted {
                    waited,
                    lease: None,
                    would_throttle,
                    limit,
                    tier,
                },
                Decision::Refused {
                    retry_after,
                    reason,
                    ..
                } => AcquireOutcome::Refused {
                    retry_after,
                    reason,
                    limit,
                },
            });
        };
        let mut request = Request::new(&input.key).cost(cost);
        request.kind = input.kind.as_deref();
        if let Some(max_wait) = max_wait {
            request = request.max_wait(max_wait);
        }
        match self.decider.acquire_here(&policy, &request).await? {
            Ok(admission) => {
                let waited = admission.waited();
                let would_throttle = admission.would_throttle();
                // A request the policy does not apply to (its kind) holds nothing.
                let lease = if admission.applied() {
                    let held = Hold::Node(admission);
                    match self.hold(&policy, &input.policy, held, lease_ttl) {
                        Some(lease) => Some(lease),
                        None => return Ok(removed_while_waiting(&input.policy, limit)),
                    }
                } else {
                    None
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
