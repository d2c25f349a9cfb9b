//! The shape of a policy's buckets: its limiter's, scaled per core, or a kind's override.

use super::config::{KeyedSpec, Override, PolicyConfig};
use super::error::PolicyError;
use crate::error::ConfigError;
use crate::keyed::Shape;
use crate::limiter::{LeakyBucketConfig, StrictConfig, TokenBucketConfig, WindowConfig};

/// How a kind is limited under a policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KindLimit {
    /// The policy's default buckets.
    Default,
    /// No limit for this kind (override 0): admitted, counted, never throttled.
    Unlimited,
    /// Buckets of its own, of this shape (override > 0).
    Own(Shape),
}

fn core_factor(spec: &KeyedSpec, cores: usize) -> f64 {
    if spec.per_core() {
        cores.max(1) as f64
    } else {
        1.0
    }
}

/// Scales a whole count, rounding to nearest and keeping a non-zero count non-zero.
fn scale_count(count: u64, factor: f64) -> u64 {
    if count == 0 {
        return 0;
    }
    ((count as f64 * factor).round() as u64).max(1)
}

impl PolicyConfig {
    /// The shape of the default buckets, with `cores` applied where `per_core` is set. An
    /// adaptive policy has none: its keys are limited one by one.
    pub fn default_shape(&self, cores: usize) -> Result<Shape, PolicyError> {
        let Some(spec) = self.keyed() else {
            return Err(PolicyError::new(
                &self.name,
                "adaptive",
                "has no bucket shape: its keys are limited one by one",
            ));
        };
        self.shape_for(spec, core_factor(spec, cores))
    }

    /// How `kind` is limited: not at all (`None`: the policy does not apply to it), by the
    /// default buckets, without limit, or by buckets of its own.
    pub fn kind_limit(&self, kind: &str, cores: usize) -> Result<Option<KindLimit>, PolicyError> {
        if !self.applies_to(Some(kind)) {
            return Ok(None);
        }
        let Some(spec) = self.keyed() else {
            // An adaptive policy's controller decides per key; there are no per-kind buckets.
            return Ok(Some(KindLimit::Default));
        };
        match spec.override_of(kind) {
            None | Some(Override::Default) => Ok(Some(KindLimit::Default)),
            Some(Override::Unlimited) => Ok(Some(KindLimit::Unlimited)),
            Some(Override::Value(v)) => {
                let factor = core_factor(spec, cores);
                let shape = self.shape_with_value(spec, v, factor)?;
                Ok(Some(KindLimit::Own(shape)))
            }
        }
    }

    /// Whether the policy applies to requests of `kind` (`None`: of no kind, which only a
    /// policy for every kind sees).
    pub fn applies_to(&self, kind: Option<&str>) -> bool {
        self.kinds.is_empty() || kind.is_some_and(|kind| self.kinds.iter().any(|k| k == kind))
    }

    /// The limit a bucket of `shape` enforces, in the unit people read: requests (or tokens)
    /// per second for rate limiters, permits for concurrency.
    pub fn limit_of(shape: &Shape) -> f64 {
        match *shape {
            Shape::Gcra { interval, .. } | Shape::Strict { interval } => 1e9 / interval as f64,
            Shape::Concurrency { limit } => limit as f64,
            Shape::Window { window, limit, .. } => limit as f64 * 1e9 / window as f64,
        }
    }

    /// The default shape scaled by `factor` (1 = as configured).
    pub(super) fn shape_for(&self, spec: &KeyedSpec, factor: f64) -> Result<Shape, PolicyError> {
        let name = &self.name;
        let table = spec.table();
        let limiter_err = |e: ConfigError| PolicyError::from_limiter(name, table, &e);
        match spec {
            KeyedSpec::TokenBucket(s) => {
                let rate = s.rate * factor;
                let burst = scale_count(
                    s.burst.unwrap_or_else(|| s.rate.ceil().max(1.0) as u64),
                    factor,
                );
                Shape::try_from(TokenBucketConfig { rate, burst }).map_err(limiter_err)
            }
            KeyedSpec::LeakyBucket(s) => Shape::try_from(LeakyBucketConfig {
                initial: scale_count(s.initial, factor),
                refill_interval: s.refill_interval,
                refill_amount: scale_count(s.refill_amount, factor),
                max: scale_count(s.max, factor),
                fair: s.fair,
            })
            .map_err(limiter_err),
            KeyedSpec::Strict(s) => Shape::try_from(StrictConfig {
                qps: s.qps * factor,
            })
            .map_err(limiter_err),
            KeyedSpec::Window(count, s) => Shape::try_from(WindowConfig {
                count: *count,
                limit: scale_count(s.limit, factor),
                window: s.window,
            })
            .map_err(limiter_err),
            KeyedSpec::Concurrency(s) => {
                if s.lease_ttl.is_zero() {
                    return Err(PolicyError::new(
                        name,
                        "concurrency.lease_ttl",
                        "must be greater than zero",
                    ));
                }
                if s.shared.learning_period > s.lease_ttl {
                    return Err(PolicyError::new(
                        name,
                        "concurrency.learning_period",
                        format!(
                            "must not exceed lease_ttl ({:?}): to wait until every lease granted before has expired, use on_unavailable = \"closed\"",
                            s.lease_ttl
                        ),
                    ));
                }
                if s.shared.max_loan == 0 {
                    return Err(PolicyError::new(
                        name,
                        "concurrency.max_loan",
                        "must be at least 1 (1: no loans, every shared admission asks the owner)",
                    ));
                }
                Ok(Shape::Concurrency {
                    limit: scale_count(s.node_limit, factor),
                })
            }
        }
    }

    /// The shape with the limiter's main number replaced by `value` (an override), and the
    /// numbers tied to it scaled alike.
    pub(super) fn shape_with_value(
        &self,
        spec: &KeyedSpec,
        value: f64,
        factor: f64,
    ) -> Result<Shape, PolicyError> {
        let main = match spec {
            KeyedSpec::TokenBucket(s) => s.rate,
            KeyedSpec::LeakyBucket(s) => s.refill_amount as f64,
            KeyedSpec::Strict(s) => s.qps,
            KeyedSpec::Window(_, s) => s.limit as f64,
            KeyedSpec::Concurrency(_) => {
                // A concurrency override is the limit itself, not a ratio of a limit that may
                // be 0.
                let limit = scale_count(value.round() as u64, factor);
                return Ok(Shape::Concurrency { limit });
            }
        };
        self.shape_for(spec, factor * value / main)
    }
}
