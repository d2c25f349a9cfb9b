//! `owner-throughput`: how many shared admissions a bucket's owner lets a local 3-node cluster
//! make, with loans and without.
//!
//! One hot bucket of a shared-only concurrency policy (no node tier, a shared limit far above
//! the load, `closed`), asked as fast as it answers by closed-loop clients through the two
//! nodes that do not own it — so that, without loans, every admission is a lease taken from the
//! owner and given back to it over gRPC, and the owner is what limits the cluster. Two policies
//! side by side, run in turn, `runs` times each:
//!
//! - `leases`: `max_loan = 1`, a lease per admission;
//! - `loans`: the default `max_loan` (16), the owner lends each node units its requests take
//!   and put back with no call.
//!
//! Each row reports admissions a second, the owner's CPU time per admission, the whole
//! cluster's, and the share of admissions made from a loan (no call to the owner), as the
//! median and the range over the runs.

use std::time::Duration;

use serde::Serialize;
use weir_cluster::admission::shared_bucket_of;

use super::around_owner::{Spread, owner_among_three, run_around_owner};
use super::{Scenario, ScenarioSettings, finish, median};
use crate::nodes::{LocalNode, Workdir, start_cluster};

/// The cluster's policies.
const CONFIG: &str = r#"
[[policy]]
name = "leases"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 100000, lease_ttl = "2s", on_unavailable = "closed", max_loan = 1 }

[[policy]]
name = "loans"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 100000, lease_ttl = "2s", on_unavailable = "closed" }
"#;

/// The two policies, in the order they run.
pub const POLICIES: [&str; 2] = ["leases", "loans"];

/// The one key every request names (the run's key 0).
const KEY: &str = "key-0";

/// Closed-loop clients, spread over the two nodes that do not own the bucket.
const CLIENTS: usize = 16;

/// How long the owner settles before it grants: the lease TTL (2 s) and a loan's margin (2 s),
/// plus the quorum's margin (4 s), plus a second for the last ring change.
const SETTLE: Duration = Duration::from_secs(9);

/// One policy's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnerRow {
    /// `leases` or `loans`.
    pub policy: String,
    /// The node that owns the bucket (not asked by the clients).
    pub owner: String,
    /// Admissions a second.
    pub admitted_per_second: Spread,
    /// The owner's CPU time per admission, microseconds.
    pub owner_cpu_us: Spread,
    /// The three nodes' CPU time per admission, microseconds.
    pub cluster_cpu_us: Spread,
    /// Admissions made from a loan (no call to the owner), as a share of all of them.
    pub from_loan: Spread,
    /// Admission latency at the median, milliseconds (median over the runs).
    pub p50_ms: f64,
    /// Refused or failed requests over every run (0 unless something is wrong).
    pub refused: u64,
}

/// `owner-throughput`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnerThroughput {
    /// Measured seconds per run.
    pub seconds: f64,
    /// Runs per policy.
    pub runs: usize,
    /// A row per policy.
    pub rows: Vec<OwnerRow>,
}

impl OwnerThroughput {
    /// The report as a table, then how loans compare with leases.
    pub fn render(&self) -> String {
        let mut text = format!(
            "one hot shared bucket on a local 3-node cluster, asked through the two nodes that do not own it ({CLIENTS} closed-loop clients; median [min–max] of {} runs of {:.0}s)\n{:<7} {:<5} {:>24} {:>22} {:>22} {:>20} {:>7} {:>7}\n",
            self.runs,
            self.seconds,
            "policy",
            "owner",
            "admitted/s",
            "owner CPU µs/adm",
            "cluster CPU µs/adm",
            "from a loan",
            "p50 ms",
            "refused"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:<7} {:<5} {:>24} {:>22} {:>22} {:>20} {:>7.3} {:>7}\n",
                row.policy,
                row.owner,
                row.admitted_per_second.show(0),
                row.owner_cpu_us.show(1),
                row.cluster_cpu_us.show(1),
                row.from_loan.show(3),
                row.p50_ms,
                row.refused
            ));
        }
        if let (Some(leases), Some(loans)) = (self.row("leases"), self.row("loans")) {
            text.push_str(&format!(
                "loans over leases: {:.2}× the admissions a second, {:.3}× the owner's CPU per admission, {:.2}× the cluster's\n",
                loans.admitted_per_second.median / leases.admitted_per_second.median,
                loans.owner_cpu_us.median / leases.owner_cpu_us.median,
                loans.cluster_cpu_us.median / leases.cluster_cpu_us.median,
            ));
        }
        text
    }

    fn row(&self, policy: &str) -> Option<&OwnerRow> {
        self.rows.iter().find(|row| row.policy == policy)
    }
}

/// The node that owns `policy`'s bucket of [`KEY`] among `n1`, `n2`, `n3`.
fn owner_of(policy: &str) -> usize {
    owner_among_three(&shared_bucket_of(policy, KEY))
}

/// One run's figures for a row.
struct RunFigures {
    admitted_per_second: f64,
    owner_cpu_us: f64,
    cluster_cpu_us: f64,
    from_loan: f64,
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
        ["shared", "from_loan"],
        settings,
    )
    .await?;
    let ([shared, from_loan], report, cpu) = (run.counted, run.report, run.cpu);
    // CPU over everything the nodes admitted in the run, the warm-up included.
    let admissions = shared.max(1) as f64;
    Ok(RunFigures {
        admitted_per_second: report.admitted as f64 / report.seconds,
        owner_cpu_us: cpu[owner].as_secs_f64() * 1e6 / admissions,
        cluster_cpu_us: cpu.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / admissions,
        from_loan: from_loan as f64 / admissions,
        p50_ms: report.latency_ms.p50,
        refused: report.refused + report.errors,
    })
}

/// Starts three nodes, runs each policy `runs` times in turn and reports the spreads.
pub async fn owner_throughput(settings: &ScenarioSettings) -> anyhow::Result<OwnerThroughput> {
    let dir = Workdir::new("owner-throughput")?;
    let nodes = start_cluster(&settings.binary, CONFIG, dir.path(), 3).await?;
    tokio::time::sleep(SETTLE).await;
    let runs = settings.runs.max(1);
    let owners = POLICIES.map(owner_of);
    let mut figures: [Vec<RunFigures>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (p, policy) in POLICIES.iter().enumerate() {
            figures[p].push(run_once(policy, owners[p], &nodes, settings).await?);
        }
    }
    let rows = POLICIES
        .iter()
        .zip(&figures)
        .zip(owners)
        .map(|((policy, runs), owner)| {
            let column = |f: fn(&RunFigures) -> f64| runs.iter().map(f).collect::<Vec<_>>();
            OwnerRow {
                policy: (*policy).to_owned(),
                owner: format!("n{}", owner + 1),
                admitted_per_second: Spread::of(&column(|r| r.admitted_per_second)),
                owner_cpu_us: Spread::of(&column(|r| r.owner_cpu_us)),
                cluster_cpu_us: Spread::of(&column(|r| r.cluster_cpu_us)),
                from_loan: Spread::of(&column(|r| r.from_loan)),
                p50_ms: median(column(|r| r.p50_ms)),
                refused: runs.iter().map(|r| r.refused).sum(),
            }
        })
        .collect();
    drop(nodes);
    Ok(OwnerThroughput {
        seconds: settings.duration.as_secs_f64(),
        runs,
        rows,
    })
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "owner-throughput",
    aliases: &[],
    measures: "shared admissions of one hot bucket through the nodes that do not own it, loans against leases",
    figures: "docs/benchmarks.md, Owner throughput with delegation",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(owner_throughput(settings), OwnerThroughput::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(median: f64) -> Spread {
        Spread {
            median,
            min: median * 0.9,
            max: median * 1.1,
        }
    }

    #[test]
    fn the_table_compares_loans_with_leases() {
        let row = |policy: &str, rate: f64, owner_cpu: f64, loan: f64| OwnerRow {
            policy: policy.to_owned(),
            owner: "n2".to_owned(),
            admitted_per_second: spread(rate),
            owner_cpu_us: spread(owner_cpu),
            cluster_cpu_us: spread(owner_cpu * 3.0),
            from_loan: spread(loan),
            p50_ms: 0.5,
            refused: 0,
        };
        let report = OwnerThroughput {
            seconds: 10.0,
            runs: 3,
            rows: vec![
                row("leases", 10_000.0, 40.0, 0.0),
                row("loans", 20_000.0, 10.0, 0.99),
            ],
        };
        let text = report.render();
        assert!(
            text.contains(
                "loans over leases: 2.00× the admissions a second, 0.250× the owner's CPU per admission, 0.25× the cluster's"
            ),
            "{text}"
        );
        assert!(text.contains("20000 [18000–22000]"), "{text}");
    }

    #[test]
    fn the_spread_is_the_median_and_the_range() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
    }
}
