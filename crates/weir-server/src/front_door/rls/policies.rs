//! The Weir policy each rule with a rate counts through: a `fixed_window` as the reference
//! server counts (the default), or the limiter `weir_algorithm` names, keyed by the
//! descriptor's values and named `rls:<domain>.<path>`; and each domain's counters of limits
//! sent with requests (`sent.rs`).

use std::time::Duration;

use weir::keyed::Overflow;
use weir::policy::{Limiter, Mode, OnExhausted, PolicyConfig, Scope};

use super::config::{Limit, RulesConfig};
use super::rules::{Rule, Tree};
use super::sent::counter_policies;
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
    let spec = algorithm.spec(u64::from(*requests_per_unit), unit.window())?;
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
        assignments: true,
        limiter: Limiter::Keyed(spec),
    })
}

/// The policies `config`'s rules count through, at `scope`, and each domain's counters of
/// limits sent with requests.
pub fn policies_of(
    config: &RulesConfig,
    settings: &RlsSettings,
    scope: Scope,
) -> Vec<PolicyConfig> {
    let sent = config
        .domains
        .iter()
        .flat_map(|d| counter_policies(&d.domain, settings, scope));
    Tree::new(config)
        .rules()
        .iter()
        .filter_map(|rule| policy_of(rule, settings, scope))
        .chain(sent)
        .collect()
}
