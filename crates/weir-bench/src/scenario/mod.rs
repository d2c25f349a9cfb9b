//! The named experiments `weir bench scenario NAME` runs, each starting and stopping what it
//! needs (local `weir serve` nodes, a toy backend) and printing one table.
//!
//! Each is registered once, by the [`Scenario`] its file declares (its name for what it
//! measures, older names kept as aliases, its help, where its figures go) and one line in
//! [`SCENARIOS`]; the command line's help and its check of the name are read from that list.
//!
//! | file | scenario | measures |
//! |---|---|---|
//! | `rate_accuracy.rs` | `rate-accuracy` | many buckets at different rates, admitted against configured |
//! | `cluster_rate_accuracy.rs` | `cluster-rate-accuracy` | cluster-scoped rates held over three local nodes |
//! | `two_tier_latency.rs` | `two-tier-latency` | the two tiers' admission latency on a local 3-node cluster |
//! | `owner_throughput.rs` | `owner-throughput` | shared admissions of one hot bucket, with loans and without |
//! | `rate_assignments.rs` | `rate-assignments` | one hot rate bucket: assigned shares, forwarding, per node |
//! | `tenant_throttling.rs` | `tenant-throttling` | per-tenant page-read workloads against one node, with its CPU use |
//! | `adaptive_backpressure.rs` | `adaptive-backpressure` | adaptive backpressure against a toy busy backend, both controls |
//! | `rolling_restart.rs` | `rolling-restart` | a rolling restart of three local nodes under load, per restart |
//!
//! `around_owner.rs` holds what the two scenarios of one hot bucket share: its owner among
//! three nodes, a run through the other two with the nodes' CPU and counters around it, and a
//! figure's spread over the runs.

pub mod adaptive_backpressure;
mod around_owner;
pub mod cluster_rate_accuracy;
pub mod owner_throughput;
pub mod rate_accuracy;
pub mod rate_assignments;
pub mod rolling_restart;
pub mod tenant_throttling;
pub mod two_tier_latency;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;

pub use around_owner::{Spread, owner_among_three};

use super::keys::KeyDistribution;
use super::run::{HoldTime, RunSettings, TargetSpec};
use super::schedule::Profile;

/// A named experiment, as `weir bench scenario NAME` finds it.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Its name: what it measures.
    pub name: &'static str,
    /// Names it was known by before, still taken.
    pub aliases: &'static [&'static str],
    /// What it measures, in a line (the command's help).
    pub measures: &'static str,
    /// Where its figures are kept.
    pub figures: &'static str,
    /// Whether it can draw its first run (`--plot FILE.svg`).
    pub plots: bool,
    /// Whether it restarts its nodes, and so can start them on another release's binary and
    /// restart them on this one (`--from-binary`): a rolling upgrade.
    pub upgrades: bool,
    /// Runs it: its report, drawn into the file given if it plots.
    pub run: RunScenario,
}

/// How a scenario is run: a future of its report.
pub type RunScenario = for<'a> fn(&'a ScenarioSettings, Option<&'a Path>) -> ScenarioFuture<'a>;

/// A scenario's run under way.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<Finished>> + 'a>>;

/// `run`, finished as its report rendered by `render`.
fn finish<'a, R: Serialize + 'a>(
    run: impl Future<Output = anyhow::Result<R>> + 'a,
    render: fn(&R) -> String,
) -> ScenarioFuture<'a> {
    Box::pin(async move {
        let report = run.await?;
        Finished::of(&report, render(&report))
    })
}

/// Every scenario.
pub const SCENARIOS: &[Scenario] = &[
    rate_accuracy::SCENARIO,
    cluster_rate_accuracy::SCENARIO,
    two_tier_latency::SCENARIO,
    owner_throughput::SCENARIO,
    rate_assignments::SCENARIO,
    tenant_throttling::SCENARIO,
    adaptive_backpressure::SCENARIO,
    rolling_restart::SCENARIO,
];

/// The scenario `name` names (its name or an alias).
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name))
}

/// A scenario's report: its table and its JSON form.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The table.
    pub text: String,
    /// The JSON form (`--json`).
    pub json: serde_json::Value,
}

impl Finished {
    /// The report of `value`, rendered as `text`.
    pub fn of(value: &impl Serialize, text: String) -> anyhow::Result<Finished> {
        Ok(Finished {
            text,
            json: serde_json::to_value(value)?,
        })
    }
}

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
    /// Another `weir` binary (a previous release) the nodes start on before their first
    /// restart, for a scenario that [upgrades](Scenario::upgrades); `None`: [`binary`](Self::binary).
    pub from_binary: Option<PathBuf>,
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
    fn a_scenario_is_found_by_its_name_or_an_older_one() {
        assert_eq!(
            find("adaptive-backpressure").map(|s| s.name),
            Some("adaptive-backpressure")
        );
        assert_eq!(
            find("doris-backpressure").map(|s| s.name),
            Some("adaptive-backpressure")
        );
        assert_eq!(
            find("neon-throttle").map(|s| s.name),
            Some("tenant-throttling")
        );
        assert_eq!(
            find("opensearch-latency").map(|s| s.name),
            Some("two-tier-latency")
        );
        assert!(find("nope").is_none());
        let mut names: Vec<&str> = SCENARIOS
            .iter()
            .flat_map(|s| std::iter::once(s.name).chain(s.aliases.iter().copied()))
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a name or alias used twice");
    }

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
