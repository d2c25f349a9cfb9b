//! `tenant-throttling`: per-tenant page-read workloads against one local node over gRPC streams.
//!
//! The node has a page server's per-tenant policy: every tenant may issue 5000 page reads a second
//! (a fair leaky bucket refilling 500 every 100 ms up to 5000), for the `PageRequestHandler` task
//! kind only; throttled requests wait their turn.
//!
//! - workload 0: 500 clients × 100/s, all one tenant, throttling disabled — the requests carry
//!   a task kind the policy does not select, so they take the admission path with no limiter;
//! - workload 1: the same load, throttled: the tenant gets 5000/s and the rest is MISSED;
//! - workload 2: 50 tenants, one client each at 400/s — every tenant under its limit.
//!
//! Each reports the rate sent, MISSED, admitted and the node's CPU use over the run.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Scenario, ScenarioSettings, finish, one_run};
use crate::keys::KeyDistribution;
use crate::nodes::{LocalNode, Workdir};
use crate::run::{self, TargetSpec};

/// The node's policy: a fair leaky bucket per tenant, for page reads only.
const CONFIG: &str = r#"
[[policy]]
name = "getpage"
kinds = ["PageRequestHandler"]
on_exhausted = "wait"
max_wait = "5s"
leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 500, max = 5000, fair = true }
"#;

/// The per-tenant limit, per second.
pub const TENANT_LIMIT: f64 = 5000.0;

/// One workload's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadRow {
    /// 0, 1 or 2.
    pub workload: u8,
    /// What it is.
    pub description: String,
    /// Requests offered per second (clients × rate).
    pub offered: f64,
    /// Requests sent per second.
    pub rps: f64,
    /// Requests missed over the measured time.
    pub missed: u64,
    /// Requests admitted per second.
    pub admitted: f64,
    /// The busiest tenant's admitted rate, per second.
    pub busiest_tenant: f64,
    /// Median latency, milliseconds (a throttled request's wait included).
    pub p50: f64,
    /// 99th percentile, milliseconds.
    pub p99: f64,
    /// The node's CPU use over the run (warm-up included), percent of one core.
    pub server_cpu_percent: f64,
}

/// `tenant-throttling`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantThrottling {
    /// Measured seconds per workload.
    pub seconds: f64,
    /// One row per workload.
    pub rows: Vec<WorkloadRow>,
}

impl TenantThrottling {
    /// The report as a table.
    pub fn render(&self) -> String {
        let mut text = format!(
            "per-tenant page-read workloads against one node over gRPC streams, {:.0}s each (tenant limit {TENANT_LIMIT}/s)\n{:<3} {:<44} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}\n",
            self.seconds,
            "wl",
            "workload",
            "offered",
            "rps",
            "MISSED",
            "admitted",
            "busiest",
            "p50 ms",
            "p99 ms",
            "cpu %"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:<3} {:<44} {:>8.0} {:>8.0} {:>9} {:>9.0} {:>9.0} {:>8.2} {:>8.2} {:>7.0}\n",
                row.workload,
                row.description,
                row.offered,
                row.rps,
                row.missed,
                row.admitted,
                row.busiest_tenant,
                row.p50,
                row.p99,
                row.server_cpu_percent
            ));
        }
        text
    }
}

/// One workload: clients, each one's rate, tenants, whether the task kind is throttled.
struct Workload {
    number: u8,
    description: &'static str,
    clients: usize,
    rate: f64,
    tenants: u64,
    throttled: bool,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        number: 0,
        description: "500 clients × 100/s, 1 tenant, unthrottled",
        clients: 500,
        rate: 100.0,
        tenants: 1,
        throttled: false,
    },
    Workload {
        number: 1,
        description: "500 clients × 100/s, 1 tenant, throttled",
        clients: 500,
        rate: 100.0,
        tenants: 1,
        throttled: true,
    },
    Workload {
        number: 2,
        description: "50 tenants × 1 client × 400/s, throttled",
        clients: 50,
        rate: 400.0,
        tenants: 50,
        throttled: true,
    },
];

/// Starts a node, runs the three workloads one after another, and stops it.
pub async fn tenant_throttling(settings: &ScenarioSettings) -> anyhow::Result<TenantThrottling> {
    let dir = Workdir::new("tenant-throttling")?;
    let binary = settings.binary.clone();
    let path = dir.path().to_owned();
    let node = tokio::task::spawn_blocking(move || LocalNode::start(&binary, CONFIG, &path, &[]))
        .await??;
    let mut rows = Vec::with_capacity(WORKLOADS.len());
    for workload in &WORKLOADS {
        let mut one = one_run(
            TargetSpec::GrpcStream(vec![node.grpc.clone()]),
            "getpage",
            workload.rate,
            settings,
        );
        one.clients = workload.clients;
        one.keys = workload.tenants;
        one.distribution = KeyDistribution::PerClient;
        one.configured = workload.throttled.then_some(TENANT_LIMIT);
        one.kind = match workload.throttled {
            true => "PageRequestHandler".to_owned(),
            false => "Compaction".to_owned(),
        };
        let cpu_before = node.cpu_time()?;
        let started = Instant::now();
        let report = run::run(&one).await?;
        let cpu = node.cpu_time()?.saturating_sub(cpu_before);
        let wall = started.elapsed();
        if let Some(error) = &report.first_error {
            anyhow::bail!("workload {}: {error}", workload.number);
        }
        rows.push(WorkloadRow {
            workload: workload.number,
            description: workload.description.to_owned(),
            offered: workload.clients as f64 * workload.rate,
            rps: report.rps,
            missed: report.missed,
            admitted: report.admitted as f64 / report.seconds,
            busiest_tenant: report.admitted_per_key.max,
            p50: report.latency_ms.p50,
            p99: report.latency_ms.p99,
            server_cpu_percent: cpu_percent(cpu, wall),
        });
    }
    drop(node);
    Ok(TenantThrottling {
        seconds: settings.duration.as_secs_f64(),
        rows,
    })
}

/// CPU time as a percentage of one core over `wall`.
fn cpu_percent(cpu: Duration, wall: Duration) -> f64 {
    match wall.is_zero() {
        true => 0.0,
        false => cpu.as_secs_f64() / wall.as_secs_f64() * 100.0,
    }
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "tenant-throttling",
    aliases: &["neon-throttle"],
    measures: "per-tenant page-read workloads with the node's CPU use",
    figures: "docs/benchmarks.md, `weir bench scenario tenant-throttling`",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(tenant_throttling(settings), TenantThrottling::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_use_is_a_percentage_of_one_core() {
        assert_eq!(
            cpu_percent(Duration::from_secs(3), Duration::from_secs(2)),
            150.0
        );
        assert_eq!(cpu_percent(Duration::from_secs(1), Duration::ZERO), 0.0);
    }

    #[test]
    fn the_workloads_offer_unthrottled_throttled_and_under_limit_loads() {
        let offered: Vec<f64> = WORKLOADS
            .iter()
            .map(|w| w.clients as f64 * w.rate)
            .collect();
        assert_eq!(offered, [50_000.0, 50_000.0, 20_000.0]);
        assert!(!WORKLOADS[0].throttled && WORKLOADS[1].throttled);
        // Workload 2 keeps every tenant under its limit.
        assert!(WORKLOADS[2].rate < TENANT_LIMIT);
    }

    #[test]
    fn the_table_has_a_row_per_workload() {
        let report = TenantThrottling {
            seconds: 10.0,
            rows: vec![WorkloadRow {
                workload: 1,
                description: WORKLOADS[1].description.to_owned(),
                offered: 50_000.0,
                rps: 5_100.0,
                missed: 449_000,
                admitted: 5_000.0,
                busiest_tenant: 5_000.0,
                p50: 98.0,
                p99: 120.0,
                server_cpu_percent: 41.0,
            }],
        };
        let text = report.render();
        assert!(
            text.contains("1   500 clients × 100/s, 1 tenant, throttled        50000     5100    449000      5000      5000    98.00   120.00      41"),
            "{text}"
        );
    }
}
