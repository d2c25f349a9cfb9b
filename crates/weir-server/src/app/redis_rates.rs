//! Rate policies whose buckets live in Redis (`scope = "redis"`, or every rate policy with
//! `[redis] every_policy`): each decision asked of Redis, whatever the protocol it came by.
//!
//! A waiting policy waits here, between asks: refused with a retry-after within what is left
//! of its wait, the request sleeps that long and asks again. Unlike a bucket of this node's,
//! the waiters are not served in arrival order (each node's waiters ask Redis on their own).
//! A decision Redis cannot make is `on_unavailable`'s: admitted with the tier `fail_open`, or
//! refused.

use std::time::{Duration, Instant};

use weir::SystemClock;
use weir::keyed::Shape;
use weir::limiter::Quota;
use weir::policy::{BucketShape, Mode, OnExhausted, Policy, RejectReason, Rejection, Scope};

use super::App;
use super::admission::{AcquireInput, AcquireOutcome, AdmissionTier};
use crate::error::ApiError;
use crate::redis_buckets::{RedisBuckets, RedisDecision, RedisErrorKind, Unavailable};

/// What Redis said of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RedisAnswer {
    /// Redis decided.
    Decided {
        /// Its decision.
        decision: RedisDecision,
        /// What the bucket has spent and left after it.
        quota: Quota,
    },
    /// Redis could not decide; `on_unavailable` says admit.
    FailOpen,
    /// Redis could not decide; `on_unavailable` says refuse.
    FailClosed,
    /// Redis answered with an error (it was there, and said no): refused, naming it.
    Error {
        /// What it was.
        kind: RedisErrorKind,
    },
}

impl App {
    /// The Redis `policy`'s buckets live in, if they live in one.
    fn redis_of(&self, policy: &Policy<SystemClock>) -> Option<&RedisBuckets> {
        let redis = self.redis.as_deref()?;
        let in_redis = redis.settings().every_policy
            || policy.with_config(|config| config.scope == Scope::Redis);
        in_redis.then_some(redis)
    }

    /// Asks Redis to decide `cost` of `policy`'s bucket of `key` for a request of `kind`;
    /// `None` if the bucket does not live in Redis (no Redis, another scope, a kind the
    /// policy leaves unlimited or does not apply to, a shape Redis does not keep).
    pub(super) async fn ask_redis(
        &self,
        policy: &Policy<SystemClock>,
        kind: Option<&str>,
        key: &str,
        cost: u64,
    ) -> Option<RedisAnswer> {
        let redis = self.redis_of(policy)?;
        let (shape, own_kind) = match policy.shape_for(kind) {
            BucketShape::Default(shape) => (shape, None),
            BucketShape::Own(shape) => (shape, kind),
            BucketShape::Unlimited | BucketShape::NotApplicable => return None,
        };
        let capacity = match shape {
            Shape::Gcra { capacity, .. } => capacity,
            Shape::Strict { .. } => 1,
            Shape::Window { limit, .. } => limit,
            Shape::Concurrency { .. } => return None,
        };
        match redis
            .decide(policy.name(), own_kind, key, shape, cost)
            .await
        {
            Ok(decision) => Some(RedisAnswer::Decided {
                decision,
                quota: Quota {
                    used: capacity.saturating_sub(decision.remaining),
                    remaining: decision.remaining,
                    reset_after: decision.reset_after,
                },
            }),
            Err(why) => {
                let kind = why.kind()?;
                if !kind.is_outage() {
                    redis
                        .counters
                        .error
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Some(RedisAnswer::Error { kind });
                }
                Some(match redis.settings().on_unavailable {
                    Unavailable::Open => {
                        redis
                            .counters
                            .fail_open
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        RedisAnswer::FailOpen
                    }
                    Unavailable::Closed => {
                        redis
                            .counters
                            .fail_closed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        RedisAnswer::FailClosed
                    }
                })
            }
        }
    }

    /// For a policy whose buckets live in Redis: the decision on `input` (waiting, if the
    /// policy waits, by asking again); `None` to decide elsewhere.
    pub(super) async fn decide_in_redis(
        &self,
        policy: &Policy<SystemClock>,
        input: &AcquireInput,
        cost: u64,
        limit: Option<f64>,
    ) -> Option<Result<AcquireOutcome, ApiError>> {
        self.redis_of(policy)?;
        let (monitors, max_wait) = policy.with_config(|config| {
            let waits = config.on_exhausted == OnExhausted::Wait && config.mode == Mode::Enforce;
            let max_wait = match (waits, input.max_wait_ms) {
                (false, _) => Duration::ZERO,
                (true, Some(ms)) => Duration::from_millis(ms).min(config.max_wait),
                (true, None) => config.max_wait,
            };
            (config.mode == Mode::Monitor, max_wait)
        });
        let started = Instant::now();
        let mut slept = false;
        loop {
            let answer = self
                .ask_redis(policy, input.kind.as_deref(), &input.key, cost)
                .await?;
            let decision = match answer {
                RedisAnswer::Decided { decision, .. } => decision,
                RedisAnswer::FailOpen => {
                    return Some(Ok(AcquireOutcome::Admitted {
                        waited: started.elapsed(),
                        lease: None,
                        would_throttle: false,
                        limit,
                        tier: AdmissionTier::FailOpen,
                    }));
                }
                RedisAnswer::Error { kind } => {
                    return Some(Ok(AcquireOutcome::Refused {
                        retry_after: None,
                        reason: format!(
                            "policy `{}`: the Redis its buckets live in answered with an error ({}; see weir_redis_errors_total and the log): not decided",
                            policy.name(),
                            kind.name()
                        ),
                        limit,
                    }));
                }
                RedisAnswer::FailClosed => {
                    return Some(Ok(AcquireOutcome::Refused {
                        retry_after: None,
                        reason: format!(
                            "policy `{}`: the Redis its buckets live in could not decide (`on_unavailable = \"closed\"`)",
                            policy.name()
                        ),
                        limit,
                    }));
                }
            };
            if decision.admitted || monitors {
                return Some(Ok(AcquireOutcome::Admitted {
                    waited: started.elapsed(),
                    lease: None,
                    would_throttle: !decision.admitted,
                    limit,
                    tier: AdmissionTier::Redis,
                }));
            }
            let waited = started.elapsed();
            if waited + decision.retry_after > max_wait || decision.retry_after.is_zero() {
                let rejection = Rejection {
                    policy: policy.name().to_owned(),
                    // A request that has not slept was refused at once, however long the
                    // round trip to Redis took.
                    reason: match !slept {
                        true => RejectReason::Limited {
                            retry_after: decision.retry_after,
                        },
                        false => RejectReason::WaitedTooLong { max_wait },
                    },
                };
                return Some(Ok(AcquireOutcome::Refused {
                    retry_after: Some(decision.retry_after),
                    reason: rejection.to_string(),
                    limit,
                }));
            }
            slept = true;
            tokio::select! {
                () = tokio::time::sleep(decision.retry_after) => {}
                () = self.shutting_down() => return Some(Err(ApiError::shutting_down())),
            }
        }
    }
}
