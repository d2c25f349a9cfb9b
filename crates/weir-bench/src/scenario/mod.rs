//! The named experiments `weir bench scenario NAME` runs, each starting and stopping what it
//! needs (local `weir serve` nodes, a toy backend) and printing one table.
//!
//! - [`rate_accuracy`]: many buckets at different rates, admitted against configured;
//! - [`cluster_rate_accuracy`]: cluster-scoped rates held over three local nodes;
//! - [`opensearch_latency`]: the two tiers' admission-latency table on a local 3-node cluster;
//! - [`owner_throughput`]: shared admissions of one hot bucket, with loans and without;
//! - [`neon_throttle`]: per-tenant page-read workloads against one node, with its CPU use;
//! - [`doris_backpressure`]: adaptive backpressure against a toy busy backend, the step-wise
//!   and the converging control side by side.

pub mod cluster_rate_accuracy;
pub mod doris_backpressure;
pub mod neon_throttle;
pub mod opensearch_latency;
pub mod owner_throughput;
pub mod rate_accuracy;

use std::path::PathBuf;
use std::time::Duration;

use super::keys::KeyDistribution;
use super::run::{HoldTime, RunSettings, TargetSpec};
use super::schedule::Profile;

/// The scenarios' names, as `weir bench scenario NAME` takes them.
pub const NAMES: [&str; 6] = [
    "rate-accuracy",
    "cluster-rate-accuracy",
    "opensearch-latency",
    "owner-throughput",
    "neon-throttle",
    "doris-backpressure",
];

/// What every scenario is told.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSettings {
    /// The measured time of each run.
    pub duration: Duration,
    /// Time run first in each run and not counted.
    pub warmup: Duration,
    /// How many times each measurement is repeated (the median is reported).
    pub runs: usize,
    /// The `weir` binary the scenario starts nodes from.
    pub binary: PathBuf,
}

/// A run's settings with the fields scenarios rarely change filled in: one client at
/// `rate`, steady, one key, no hold, precise pacing, no progress line.
fn one_run(
    target: TargetSpec,
    policy: &str,
    rate: f64,
    settings: &ScenarioSettings,
) -> RunSettings {
    RunSettings {
        target,
        policy: policy.to_owned(),
        kind: String::new(),
        cost: 1,
        clients: 1,
        rate,
        profile: Profile::Steady,
        keys: 1,
        distribution: KeyDistribution::Uniform,
        duration: settings.duration,
        warmup: settings.warmup,
        hold: HoldTime::None,
        progress: false,
        precise_pacing: true,
        configured: None,
    }
}

/// The median of `values` (the lower middle one of an even count); 0 for none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n => values[(n - 1) / 2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
