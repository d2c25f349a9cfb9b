//! `two-tier-latency`: the two tiers' admission latency on a local 3-node cluster joined by
//! gossip.
//!
//! Three concurrency policies, limits far above the peak so nothing is refused, one bucket
//! (whose owner is one of the three nodes), requests round-robined across the nodes over gRPC,
//! each admitted request holding its lease for an exponentially distributed 4 ms (a search):
//!
//! - `none`: the policy does not limit the requests' kind — the admission path with no limiter;
//! - `node-only`: the node tier alone (a local in-flight count);
//! - `shared-only`: no node tier, every request takes a shared unit: lent to its node by the
//!   bucket's owner (the default `max_loan`, 16), so that in steady state no request calls the
//!   owner. `on_unavailable = "closed"`, so a failed shared call would show as a refusal rather
//!   than hide as a fail-open. Its lease TTL is 2 s, and the run starts once the owner has held
//!   the bucket that long (plus a loan's margin, 2 s) plus the quorum's margin (a `closed` policy's
//!   owner grants only after that much tenure);
//! - `shared-no-loan`: the same with `max_loan = 1` — every request asks the owner for a lease
//!   (no hop on the owner, one gRPC call from the other two): the shared tier without loans, in
//!   the same run.
//!
//! Beside them, when `redis-server` is installed, `redis-lua`: the same cluster-wide in-flight
//! limit done the way many teams do it today — the clients take and give back their leases in
//! a Redis Lua script over a sorted set scored by expiry, and no Weir node is asked.
//!
//! Steady is 6 clients × 200/s; burst is the same with 4× for 1 s of every 5 s. Each cell is
//! run `runs` times, interleaved, and the median of each column is reported.

use std::time::Duration;

use serde::Serialize;

use super::{Scenario, ScenarioSettings, finish, median, one_run};
use crate::nodes::{LocalRedis, Workdir, start_cluster};
use crate::report::Report;
use crate::run::{self, HoldTime, TargetSpec};
use crate::schedule::Profile;
use weir_server::ConfigFile;

/// The cluster's policies.
const CONFIG: &str = r#"
[[policy]]
name = "none"
on_exhausted = "reject"
concurrency = { node_limit = 1, overrides = { search = 0 } }

[[policy]]
name = "node-only"
on_exhausted = "reject"
concurrency = { node_limit = 100000 }

[[policy]]
name = "shared-only"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 100000, lease_ttl = "2s", on_unavailable = "closed" }

[[policy]]
name = "shared-no-loan"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 100000, lease_ttl = "2s", on_unavailable = "closed", max_loan = 1 }
"#;

/// How long the shared policies' owner settles before it grants: the lease TTL (2 s) and a
/// loan's margin (2 s), plus the quorum's margin (4 s).
const SHARED_TENURE: Duration = Duration::from_secs(8);

/// The four configurations, as policy names.
pub const CONFIGS: [&str; 4] = ["none", "node-only", "shared-only", "shared-no-loan"];

/// The Redis baseline's policy: the cluster-wide limit as one Lua lease semaphore.
const REDIS_POLICY: &str = r#"
[[policy]]
name = "redis-lua"
on_exhausted = "reject"
concurrency = { node_limit = 100000, lease_ttl = "30s" }
"#;

/// Clients, and each one's steady rate per second.
const CLIENTS: usize = 6;
const RATE: f64 = 200.0;

/// One cell of the table: the medians over the runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyRow {
    /// `none`, `node-only` or `shared-only`.
    pub config: String,
    /// `steady` or `burst`.
    pub profile: String,
    /// Admission-call latency, milliseconds.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Requests sent per second (median).
    pub rps: f64,
    /// Refused or failed requests over every run (0 unless something is wrong).
    pub refused: u64,
    /// Requests missed over every run.
    pub missed: u64,
}

/// `two-tier-latency`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TwoTierLatency {
    /// Measured seconds per run.
    pub seconds: f64,
    /// Runs per cell.
    pub runs: usize,
    /// A cell per configuration and profile, steady first.
    pub rows: Vec<LatencyRow>,
    /// Why the Redis baseline is missing, when it is.
    pub redis_missing: Option<String>,
}

impl TwoTierLatency {
    fn row(&self, config: &str, profile: &str) -> Option<&LatencyRow> {
        self.rows
            .iter()
            .find(|row| row.config == config && row.profile == profile)
    }

    /// What `config` adds over `none` under `profile`, at p50 and p99, in microseconds.
    pub fn added_us(&self, config: &str, profile: &str) -> Option<(f64, f64)> {
        self.added_over_us(config, "none", profile)
    }

    /// What `config` adds over `base` under `profile`, at p50 and p99, in microseconds.
    pub fn added_over_us(&self, config: &str, base: &str, profile: &str) -> Option<(f64, f64)> {
        let (base, row) = (self.row(base, profile)?, self.row(config, profile)?);
        Some(((row.p50 - base.p50) * 1e3, (row.p99 - base.p99) * 1e3))
    }

    /// The report as a latency table (config, profile, mean, p50, p90, p99), then what each tier
    /// adds.
    pub fn render(&self) -> String {
        let mut text = format!(
            "admission latency on a local 3-node cluster, ms (median of {} runs of {:.0}s; {CLIENTS} clients × {RATE}/s, burst 4× 1s/5s)\n{:<14} {:<7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}\n",
            self.runs,
            self.seconds,
            "config",
            "profile",
            "mean",
            "p50",
            "p90",
            "p99",
            "rps",
            "refused",
            "missed"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:<14} {:<7} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>8.0} {:>8} {:>7}\n",
                row.config,
                row.profile,
                row.mean,
                row.p50,
                row.p90,
                row.p99,
                row.rps,
                row.refused,
                row.missed
            ));
        }
        let pairs = [
            ("node-only", "none"),
            ("shared-only", "none"),
            ("shared-no-loan", "none"),
            ("redis-lua", "none"),
            ("shared-only", "node-only"),
        ];
        for (config, base) in pairs {
            for profile in ["steady", "burst"] {
                if let Some((p50, p99)) = self.added_over_us(config, base, profile) {
                    text.push_str(&format!(
                        "{config} over {base}, {profile}: p50 {p50:+.0} µs, p99 {p99:+.0} µs\n"
                    ));
                }
            }
        }
        if let Some(why) = &self.redis_missing {
            text.push_str(&format!("redis-lua left out: {why}\n"));
        }
        text
    }
}

/// Starts three nodes, runs every cell `runs` times and reports the medians.
pub async fn two_tier_latency(settings: &ScenarioSettings) -> anyhow::Result<TwoTierLatency> {
    let dir = Workdir::new("two-tier-latency")?;
    let nodes = start_cluster(&settings.binary, CONFIG, dir.path(), 3).await?;
    // The owner's tenure, plus a margin for the last ring change after gossip converged.
    tokio::time::sleep(SHARED_TENURE + Duration::from_secs(1)).await;
    let cluster = TargetSpec::Grpc(nodes.iter().map(|node| node.grpc.clone()).collect());
    let redis = tokio::task::spawn_blocking(LocalRedis::start).await??;
    let mut configs: Vec<(&str, TargetSpec)> = CONFIGS
        .iter()
        .map(|config| (*config, cluster.clone()))
        .collect();
    if let Some(redis) = &redis {
        let policy = ConfigFile::parse(REDIS_POLICY)
            .expect("the scenario's own config is valid")
            .policy
            .remove(0);
        configs.push((
            "redis-lua",
            TargetSpec::Redis {
                url: redis.url.clone(),
                policy: Box::new(policy),
            },
        ));
    }
    let profiles = [
        ("steady", Profile::Steady),
        (
            "burst",
            Profile::Burst {
                factor: 4.0,
                on: Duration::from_secs(1),
                every: Duration::from_secs(5),
            },
        ),
    ];
    let runs = settings.runs.max(1);
    let mut reports = vec![Vec::new(); profiles.len() * configs.len()];
    for _ in 0..runs {
        for (p, (_, profile)) in profiles.iter().enumerate() {
            for (c, (config, target)) in configs.iter().enumerate() {
                let mut one = one_run(target.clone(), config, RATE, settings);
                one.kind = "search".to_owned();
                one.clients = CLIENTS;
                one.profile = *profile;
                one.hold = HoldTime::Exponential(Duration::from_millis(4));
                let report = run::run(&one).await?;
                if let Some(error) = &report.first_error {
                    anyhow::bail!("{config}: {error}");
                }
                reports[p * configs.len() + c].push(report);
            }
        }
    }
    let mut rows = Vec::with_capacity(reports.len());
    for (p, (profile, _)) in profiles.iter().enumerate() {
        for (c, (config, _)) in configs.iter().enumerate() {
            let cell = &reports[p * configs.len() + c];
            let column = |f: fn(&Report) -> f64| median(cell.iter().map(f).collect());
            rows.push(LatencyRow {
                config: (*config).to_owned(),
                profile: (*profile).to_owned(),
                mean: column(|r| r.latency_ms.mean),
                p50: column(|r| r.latency_ms.p50),
                p90: column(|r| r.latency_ms.p90),
                p99: column(|r| r.latency_ms.p99),
                rps: column(|r| r.rps),
                refused: cell.iter().map(|r| r.refused + r.errors).sum(),
                missed: cell.iter().map(|r| r.missed).sum(),
            });
        }
    }
    drop(nodes);
    let redis_missing = redis
        .is_none()
        .then(|| "redis-server is not installed".to_owned());
    drop(redis);
    Ok(TwoTierLatency {
        seconds: settings.duration.as_secs_f64(),
        runs,
        redis_missing,
        rows,
    })
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "two-tier-latency",
    aliases: &["opensearch-latency"],
    measures: "two-tier admission latency on a local 3-node cluster",
    figures: "docs/benchmarks.md, The cluster concurrency design's latency table",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(two_tier_latency(settings), TwoTierLatency::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    fn row(config: &str, profile: &str, p50: f64, p99: f64) -> LatencyRow {
        LatencyRow {
            config: config.to_owned(),
            profile: profile.to_owned(),
            mean: p50,
            p50,
            p90: p99,
            p99,
            rps: 1200.0,
            refused: 0,
            missed: 0,
        }
    }

    #[test]
    fn the_table_has_a_row_per_config_and_profile_and_what_each_tier_adds() {
        let report = TwoTierLatency {
            seconds: 10.0,
            runs: 3,
            rows: vec![
                row("none", "steady", 0.2, 0.5),
                row("node-only", "steady", 0.21, 0.52),
                row("shared-only", "steady", 0.3, 0.9),
            ],
            redis_missing: Some("redis-server is not installed".to_owned()),
        };
        let (p50, p99) = report.added_us("shared-only", "steady").unwrap();
        assert!((p50 - 100.0).abs() < 1e-9 && (p99 - 400.0).abs() < 1e-9);
        assert_eq!(report.added_us("shared-only", "burst"), None);
        let text = report.render();
        assert!(
            text.contains(
                "shared-only    steady    0.300   0.300   0.900   0.900     1200        0       0"
            ),
            "{text}"
        );
        assert!(
            text.contains("shared-only over none, steady: p50 +100 µs, p99 +400 µs"),
            "{text}"
        );
        assert!(
            text.contains("shared-only over node-only, steady: p50 +90 µs, p99 +380 µs"),
            "{text}"
        );
        assert!(
            text.ends_with("redis-lua left out: redis-server is not installed\n"),
            "{text}"
        );
    }
}
