//! The Weir policy each rule with a rate counts through: a `fixed_window` as the reference
//! server counts (the default), or a `token_bucket` where `weir_algorithm` says so, keyed by the
//! descriptor's values and named `rls:<domain>.<path>`.

use std::time::Duration;

use weir::keyed::Overflow;
use weir::policy::{FixedWindowSpec, Scope, TokenBucketSpec};
use weir::policy::{KeyedSpec, Limiter, Mode, OnExhausted, PolicyConfig};

use super::config::{Algorithm, Limit, RulesConfig};
use super::rules::{Rule, Tree};
use super::settings::RlsSettings;

/// The policy that counts for a rule with a rate, or `None` (unlimited, or a limit of 0).
/// In cluster mode (`scope` cluster) each of its buckets is decided by its owner on the ring.
pub fn policy_of(rule: &Rule, settings: &RlsSettings, scope: Scope) -> Option<PolicyConfig> {
    let Limit::Rate {
        requests_per_unit,
        unit,
        algorithm,
        ..
    } = &rule.limit
    else {
        return None;
    };
    if *requests_per_unit == 0 {
        return None;
    }
    let spec = match algorithm {
        Algorithm::FixedWindow => KeyedSpec::FixedWindow(FixedWindowSpec {
            limit: u64::from(*requests_per_unit),
            window: unit.window(),
            per_core: false,
            overrides: Default::default(),
        }),
        Algorithm::TokenBucket => KeyedSpec::TokenBucket(TokenBucketSpec {
            rate: f64::from(*requests_per_unit) / unit.window().as_secs_f64(),
            burst: Some(u64::from(*requests_per_unit)),
            per_core: false,
            overrides: Default::default(),
        }),
    };
    Some(PolicyConfig {
        name: rule.policy_name(),
        kinds: Vec::new(),
        mode: if rule.shadow_mode {
            Mode::Monitor
        } else {
            Mode::Enforce
        },
        on_exhausted: OnExhausted::Reject,
        max_wait: Duration::ZERO,
        max_keys: settings.max_keys,
        // Keys past the cap with none idle are counted in the sketch: never looser than a
        // bucket of their own, and one client filling the map does not lock out the rest.
        overflow: Overflow::Sketch,
        max_cost: None,
        scope,
        learning_period: Duration::ZERO,
        limiter: Limiter::Keyed(spec),
    })
}

/// The policies `config`'s rules count through, at `scope`.
pub fn policies_of(
    config: &RulesConfig,
    settings: &RlsSettings,
    scope: Scope,
) -> Vec<PolicyConfig> {
    Tree::new(config)
        .rules()
        .iter()
        .filter_map(|rule| policy_of(rule, settings, scope))
        .collect()
}
