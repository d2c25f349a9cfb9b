//! `cluster-rate-accuracy`: a rate held across a cluster — three local nodes, traffic spread
//! over all three, each key's admitted rate over the whole cluster against its configured rate,
//! for a cluster-scoped policy (`scope = "cluster"`: its owner assigns the nodes that ask often
//! a share of a fast bucket's rate), the same with every request forwarded to the owner
//! (`assignments = false`), and the same policy per node.

use serde::Serialize;

use super::{Scenario, ScenarioSettings, finish, median, one_run};
use crate::nodes::{Workdir, start_cluster};
use crate::run::{self, TargetSpec};

/// The configured rates, per second: each as a cluster-scoped and as a per-node policy.
pub const CLUSTER_RATES: [u32; 3] = [10, 100, 1000];

/// How many times its rate each key is offered, over the three nodes together.
const OVERLOAD: f64 = 3.0;

/// The nodes.
const NODES: usize = 3;

/// One policy's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterAccuracyRow {
    /// The policy.
    pub policy: String,
    /// `cluster`, `forwarded` (cluster-scoped, `assignments = false`) or `node`.
    pub scope: &'static str,
    /// Its configured rate, per second.
    pub configured: f64,
    /// What the generator sent over all nodes, per second (median over the runs).
    pub sent: f64,
    /// What the cluster admitted, per second (median over the runs).
    pub admitted: f64,
    /// `admitted / configured`.
    pub ratio: f64,
}

/// `cluster-rate-accuracy`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterRateAccuracy {
    /// Measured seconds, per run.
    pub seconds: f64,
    /// How many times the policies ran.
    pub runs: usize,
    /// One row per policy.
    pub rows: Vec<ClusterAccuracyRow>,
    /// The largest `|ratio - 1|` of the cluster-scoped policies, assigned or forwarded.
    pub worst_deviation: f64,
}

impl ClusterRateAccuracy {
    /// The report as a table.
    pub fn render(&self) -> String {
        let mut text = format!(
            "cluster rate accuracy: {NODES} nodes, traffic spread over all, {:.1}s (median of {} run(s)), each key offered {OVERLOAD}× its rate\n{:>14} {:>8} {:>12} {:>12} {:>12} {:>8}\n",
            self.seconds, self.runs, "policy", "scope", "configured", "sent", "admitted", "ratio"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:>14} {:>8} {:>12.1} {:>12.1} {:>12.1} {:>8.4}\n",
                row.policy, row.scope, row.configured, row.sent, row.admitted, row.ratio
            ));
        }
        text.push_str(&format!(
            "worst deviation of the cluster-scoped policies: {:.2}%\n",
            self.worst_deviation * 100.0
        ));
        text
    }
}

/// Every rate as a cluster-scoped token bucket (assigned, and forwarded) and a per-node one,
/// refusing, with a burst of a tenth of a second's worth (at least 2; see `rate-accuracy` for
/// why not 1).
fn config() -> String {
    let mut toml = String::new();
    for rate in CLUSTER_RATES {
        let burst = (rate / 10).max(2);
        for (name, scope) in [
            ("cluster", "scope = \"cluster\""),
            ("forwarded", "scope = \"cluster\"\nassignments = false"),
            ("node", "scope = \"node\""),
        ] {
            toml.push_str(&format!(
                "[[policy]]\nname = \"{name}-{rate}\"\n{scope}\non_exhausted = \"reject\"\ntoken_bucket = {{ rate = {rate}, burst = {burst} }}\n\n"
            ));
        }
    }
    toml
}

/// Starts three nodes and offers each policy's one key three times its rate, over all three
/// nodes at once, `settings.runs` times; the medians.
pub async fn cluster_rate_accuracy(
    settings: &ScenarioSettings,
) -> anyhow::Result<ClusterRateAccuracy> {
    let dir = Workdir::new("cluster-rate-accuracy")?;
    let nodes = start_cluster(&settings.binary, &config(), dir.path(), NODES).await?;
    // Each node rebuilds its ring from the members it sees: let the last rebuild land.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let cluster = TargetSpec::Grpc(nodes.iter().map(|node| node.grpc.clone()).collect());
    let policies: Vec<(String, &'static str, u32)> = CLUSTER_RATES
        .into_iter()
        .flat_map(|rate| {
            [
                (format!("cluster-{rate}"), "cluster", rate),
                (format!("forwarded-{rate}"), "forwarded", rate),
                (format!("node-{rate}"), "node", rate),
            ]
        })
        .collect();
    let runs = settings.runs.max(1);
    let mut sent = vec![Vec::with_capacity(runs); policies.len()];
    let mut admitted = vec![Vec::with_capacity(runs); policies.len()];
    for _ in 0..runs {
        // Each policy's clients start at different nodes and ask them in turn.
        let handles: Vec<_> = policies
            .iter()
            .map(|(name, _, rate)| {
                let mut one = one_run(
                    cluster.clone(),
                    name,
                    f64::from(*rate) * OVERLOAD / NODES as f64,
                    settings,
                );
                one.clients = NODES;
                one.configured = Some(f64::from(*rate));
                tokio::spawn(async move { run::run(&one).await })
            })
            .collect();
        for (i, handle) in handles.into_iter().enumerate() {
            let report = handle.await??;
            if let Some(error) = report.first_error {
                anyhow::bail!("{}: {error}", policies[i].0);
            }
            sent[i].push(report.rps);
            admitted[i].push(report.admitted as f64 / report.seconds);
        }
    }
    drop(nodes);
    let rows: Vec<ClusterAccuracyRow> = policies
        .into_iter()
        .zip(sent.into_iter().zip(admitted))
        .map(|((policy, scope, rate), (sent, admitted))| {
            let configured = f64::from(rate);
            let admitted = median(admitted);
            ClusterAccuracyRow {
                policy,
                scope,
                configured,
                sent: median(sent),
                admitted,
                ratio: admitted / configured,
            }
        })
        .collect();
    let worst_deviation = rows
        .iter()
        .filter(|row| row.scope != "node")
        .map(|row| (row.ratio - 1.0).abs())
        .fold(0.0, f64::max);
    Ok(ClusterRateAccuracy {
        seconds: settings.duration.as_secs_f64(),
        runs,
        rows,
        worst_deviation,
    })
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "cluster-rate-accuracy",
    aliases: &[],
    measures: "cluster-scoped rates over 3 local nodes, assigned and forwarded, against per-node ones",
    figures: "docs/benchmarks.md, Cluster-scoped rates",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(cluster_rate_accuracy(settings), ClusterRateAccuracy::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rate_runs_at_both_scopes() {
        let config = weir_server::ConfigFile::parse(&config()).unwrap();
        let names: Vec<(&str, weir::policy::Scope)> = config
            .policy
            .iter()
            .map(|p| (p.name.as_str(), p.scope))
            .collect();
        assert_eq!(names.len(), 3 * CLUSTER_RATES.len());
        assert_eq!(names[0], ("cluster-10", weir::policy::Scope::Cluster));
        assert_eq!(names[1], ("forwarded-10", weir::policy::Scope::Cluster));
        assert_eq!(names[2], ("node-10", weir::policy::Scope::Node));
        assert!(config.policy[0].assignments && !config.policy[1].assignments);
    }
}
