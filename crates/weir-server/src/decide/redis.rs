//! A bucket kept in Redis (`scope = "redis"`, or every rate policy with `[redis]
//! every_policy`): each decision asked of Redis.
//!
//! A request that may wait waits here, between asks: refused with a retry-after within what
//! is left of its wait, it sleeps that long and asks again. Unlike a bucket of this node's,
//! the waiters are not served in arrival order (each node's waiters ask Redis on their own).
//! A decision Redis cannot make is `on_unavailable`'s: admitted with the tier `fail_open`, or
//! refused; an error Redis answers is a refusal naming it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use weir::SystemClock;
use weir::keyed::Shape;
use weir::limiter::Quota;
use weir::policy::{BucketShape, Policy, RejectReason, Rejection};

use super::waiting::Waiting;
use super::{AdmissionTier, Ask, Decider, Decision, Place, count_elsewhere};
use crate::error::ApiError;
use crate::redis_buckets::{RedisDecision, Unavailable};

impl Decider {
    /// `ask` of a policy whose buckets live in Redis (waiting, if the policy and the ask
    /// allow, by asking again); `None` to decide here: a bucket Redis does not keep (a kind
    /// the policy leaves unlimited or does not apply to, a shape Redis does not keep).
    pub(super) async fn decide_in_redis(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Option<Result<Decision, ApiError>> {
        let decided = self.decide_in_redis_uncounted(policy, ask).await;
        // Decided by Redis (or by `on_unavailable` for it): counted here, once, as the policy's.
        if let Some(Ok(decision)) = &decided {
            count_elsewhere(policy, ask, decision.is_over(), Place::Redis);
        }
        decided
    }

    async fn decide_in_redis_uncounted(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Option<Result<Decision, ApiError>> {
        let Waiting { max_wait, monitors } = Waiting::of(policy, ask.max_wait);
        let started = Instant::now();
        let mut slept = false;
        loop {
            let (decision, quota) = match self.ask_redis(policy, ask).await? {
                Ok(decided) => decided,
                Err(mut undecided) => {
                    if let Decision::Admitted { waited, .. } = &mut undecided {
                        *waited = started.elapsed();
                    }
                    return Some(Ok(undecided));
                }
            };
            if decision.admitted || monitors {
                return Some(Ok(Decision::Admitted {
                    waited: started.elapsed(),
                    would_throttle: !decision.admitted,
                    quota: Some(quota),
                    tier: AdmissionTier::Redis,
                }));
            }
            let waited = started.elapsed();
            if waited + decision.retry_after > max_wait || decision.retry_after.is_zero() {
                let rejection = Rejection {
                    policy: policy.name().to_owned(),
                    // A request that has not slept was refused at once, however long the
                    // round trip to Redis took.
                    reason: match slept {
                        false => RejectReason::Limited {
                            retry_after: decision.retry_after,
                        },
                        true => RejectReason::WaitedTooLong { max_wait },
                    },
                };
                return Some(Ok(Decision::Refused {
                    retry_after: Some(decision.retry_after),
                    reason: rejection.to_string(),
                    quota: Some(quota),
                }));
            }
            slept = true;
            tokio::select! {
                () = tokio::time::sleep(decision.retry_after) => {}
                () = self.shutting_down() => return Some(Err(ApiError::shutting_down())),
            }
        }
    }

    /// Asks Redis once: its decision and what the bucket has after it, or the answer when
    /// Redis could not decide (`on_unavailable`'s, or a refusal naming its error); `None` if
    /// the bucket does not live in Redis.
    async fn ask_redis(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Option<Result<(RedisDecision, Quota), Decision>> {
        let redis = self.redis.as_deref()?;
        let (shape, own_kind) = match policy.shape_for(ask.kind) {
            BucketShape::Default(shape) => (shape, None),
            BucketShape::Own(shape) => (shape, ask.kind),
            BucketShape::Unlimited | BucketShape::NotApplicable => return None,
        };
        let capacity = match shape {
            Shape::Gcra { capacity, .. } => capacity,
            Shape::Strict { .. } => 1,
            Shape::Window { limit, .. } => limit,
            Shape::Concurrency { .. } => return None,
        };
        let why = match redis
            .decide(policy.name(), own_kind, ask.key, shape, ask.cost)
            .await
        {
            Ok(decision) => {
                let quota = Quota {
                    used: decision
                        .count
                        .unwrap_or(capacity.saturating_sub(decision.remaining)),
                    remaining: decision.remaining,
                    reset_after: decision.reset_after,
                };
                return Some(Ok((decision, quota)));
            }
            Err(why) => why,
        };
        let kind = why.kind()?;
        let counters = &redis.counters;
        if !kind.is_outage() {
            counters.error.fetch_add(1, Ordering::Relaxed);
            return Some(Err(Decision::Refused {
                retry_after: None,
                reason: format!(
                    "policy `{}`: the Redis its buckets live in answered with an error ({}; see weir_redis_errors_total and the log): not decided",
                    policy.name(),
                    kind.name()
                ),
                quota: None,
            }));
        }
        Some(Err(match redis.settings().on_unavailable {
            Unavailable::Open => {
                counters.fail_open.fetch_add(1, Ordering::Relaxed);
                Decision::Admitted {
                    waited: std::time::Duration::ZERO,
                    would_throttle: false,
                    quota: None,
                    tier: AdmissionTier::FailOpen,
                }
            }
            Unavailable::Closed => {
                counters.fail_closed.fetch_add(1, Ordering::Relaxed);
                Decision::Refused {
                    retry_after: None,
                    reason: format!(
                        "policy `{}`: the Redis its buckets live in could not decide (`on_unavailable = \"closed\"`)",
                        policy.name()
                    ),
                    quota: None,
                }
            }
        }))
    }
}
