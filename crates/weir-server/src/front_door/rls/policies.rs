//! The Weir policy each rule with a rate counts through: a `fixed_window` as the reference
//! server counts (the default), or the limiter `weir_algorithm` names, keyed by the
//! descriptor's values and named `rls:<domain>.<path>`; and each domain's counters of limits
//! sent with requests (`sent.rs`).

use std::time::Duration;

use weir::keyed::Overflow;
use weir::policy::{KeyedSpec, Limiter, Mode, OnExhausted, PolicyConfig, Scope};

use super::config::Unit;
use super::config::{Limit, RulesConfig};
use super::rules::{Rule, Tree};
use super::sent::counter_name;
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
    let mode = match rule.shadow_mode {
        true => Mode::Monitor,
        false => Mode::Enforce,
    };
    Some(counting(rule.policy_name(), mode, spec, settings, scope))
}

/// A policy that counts hits for RLS: deciding at once, keyed by descriptor values.
fn counting(
    name: String,
    mode: Mode,
    spec: KeyedSpec,
    settings: &RlsSettings,
    scope: Scope,
) -> PolicyConfig {
    PolicyConfig {
        name,
        kinds: Vec::new(),
        mode,
        on_exhausted: OnExhausted::Reject,
        max_wait: Duration::ZERO,
        max_keys: settings.max_keys,
        // Keys past the cap with none idle are counted in the sketch: never looser than a
        // bucket of their own, and one client filling the map does not lock out the rest.
        overflow: Overflow::Sketch,
        max_cost: None,
        scope,
        learning_period: Duration::ZERO,
        // The default; only a token bucket is ever shared out, and a window is never.
        assignments: true,
        limiter: Limiter::Keyed(spec),
    }
}

/// `domain`'s counters of limits sent with requests (`sent.rs`), one per unit, at `scope`:
/// fixed windows that count every hit and refuse none (the limit sent is compared with the
/// count by the caller).
fn counter_policies<'a>(
    domain: &'a str,
    settings: &'a RlsSettings,
    scope: Scope,
) -> impl Iterator<Item = PolicyConfig> + 'a {
    Unit::ALL.into_iter().map(move |unit| {
        let spec = KeyedSpec::per_window("fixed_window", u64::from(u32::MAX), unit.window())
            .expect("fixed_window is a window limiter's table");
        counting(
            counter_name(domain, unit),
            Mode::Enforce,
            spec,
            settings,
            scope,
        )
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
