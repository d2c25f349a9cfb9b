//! What a reconfiguration replaces in one atomic swap: a policy's config and its engine — the
//! keyed limiters (default and per kind) or the adaptive controller — built from the config,
//! reusing and reshaping the limiters of the state before.

use std::collections::HashMap;
use std::sync::Arc;

use super::config::{self, KindLimit, LimiterSpec, PolicyConfig, PolicyError};
use super::stats::PolicyStats;
use super::throttled::ThrottledKeys;
use crate::backpressure::Backpressure;
use crate::clock::Clock;
use crate::keyed::{KeyedLimiter, Shape, StoreCounters};

/// The buckets a request of some kind is counted in.
#[derive(Debug)]
pub(super) enum KindBuckets<C: Clock + Clone> {
    Unlimited,
    Own(Arc<KeyedLimiter<C>>),
}

/// Everything a reconfiguration replaces, swapped in one atomic step.
#[derive(Debug)]
pub(super) struct PolicyState<C: Clock + Clone> {
    pub(super) config: PolicyConfig,
    /// The default buckets (`None` for an adaptive policy).
    pub(super) default: Option<Arc<KeyedLimiter<C>>>,
    pub(super) kinds: HashMap<String, KindBuckets<C>>,
    /// The controller of an adaptive policy.
    pub(super) adaptive: Option<Arc<Backpressure<C>>>,
    pub(super) stats: Arc<PolicyStats>,
    pub(super) throttled: Arc<ThrottledKeys>,
}

impl<C: Clock + Clone> PolicyState<C> {
    /// The buckets for `kind`: `None` if the policy does not apply, `Some(None)` if the kind has
    /// no buckets (unlimited, or an adaptive policy).
    #[inline]
    pub(super) fn buckets(&self, kind: &str) -> Option<Option<&Arc<KeyedLimiter<C>>>> {
        if !self.config.applies_to(kind) {
            return None;
        }
        match self.kinds.get(kind) {
            None => Some(self.default.as_ref()),
            Some(KindBuckets::Unlimited) => Some(None),
            Some(KindBuckets::Own(limiter)) => Some(Some(limiter)),
        }
    }

    pub(super) fn counters(&self) -> StoreCounters {
        let mut total = self
            .default
            .as_ref()
            .map(|d| d.counters())
            .unwrap_or_default();
        for buckets in self.kinds.values() {
            if let KindBuckets::Own(limiter) = buckets {
                let c = limiter.counters();
                total.keys += c.keys;
                total.evictions += c.evictions;
                total.overflow_hits += c.overflow_hits;
            }
        }
        total
    }
}

/// Builds the buckets for `config`, reusing (and reshaping) those of `old` where the kind of
/// limiter is unchanged.
pub(super) fn build_state<C: Clock + Clone>(
    config: &PolicyConfig,
    old: Option<&PolicyState<C>>,
    clock: &C,
    cores: usize,
    stats: Arc<PolicyStats>,
    throttled: Arc<ThrottledKeys>,
) -> Result<PolicyState<C>, PolicyError> {
    if let LimiterSpec::Adaptive(adaptive) = config.limiter()? {
        // In a policy the controller is on; monitor mode makes it a dry run.
        let settings = crate::backpressure::AdaptiveConfig {
            enabled: true,
            dry_run: adaptive.dry_run || config.mode == config::Mode::Monitor,
            ..adaptive.clone()
        };
        let invalid = |e| PolicyError::from_adaptive(&config.name, e);
        let controller = match old.and_then(|s| s.adaptive.as_ref()) {
            Some(existing) => {
                existing.reconfigure(settings).map_err(invalid)?;
                Arc::clone(existing)
            }
            None => Arc::new(Backpressure::new(settings, clock.clone()).map_err(invalid)?),
        };
        return Ok(PolicyState {
            config: config.clone(),
            default: None,
            kinds: HashMap::new(),
            adaptive: Some(controller),
            stats,
            throttled,
        });
    }
    let reuse = |existing: Option<&Arc<KeyedLimiter<C>>>, shape: Shape| {
        if let Some(limiter) = existing {
            if limiter.reshape(shape) {
                limiter.set_bounds(config.max_keys, config.overflow);
                return Arc::clone(limiter);
            }
        }
        Arc::new(KeyedLimiter::new(
            shape,
            config.max_keys,
            config.overflow,
            clock.clone(),
        ))
    };
    let default = reuse(
        old.and_then(|s| s.default.as_ref()),
        config.default_shape(cores)?,
    );
    let mut kinds = HashMap::new();
    let spec = config.limiter()?;
    for kind in spec.overrides().keys() {
        match config.kind_limit(kind, cores)? {
            None | Some(KindLimit::Default) => {}
            Some(KindLimit::Unlimited) => {
                kinds.insert(kind.clone(), KindBuckets::Unlimited);
            }
            Some(KindLimit::Own(shape)) => {
                let existing = old.and_then(|s| match s.kinds.get(kind) {
                    Some(KindBuckets::Own(limiter)) => Some(limiter),
                    _ => None,
                });
                kinds.insert(kind.clone(), KindBuckets::Own(reuse(existing, shape)));
            }
        }
    }
    Ok(PolicyState {
        config: config.clone(),
        default: Some(default),
        kinds,
        adaptive: None,
        stats,
        throttled,
    })
}
