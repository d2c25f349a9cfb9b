//! What a reconfiguration replaces in one atomic swap: a policy's config and its engine — the
//! keyed limiters (default and per kind) or the adaptive controller — built from the config,
//! reusing and reshaping the limiters of the state before.

use std::collections::HashMap;
use std::sync::Arc;

use super::config::{self, Limiter, PolicyConfig, PolicyError};
use super::shapes::KindLimit;
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

/// What decides a policy's requests.
#[derive(Debug)]
pub(super) enum Engine<C: Clock + Clone> {
    /// A bucket per key: the default buckets, and the kinds overridden to their own (or none).
    Keyed {
        default: Arc<KeyedLimiter<C>>,
        kinds: HashMap<String, KindBuckets<C>>,
    },
    /// The controller of an adaptive policy.
    Adaptive(Arc<Backpressure<C>>),
}

/// Everything a reconfiguration replaces, swapped in one atomic step.
#[derive(Debug)]
pub(super) struct PolicyState<C: Clock + Clone> {
    pub(super) config: PolicyConfig,
    pub(super) engine: Engine<C>,
    pub(super) stats: Arc<PolicyStats>,
    pub(super) throttled: Arc<ThrottledKeys>,
}

impl<C: Clock + Clone> PolicyState<C> {
    /// The buckets for `kind`: `None` if the policy does not apply, `Some(None)` if the kind has
    /// no buckets (unlimited, or an adaptive policy).
    #[inline]
    pub(super) fn buckets(&self, kind: Option<&str>) -> Option<Option<&Arc<KeyedLimiter<C>>>> {
        if !self.config.applies_to(kind) {
            return None;
        }
        let Engine::Keyed { default, kinds } = &self.engine else {
            return Some(None);
        };
        match kind.and_then(|kind| kinds.get(kind)) {
            None => Some(Some(default)),
            Some(KindBuckets::Unlimited) => Some(None),
            Some(KindBuckets::Own(limiter)) => Some(Some(limiter)),
        }
    }

    /// The buckets a handed-over bucket of `kind` is in: the default buckets for `None`, a
    /// kind's own for its name; `None` if there are none such (an adaptive policy, a kind
    /// without buckets of its own).
    pub(super) fn limiter_of(&self, kind: Option<&str>) -> Option<&Arc<KeyedLimiter<C>>> {
        let Engine::Keyed { default, kinds } = &self.engine else {
            return None;
        };
        match kind {
            None => Some(default),
            Some(kind) => match kinds.get(kind) {
                Some(KindBuckets::Own(limiter)) => Some(limiter),
                _ => None,
            },
        }
    }

    /// The adaptive controller, if that is the engine.
    #[inline]
    pub(super) fn adaptive(&self) -> Option<&Arc<Backpressure<C>>> {
        match &self.engine {
            Engine::Adaptive(controller) => Some(controller),
            Engine::Keyed { .. } => None,
        }
    }

    /// The default buckets, if the engine keeps buckets per key.
    pub(super) fn default_buckets(&self) -> Option<&Arc<KeyedLimiter<C>>> {
        match &self.engine {
            Engine::Keyed { default, .. } => Some(default),
            Engine::Adaptive(_) => None,
        }
    }

    /// Every keyed limiter: the default and each kind's own.
    pub(super) fn keyed_limiters(&self) -> impl Iterator<Item = &Arc<KeyedLimiter<C>>> {
        let (default, kinds) = match &self.engine {
            Engine::Keyed { default, kinds } => (Some(default), Some(kinds)),
            Engine::Adaptive(_) => (None, None),
        };
        let own = kinds.into_iter().flat_map(|kinds| {
            kinds.values().filter_map(|buckets| match buckets {
                KindBuckets::Own(limiter) => Some(limiter),
                KindBuckets::Unlimited => None,
            })
        });
        default.into_iter().chain(own)
    }

    pub(super) fn counters(&self) -> StoreCounters {
        self.keyed_limiters()
            .map(|limiter| limiter.counters())
            .fold(StoreCounters::default(), |mut total, c| {
                total.keys += c.keys;
                total.evictions += c.evictions;
                total.overflow_hits += c.overflow_hits;
                total.sketched += c.sketched;
                total.sketch_bytes += c.sketch_bytes;
                total
            })
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
    let spec = match &config.limiter {
        Limiter::Keyed(spec) => spec,
        Limiter::Adaptive(adaptive) => {
            // In a policy the controller is on; monitor mode makes it a dry run (validation
            // refuses the controller's own switches in a policy).
            let settings = crate::backpressure::AdaptiveConfig {
                enabled: true,
                dry_run: config.mode == config::Mode::Monitor,
                ..adaptive.clone()
            };
            let invalid = |e| PolicyError::from_adaptive(&config.name, e);
            let controller = match old.and_then(|s| s.adaptive()) {
                Some(existing) => {
                    existing.reconfigure(settings).map_err(invalid)?;
                    Arc::clone(existing)
                }
                None => Arc::new(Backpressure::new(settings, clock.clone()).map_err(invalid)?),
            };
            return Ok(PolicyState {
                config: config.clone(),
                engine: Engine::Adaptive(controller),
                stats,
                throttled,
            });
        }
    };
    let reuse = |existing: Option<&Arc<KeyedLimiter<C>>>, shape: Shape| {
        if let Some(limiter) = existing
            && limiter.reshape(shape)
        {
            limiter.set_bounds(config.max_keys, config.overflow);
            return Arc::clone(limiter);
        }
        Arc::new(KeyedLimiter::new(
            shape,
            config.max_keys,
            config.overflow,
            clock.clone(),
        ))
    };
    let default = reuse(
        old.and_then(|s| s.default_buckets()),
        config.default_shape(cores)?,
    );
    let old_kinds = match old.map(|s| &s.engine) {
        Some(Engine::Keyed { kinds, .. }) => Some(kinds),
        _ => None,
    };
    let mut kinds = HashMap::new();
    for (kind, _) in spec.overrides() {
        match config.kind_limit(kind, cores)? {
            None | Some(KindLimit::Default) => {}
            Some(KindLimit::Unlimited) => {
                kinds.insert(kind.to_owned(), KindBuckets::Unlimited);
            }
            Some(KindLimit::Own(shape)) => {
                let existing = old_kinds.and_then(|k| match k.get(kind) {
                    Some(KindBuckets::Own(limiter)) => Some(limiter),
                    _ => None,
                });
                kinds.insert(kind.to_owned(), KindBuckets::Own(reuse(existing, shape)));
            }
        }
    }
    Ok(PolicyState {
        config: config.clone(),
        engine: Engine::Keyed { default, kinds },
        stats,
        throttled,
    })
}
