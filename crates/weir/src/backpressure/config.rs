//! An adaptive policy's settings (`AdaptiveConfig`): which control, how hard it squeezes, how it
//! lets go — with their defaults and checks, and the timings and tunings the controls read.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::converging::Tuning;
use super::coordinator::Timing;
use super::machine::Squeeze;

fn is_false(value: &bool) -> bool {
    !*value
}

/// How an adaptive controller tightens and relaxes (`control = "…"`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Control {
    /// Cut the hot keys to a fair share of the capacity measured when busy, and raise every
    /// limited key gradually while quiet: limits settle just under the capacity.
    #[default]
    Converging,
    /// The design it comes from: each upgrade multiplies the top keys' limits by `ratio`, each
    /// quiet period undoes the newest upgrade whole.
    Stepwise,
}

/// The adaptive controller's settings (`adaptive = { … }` in a policy).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConfig {
    /// The global switch (default off: adaptive backpressure is opt-in). Not a policy field: a
    /// policy's controller is always on.
    #[serde(default, skip_serializing_if = "is_false")]
    pub enabled: bool,
    /// Decide and record, but never make a call wait. Not a policy field: a policy in
    /// `mode = "monitor"` is a dry run.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// How limits are tightened and relaxed (default converging).
    #[serde(default)]
    pub control: Control,
    /// The hottest keys per RPC type a busy signal may newly limit (default 2); keys outside them
    /// are never newly limited.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Each upgrade multiplies a key's limit by this (default 0.75). Converging: the deepest
    /// one cut goes (a key keeps at least this share of its limit or rate).
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    /// Limits never go below this many requests per second (default 1).
    #[serde(default = "default_floor")]
    pub floor: f64,
    /// The window rates are measured over (default 3 s). Fixed at creation.
    #[serde(default = "three_seconds", with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    pub window: Duration,
    /// The least time between two upgrades (default 3 s).
    #[serde(default = "three_seconds", with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    pub upgrade_interval: Duration,
    /// Quiet time after which one upgrade is undone (default 3 s). Converging: each quiet
    /// interval relaxes every limited key.
    #[serde(default = "three_seconds", with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    pub downgrade_interval: Duration,
    /// Converging: each quiet interval multiplies the capacity estimate by this, probing for
    /// more; from the third quiet interval in a row the step doubles each time (default 1.05).
    #[serde(default = "default_increase")]
    pub increase: f64,
    /// Converging: the share of the estimated capacity limits leave unused, so that busy
    /// answers stay rare (default 0.05).
    #[serde(default = "default_headroom")]
    pub headroom: f64,
    /// The RPC types that take part (default: every type seen).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpcs: Vec<String>,
    /// Keys whose rate is tracked, per RPC type (default 100 000).
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
}

fn default_top_k() -> usize {
    2
}

fn default_ratio() -> f64 {
    0.75
}

fn default_floor() -> f64 {
    1.0
}

fn default_increase() -> f64 {
    1.05
}

fn default_headroom() -> f64 {
    0.05
}

fn three_seconds() -> Duration {
    Duration::from_secs(3)
}

fn default_max_keys() -> usize {
    100_000
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            enabled: false,
            dry_run: false,
            control: Control::default(),
            top_k: default_top_k(),
            ratio: default_ratio(),
            floor: default_floor(),
            window: three_seconds(),
            upgrade_interval: three_seconds(),
            downgrade_interval: three_seconds(),
            increase: default_increase(),
            headroom: default_headroom(),
            rpcs: Vec::new(),
            max_keys: default_max_keys(),
        }
    }
}

/// An adaptive config that does not hold together; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`adaptive.{field}` {problem}")]
pub struct AdaptiveError {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl AdaptiveConfig {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), AdaptiveError> {
        let err = |field, problem: &str| {
            Err(AdaptiveError {
                field,
                problem: problem.to_owned(),
            })
        };
        if !(self.ratio > 0.0 && self.ratio < 1.0) {
            return err("ratio", "must be between 0 and 1 (exclusive)");
        }
        if !(self.floor.is_finite() && self.floor > 0.0) {
            return err("floor", "must be a finite number greater than zero");
        }
        // A key is never limited below the floor, so a floor a strict limiter can represent
        // keeps every limit the controller sets representable.
        if let Err(e) = (crate::limiter::StrictConfig { qps: self.floor }).validate() {
            let problem = e.to_string().replacen("`qps`", "it", 1);
            return err("floor", &problem);
        }
        if self.top_k == 0 {
            return err("top_k", "must be at least 1");
        }
        if self.window < Duration::from_millis(3) {
            return err("window", "must be at least 3ms");
        }
        if self.upgrade_interval.is_zero() {
            return err("upgrade_interval", "must be greater than zero");
        }
        if self.downgrade_interval.is_zero() {
            return err("downgrade_interval", "must be greater than zero");
        }
        if self.max_keys == 0 {
            return err("max_keys", "must be at least 1");
        }
        // A key's recent rate is measured over up to two thirds of the window; within one quiet
        // interval, a key just raised is judged on calls made under its new limit, not released
        // for still showing its old rate.
        if self.control == Control::Converging && self.downgrade_interval * 3 < self.window * 2 {
            return err(
                "downgrade_interval",
                "must be at least two thirds of `window` under converging control",
            );
        }
        if !(self.increase.is_finite() && self.increase > 1.0 && self.increase <= 2.0) {
            return err("increase", "must be greater than 1 and at most 2");
        }
        if !(self.headroom >= 0.0 && self.headroom < 1.0) {
            return err("headroom", "must be at least 0 and less than 1");
        }
        Ok(())
    }

    pub(super) fn timing(&self) -> Timing {
        Timing {
            upgrade_cooldown: self.upgrade_interval.as_millis() as u64,
            downgrade_after: self.downgrade_interval.as_millis() as u64,
        }
    }

    pub(super) fn squeeze(&self) -> Squeeze {
        Squeeze {
            ratio: self.ratio,
            floor: self.floor,
        }
    }

    pub(super) fn tuning(&self) -> Tuning {
        Tuning {
            ratio: self.ratio,
            floor: self.floor,
            increase: self.increase,
            headroom: self.headroom,
        }
    }
}
