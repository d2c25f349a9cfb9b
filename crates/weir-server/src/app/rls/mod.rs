//! What Envoy's rate limit service decides: every descriptor of a request through its rule's
//! policy, never waiting; in cluster mode each rule bucket by its owner on the ring; with
//! `[redis] every_policy`, in Redis.
//!
//! | file | job |
//! |---|---|
//! | `answer.rs` | a request's descriptors and its answer: statuses, header fields; why a request is refused whole |
//! | `decision.rs` | `Rls`: a request checked whole, matched, counted, answered |
//! | `counts.rs` | the reference server's own counters of each rule |
//! | `sent.rs` | limits sent with requests: where their hits count, and their answer |
//!
//! The wire, the rules and their config are [`crate::front_door::rls`]'s.

mod answer;
mod counts;
mod decision;
mod sent;

use std::time::Duration;

pub use answer::{Answer, Code, CurrentLimit, Descriptor, RequestError};
use decision::Counted;
pub use decision::Rls;

use super::App;
use super::redis_rates::RedisAnswer;
use weir_cluster::rates::Decided;

impl App {
    /// Answers `ShouldRateLimit`: `descriptors` in `domain`, each for its own hits or else
    /// `hits_addend` (0 = 1). A rule bucket another node owns is decided there; one its owner
    /// could not decide is decided here, and counted as such in `/v1/cluster`.
    ///
    /// `None`: this node has no RLS rules.
    pub async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Option<Result<Answer, RequestError>> {
        let rls = self.rls.as_ref()?.load();
        let prepared = match rls.prepare(domain, descriptors, hits_addend) {
            Ok(prepared) => prepared,
            Err(error) => return Some(Err(error)),
        };
        let mut elsewhere = Vec::new();
        if self.cluster.is_some() || self.redis.is_some() {
            for (step, policy, key, hits) in rls.rule_decisions(&prepared) {
                let Some(policy) = self.policies.get(&policy) else {
                    continue;
                };
                // A rule whose buckets live in Redis (`[redis] every_policy`): counted there.
                if let Some(answer) = self.ask_redis(&policy, None, &key, hits).await {
                    let counted = match answer {
                        RedisAnswer::Decided { decision, quota } => Counted {
                            over: !decision.admitted,
                            quota: Some(quota),
                        },
                        RedisAnswer::FailOpen => Counted {
                            over: false,
                            quota: None,
                        },
                        RedisAnswer::FailClosed | RedisAnswer::Error { .. } => Counted {
                            over: true,
                            quota: None,
                        },
                    };
                    elsewhere.push((step, counted));
                    continue;
                }
                if self.cluster.is_none() {
                    continue;
                }
                let counted = match self
                    .ask_owner(&policy, &key, None, hits, Duration::ZERO)
                    .await
                {
                    Some(Decided::Admitted {
                        would_throttle,
                        quota,
                        ..
                    }) => Counted {
                        over: would_throttle,
                        quota,
                    },
                    Some(Decided::Refused { quota, .. }) => Counted { over: true, quota },
                    None => continue,
                };
                elsewhere.push((step, counted));
            }
        }
        Some(Ok(rls.finish(prepared, elsewhere)))
    }
}
