//! `rate-assignments`: one hot rate bucket asked through the two nodes of a local 3-node
//! cluster that do not own it, decided three ways side by side:
//!
//! - `assigned`: `scope = "cluster"`, its owner lending each node a share of the rate, within
//!   which the node decides with no call;
//! - `forwarded`: `scope = "cluster"` with `assignments = false`, every request forwarded to
//!   the owner;
//! - `per-node`: `scope = "node"`, each node its own bucket (the floor: no cluster at all).
//!
//! The rate is far above the load (nothing is refused), so the figures are what each way
//! costs: admissions a second, the three nodes' CPU time per admission, the median latency, and
//! the share of admissions the asked nodes decided themselves. Each policy runs in turn, `runs`
//! times, and each row is the median and range over the runs.

use std::time::Duration;

use serde::Serialize;
use weir_cluster::rates::bucket_of;

use super::around_owner::{Spread, owner_among_three, run_around_owner};
use super::{Scenario, ScenarioSettings, finish, median};
use crate::nodes::{LocalNode, Workdir, start_cluster};

/// The cluster's policies: one bucket shape, three ways.
const CONFIG: &str = r#"
[[policy]]
name = "assigned"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 1000000, burst = 100000 }

[[policy]]
name = "forwarded"
scope = "cluster"
assignments = false
on_exhausted = "reject"
token_bucket = { rate = 1000000, burst = 100000 }

[[policy]]
name = "per-node"
on_exhausted = "reject"
token_bucket = { rate = 1000000, burst = 100000 }
"#;

/// The policies, in the order they run.
pub const POLICIES: [&str; 3] = ["assigned", "forwarded", "per-node"];

/// The one key every request names (the run's key 0).
const KEY: &str = "key-0";

/// Closed-loop clients, spread over the two nodes that do not own the bucket.
const CLIENTS: usize = 16;

/// One policy's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentRow {
    /// The policy.
    pub policy: String,
    /// Admissions a second.
    pub admitted_per_second: Spread,
    /// The three nodes' CPU time per admission, microseconds.
    pub cluster_cpu_us: Spread,
    /// Admissions the asked nodes decided themselves, as a share of all.
    pub decided_where_asked: Spread,
    /// Admission latency at the median, milliseconds (median over the runs).
    pub p50_ms: f64,
    /// Refused or failed requests over every run (0 unless something is wrong).
    pub refused: u64,
}

/// `rate-assignments`' report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateAssignments {
    /// Measured seconds per run.
    pub seconds: f64,
    /// Runs per policy.
    pub runs: usize,
    /// A row per policy.
    pub rows: Vec<AssignmentRow>,
}

impl RateAssignments {
    /// The report as a table, then the ratios to the per-node floor.
    pub fn render(&self) -> String {
        let mut text = format!(
            "one hot rate bucket on a local 3-node cluster, asked through the two nodes that do not own it ({CLIENTS} closed-loop clients; median [min–max] of {} runs of {:.0}s)\n{:<10} {:>26} {:>22} {:>22} {:>7} {:>7}\n",
            self.runs,
            self.seconds,
            "policy",
            "admitted/s",
            "cluster CPU µs/adm",
            "decided where asked",
            "p50 ms",
            "refused"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:<10} {:>26} {:>22} {:>22} {:>7.3} {:>7}\n",
                row.policy,
                row.admitted_per_second.show(0),
                row.cluster_cpu_us.show(1),
                row.decided_where_asked.show(3),
                row.p50_ms,
                row.refused
            ));
        }
        if let Some(floor) = self.row("per-node") {
            for policy in ["assigned", "forwarded"] {
                if let Some(row) = self.row(policy) {
                    text.push_str(&format!(
                        "{policy} over per-node: {:.2}× the admissions a second, {:.2}× the CPU per admission\n",
                        row.admitted_per_second.median / floor.admitted_per_second.median,
                        row.cluster_cpu_us.median / floor.cluster_cpu_us.median,
                    ));
                }
            }
        }
        text
    }

    fn row(&self, policy: &str) -> Option<&AssignmentRow> {
        self.rows.iter().find(|row| row.policy == policy)
    }
}

/// The node that owns `policy`'s bucket of [`KEY`] among `n1`, `n2`, `n3` (any, for a per-node
/// policy: the clients ask the same two nodes for every policy).
fn owner_of(policy: &str) -> usize {
    owner_among_three(&bucket_of(policy, KEY))
}

/// One run's figures for a row.
struct RunFigures {
    admitted_per_second: f64,
    cluster_cpu_us: f64,
    decided_where_asked: f64,
    p50_ms: f64,
    refused: u64,
}

/// Runs `policy` once, its clients on the nodes other than `owner`.
async fn run_once(
    policy: &str,
    owner: usize,
    nodes: &[LocalNode],
    settings: &ScenarioSettings,
) -> anyhow::Result<RunFigures> {
    let run = run_around_owner(
        policy,
        (owner, nodes),
        CLIENTS,
        ["forwarded", "assigned_admitted"],
        settings,
    )
    .await?;
    let ([forwarded, assigned], report) = (run.counted, run.report);
    let cpu: Duration = run.cpu.iter().sum();
    // The CPU time and the counters cover the warm-up too: admissions are counted the same way.
    let admissions = match policy {
        "per-node" => report.admitted as f64,
        _ => (forwarded + assigned).max(1) as f64,
    };
    let decided_where_asked = match policy {
        "per-node" => 1.0,
        _ => assigned as f64 / admissions,
    };
    Ok(RunFigures {
        admitted_per_second: report.admitted as f64 / report.seconds,
        cluster_cpu_us: cpu.as_secs_f64() * 1e6 / admissions,
        decided_where_asked,
        p50_ms: report.latency_ms.p50,
        refused: report.refused + report.errors,
    })
}

/// Starts three nodes, runs each policy `runs` times in turn and reports the spreads.
pub async fn rate_assignments(settings: &ScenarioSettings) -> anyhow::Result<RateAssignments> {
    let dir = Workdir::new("rate-assignments")?;
    let nodes = start_cluster(&settings.binary, CONFIG, dir.path(), 3).await?;
    // Each node rebuilds its ring from the members it sees: let the last rebuild land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs = settings.runs.max(1);
    // The per-node policy is asked through the same two nodes as the assigned one.
    let owners = [
        owner_of("assigned"),
        owner_of("forwarded"),
        owner_of("assigned"),
    ];
    let mut figures: [Vec<RunFigures>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (p, policy) in POLICIES.iter().enumerate() {
            figures[p].push(run_once(policy, owners[p], &nodes, settings).await?);
        }
    }
    let rows = POLICIES
        .iter()
        .zip(&figures)
        .map(|(policy, runs)| {
            let column = |f: fn(&RunFigures) -> f64| runs.iter().map(f).collect::<Vec<_>>();
            AssignmentRow {
                policy: (*policy).to_owned(),
                admitted_per_second: Spread::of(&column(|r| r.admitted_per_second)),
                cluster_cpu_us: Spread::of(&column(|r| r.cluster_cpu_us)),
                decided_where_asked: Spread::of(&column(|r| r.decided_where_asked)),
                p50_ms: median(column(|r| r.p50_ms)),
                refused: runs.iter().map(|r| r.refused).sum(),
            }
        })
        .collect();
    drop(nodes);
    Ok(RateAssignments {
        seconds: settings.duration.as_secs_f64(),
        runs,
        rows,
    })
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "rate-assignments",
    aliases: &[],
    measures: "one hot rate bucket through the nodes that do not own it: assigned shares, forwarding, per node",
    figures: "docs/benchmarks.md, Rate assignments",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(rate_assignments(settings), RateAssignments::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_policies_parse_as_the_three_ways() {
        let config = weir_server::ConfigFile::parse(CONFIG).unwrap();
        let ways: Vec<(&str, weir::policy::Scope, bool)> = config
            .policy
            .iter()
            .map(|p| (p.name.as_str(), p.scope, p.assignments))
            .collect();
        use weir::policy::Scope::{Cluster, Node};
        assert_eq!(
            ways,
            [
                ("assigned", Cluster, true),
                ("forwarded", Cluster, false),
                ("per-node", Node, true)
            ]
        );
    }
}
