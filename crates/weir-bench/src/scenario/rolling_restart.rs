//! `rolling-restart`: three local nodes restarted one after another under load, as an
//! orchestrator rolls a new version through — each stopped gracefully (SIGTERM), started again
//! on its data dir, and waited for until it is ready — while clients ask the nodes that are up
//! for a cluster-scoped rate and for leases of a `closed` concurrency policy.
//!
//! The cluster's first start is a row of its own: the first 10 s of load, its "down" the time
//! from starting the nodes until every one is ready.
//!
//! Per restart (the span from the SIGTERM to 10 s after the node is ready again): what
//! the rate admitted against its bound over that span (rate × time + burst, so anything above
//! is over-admission) and in its busiest second (any 1 s window, against rate + burst; given as
//! the admissions surely decided within it and those perhaps, as a client can only bracket when
//! a server decided), how long the shared tier refused every lease for want of an owner that
//! could grant, the most leases out at once against the ceiling, and the answers' latency.
//!
//! With `--from-binary`, the nodes start on another release's binary and each comes back on
//! this one: a rolling upgrade, held to the same bounds. The report names the builds the
//! members advertised before the first restart and after the last.
//!
//! The load, 100/s asked three times over, is the one at which the owner's restart was found
//! over in its busiest second (`docs/benchmarks.md`, "The busiest second").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Mutex;

use super::{Scenario, ScenarioSettings, finish};
use crate::nodes::{LocalNode, Workdir, start_cluster};

/// The cluster-scoped rate, per second, and its burst.
const RATE: u32 = 100;
const BURST: u32 = 10;
/// The concurrency policy's shared limit (no node tier: every lease is the cluster's) and its
/// leases' TTL. Without loans (`max_loan = 1`), so that every lease is asked of the bucket's
/// owner and the shared tier's availability shows as it is (a loan held from before a change
/// of owner would admit through it).
const SHARED_LIMIT: usize = 4;
const LEASE_TTL: &str = "3s";
/// How many clients ask for the rate, how often each asks (together 3× its rate), and how
/// many clients take leases.
const ASKERS: usize = 3;
const ASK_EVERY: Duration = Duration::from_millis(10);
const HOLDERS: usize = 8;
/// How long a lease is held, and how long a refused holder waits before asking again.
const HOLD: Duration = Duration::from_millis(20);
/// How long each restart's span lasts after the node is ready again.
const SETTLE: Duration = Duration::from_secs(10);
/// The slots the shared tier's refusals are counted in.
const SLOT: Duration = Duration::from_millis(100);
const NODES: usize = 3;

/// One restart's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Restart {
    /// The node restarted.
    pub node: String,
    /// The span's length, in seconds.
    pub seconds: f64,
    /// How long the node took from the SIGTERM until it was ready again, in seconds.
    pub down_seconds: f64,
    /// What the rate admitted over the span.
    pub admitted: u64,
    /// Its bound: rate × span + burst.
    pub bound: f64,
    /// What was admitted beyond the bound, as a share of rate × span (0 if none).
    pub over: f64,
    /// The most the rate admitted in any 1 s window of the span (by when each was asked): its
    /// bound is rate + burst.
    pub busiest_second: u64,
    /// The most admissions whose time from asking to answer meets any 1 s window: the busiest
    /// second is between [`Restart::busiest_second`] and this.
    pub busiest_second_at_most: u64,
    /// Leases refused as unavailable: no owner that could grant (settling after a change of
    /// owner, no majority, unreachable).
    pub shared_refused: u64,
    /// How long leases were refused so, in seconds: the 100 ms slots with such a refusal.
    pub shared_refusing_seconds: f64,
    /// The most leases out at once.
    pub most_leases: usize,
    /// The answers' latency over the span, in ms: p50 and p99.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// Requests that failed (no answer: connection refused, a node going away).
    pub failed: u64,
}

/// `rolling-restart`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RollingRestart {
    /// The rate and its burst.
    pub rate: u32,
    /// Its burst.
    pub burst: u32,
    /// The concurrency policy's ceiling.
    pub ceiling: usize,
    /// Its leases' TTL.
    pub lease_ttl: &'static str,
    /// The cluster's first start (every data dir empty): its first 10 s of load.
    pub fresh_start: Restart,
    /// One row per restart.
    pub restarts: Vec<Restart>,
    /// The release each member ran before the first restart, as `/v1/cluster` shows it.
    pub builds_at_start: Vec<String>,
    /// And after the last.
    pub builds_at_end: Vec<String>,
}

impl RollingRestart {
    /// The report as a table.
    pub fn render(&self) -> String {
        let mut text = format!(
            "rolling restart: {NODES} nodes, each stopped (SIGTERM) and started again under load; a cluster-scoped rate of {}/s (burst {}) asked at 3x by {ASKERS} clients through the nodes up; a closed concurrency policy (shared limit {}, lease_ttl {}) held by {HOLDERS} clients\n{:>5} {:>7} {:>7} {:>9} {:>8} {:>7} {:>15} {:>14} {:>13} {:>6} {:>8} {:>8} {:>7}\n",
            self.rate,
            self.burst,
            self.ceiling,
            self.lease_ttl,
            "node",
            "span s",
            "down s",
            "admitted",
            "bound",
            "over",
            "busiest 1 s",
            "shared refused",
            "refusing s",
            "most",
            "p50 ms",
            "p99 ms",
            "failed"
        );
        for r in std::iter::once(&self.fresh_start).chain(&self.restarts) {
            text.push_str(&format!(
                "{:>5} {:>7.1} {:>7.1} {:>9} {:>8.0} {:>6.2}% {:>4}–{:<4}/ {:>3} {:>14} {:>13.1} {:>6} {:>8.2} {:>8.2} {:>7}\n",
                r.node,
                r.seconds,
                r.down_seconds,
                r.admitted,
                r.bound,
                r.over * 100.0,
                r.busiest_second,
                r.busiest_second_at_most,
                self.rate + self.burst,
                r.shared_refused,
                r.shared_refusing_seconds,
                r.most_leases,
                r.p50_ms,
                r.p99_ms,
                r.failed
            ));
        }
        text.push_str(&format!(
            "builds: {} at the start, {} at the end\n",
            self.builds_at_start.join(", "),
            self.builds_at_end.join(", ")
        ));
        text
    }
}

fn config() -> String {
    format!(
        "[[policy]]\nname = \"steady\"\nscope = \"cluster\"\non_exhausted = \"reject\"\ntoken_bucket = {{ rate = {RATE}, burst = {BURST} }}\n\n[[policy]]\nname = \"pool\"\non_exhausted = \"reject\"\nconcurrency = {{ node_limit = 0, shared_limit = {SHARED_LIMIT}, lease_ttl = \"{LEASE_TTL}\", on_unavailable = \"closed\", max_loan = 1 }}\n"
    )
}

/// What one answer was.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// The rate admitted.
    Admitted,
    /// A lease granted.
    Leased,
    /// The rate refused, or the pool full.
    Refused,
    /// The pool could not grant: no owner able to (settling, no majority, unreachable).
    Unavailable,
    /// No answer.
    Failed,
}

/// Every answer, stamped with when it was asked (since the start) and how long it took.
type Log = Arc<Mutex<Vec<(Duration, Duration, Answer)>>>;

/// The nodes' HTTP addresses, `None` while a node is down.
type Up = Arc<Mutex<Vec<Option<String>>>>;

/// The next node up after `turn`.
async fn next_up(up: &Up, turn: &AtomicUsize) -> Option<String> {
    let up = up.lock().await;
    for _ in 0..up.len() {
        let i = turn.fetch_add(1, Ordering::Relaxed) % up.len();
        if let Some(url) = &up[i] {
            return Some(url.clone());
        }
    }
    None
}

async fn acquire(client: &reqwest::Client, url: &str, policy: &str) -> (Answer, Option<String>) {
    let response = client
        .post(format!("{url}/v1/acquire"))
        .json(&serde_json::json!({"policy": policy, "key": "k"}))
        .send()
        .await;
    let Ok(response) = response else {
        return (Answer::Failed, None);
    };
    let status = response.status().as_u16();
    let Ok(body) = response.json::<serde_json::Value>().await else {
        return (Answer::Failed, None);
    };
    match status {
        200 if policy == "pool" => (Answer::Leased, body["lease"].as_str().map(str::to_owned)),
        200 => (Answer::Admitted, None),
        429 => {
            let reason = body["reason"].as_str().unwrap_or_default();
            // "reached its … shared limit" is a full pool; any other refusal of the shared
            // tier ("could not check its shared limit …") is one with no owner able to grant.
            match policy == "pool" && !reason.contains("reached") {
                true => (Answer::Unavailable, None),
                false => (Answer::Refused, None),
            }
        }
        _ => (Answer::Failed, None),
    }
}

/// Restarts each node in turn under load; the figures of each restart.
pub async fn rolling_restart(settings: &ScenarioSettings) -> anyhow::Result<RollingRestart> {
    let dir = Workdir::new("rolling-restart")?;
    let booting = Instant::now();
    let first = settings.from_binary.as_ref().unwrap_or(&settings.binary);
    let mut nodes = start_cluster(first, &config(), dir.path(), NODES).await?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    wait_ready(&client, &nodes).await?;
    let booted = booting.elapsed();
    let builds_at_start = builds(&client, &nodes[0]).await?;
    let up: Up = Arc::new(Mutex::new(
        nodes.iter().map(|n| Some(n.http.clone())).collect(),
    ));
    let log: Log = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(Mutex::new(Vec::<(Duration, usize)>::new()));
    let mut tasks = Vec::new();
    for asker in 0..ASKERS {
        let (client, up, log, stop) = (client.clone(), up.clone(), log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let turn = AtomicUsize::new(asker);
            let mut ticks = tokio::time::interval(ASK_EVERY);
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let Some(url) = next_up(&up, &turn).await else {
                    continue;
                };
                let asked = start.elapsed();
                let (answer, _) = acquire(&client, &url, "steady").await;
                log.lock()
                    .await
                    .push((asked, start.elapsed() - asked, answer));
            }
        }));
    }
    for holder in 0..HOLDERS {
        let (client, up, log, stop) = (client.clone(), up.clone(), log.clone(), stop.clone());
        let (in_flight, most) = (in_flight.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let turn = AtomicUsize::new(holder);
            while !stop.load(Ordering::Relaxed) {
                let Some(url) = next_up(&up, &turn).await else {
                    tokio::time::sleep(HOLD).await;
                    continue;
                };
                let asked = start.elapsed();
                let (answer, lease) = acquire(&client, &url, "pool").await;
                log.lock()
                    .await
                    .push((asked, start.elapsed() - asked, answer));
                if let Some(lease) = lease {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.lock().await.push((start.elapsed(), now));
                    tokio::time::sleep(HOLD).await;
                    // Counted out before the release is sent: a lease is never counted out
                    // later than it really ends.
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let _ = client
                        .post(format!("{url}/v1/release"))
                        .json(&serde_json::json!({"lease": lease}))
                        .send()
                        .await;
                } else {
                    tokio::time::sleep(HOLD).await;
                }
            }
        }));
    }
    // The load runs alone first, so the cluster is in its steady state; that span is the
    // fresh start's.
    tokio::time::sleep(SETTLE).await;
    let settled = start.elapsed();
    let mut spans = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        let from = start.elapsed();
        up.lock().await[i] = None;
        tokio::task::block_in_place(|| node.stop())?;
        tokio::task::block_in_place(|| node.restart_on(&settings.binary))?;
        wait_ready(&client, std::slice::from_ref(node)).await?;
        let ready = start.elapsed();
        up.lock().await[i] = Some(node.http.clone());
        tokio::time::sleep(SETTLE).await;
        spans.push((format!("n{}", i + 1), from, ready, start.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    let builds_at_end = builds(&client, &nodes[0]).await?;
    let log = log.lock().await.clone();
    let most = most.lock().await.clone();
    let restarts = spans
        .into_iter()
        .map(|(node, from, ready, to)| figures(&log, &most, node, from, ready, to))
        .collect();
    let fresh_start = Restart {
        down_seconds: booted.as_secs_f64(),
        ..figures(
            &log,
            &most,
            "start".to_owned(),
            Duration::ZERO,
            Duration::ZERO,
            settled,
        )
    };
    Ok(RollingRestart {
        fresh_start,
        rate: RATE,
        burst: BURST,
        ceiling: SHARED_LIMIT,
        lease_ttl: LEASE_TTL,
        restarts,
        builds_at_start,
        builds_at_end,
    })
}

/// The release each member runs, as `node`'s `/v1/cluster` shows it, by member.
async fn builds(client: &reqwest::Client, node: &LocalNode) -> anyhow::Result<Vec<String>> {
    let view: weir_api::http::ClusterView = client
        .get(format!("{}/v1/cluster", node.http))
        .send()
        .await?
        .json()
        .await?;
    let mut builds: Vec<String> = view
        .members
        .iter()
        .map(|m| {
            let build = m.build.as_deref().unwrap_or("an unnamed build");
            format!("{} {build}", m.id)
        })
        .collect();
    builds.sort();
    Ok(builds)
}

/// One restart's figures from the answers asked between `from` and `to`.
fn figures(
    log: &[(Duration, Duration, Answer)],
    most: &[(Duration, usize)],
    node: String,
    from: Duration,
    ready: Duration,
    to: Duration,
) -> Restart {
    let span: Vec<&(Duration, Duration, Answer)> = log
        .iter()
        .filter(|(at, _, _)| *at >= from && *at < to)
        .collect();
    let seconds = (to - from).as_secs_f64();
    let admitted = span
        .iter()
        .filter(|(_, _, a)| *a == Answer::Admitted)
        .count() as u64;
    let bound = f64::from(RATE) * seconds + f64::from(BURST);
    let over = ((admitted as f64 - bound) / (f64::from(RATE) * seconds)).max(0.0);
    let (busiest_second, busiest_second_at_most) = busiest_second(&span);
    let slots = ((to - from).as_millis() / SLOT.as_millis()).max(1) as usize;
    let mut refusing = vec![false; slots];
    let mut shared_refused = 0;
    for (at, _, answer) in &span {
        if *answer == Answer::Unavailable {
            let slot = (((*at - from).as_millis() / SLOT.as_millis()) as usize).min(slots - 1);
            refusing[slot] = true;
            shared_refused += 1;
        }
    }
    let shared_refusing = refusing.iter().filter(|r| **r).count() as f64 * SLOT.as_secs_f64();
    let mut latencies: Vec<f64> = span
        .iter()
        .filter(|(_, _, a)| *a != Answer::Failed)
        .map(|(_, took, _)| took.as_secs_f64() * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| match latencies.len() {
        0 => 0.0,
        n => latencies[((n - 1) as f64 * p).round() as usize],
    };
    Restart {
        node,
        seconds,
        down_seconds: (ready - from).as_secs_f64(),
        admitted,
        bound,
        over,
        busiest_second,
        busiest_second_at_most,
        shared_refused,
        shared_refusing_seconds: shared_refusing,
        most_leases: most
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        failed: span.iter().filter(|(_, _, a)| *a == Answer::Failed).count() as u64,
    }
}

/// The busiest 1 s window's admissions, bracketed: at least those asked and answered within
/// it, at most those whose time from asking to answer meets it. (A request was decided
/// somewhere between the two; stamping it by when it was asked alone would put one that
/// waited on a node going away in a window it may not have been decided in.)
fn busiest_second(span: &[&(Duration, Duration, Answer)]) -> (u64, u64) {
    let mut admitted: Vec<(Duration, Duration)> = span
        .iter()
        .filter(|(_, _, a)| *a == Answer::Admitted)
        .map(|(asked, took, _)| (*asked, *asked + *took))
        .collect();
    admitted.sort();
    let second = Duration::from_secs(1);
    // A window holding some admissions wholly still does when it starts at the first of
    // them to be asked; one meeting some still does when it starts at the first to be
    // answered. So those starts are the only ones to try.
    let surely = admitted
        .iter()
        .map(|(from, _)| {
            admitted
                .iter()
                .filter(|(asked, answered)| asked >= from && *answered < *from + second)
                .count()
        })
        .max()
        .unwrap_or(0) as u64;
    let at_most = admitted
        .iter()
        .map(|(_, from)| {
            admitted
                .iter()
                .filter(|(asked, answered)| *asked < *from + second && answered >= from)
                .count()
        })
        .max()
        .unwrap_or(0) as u64;
    (surely, at_most)
}

/// Waits until every node in `nodes` answers `/readyz` with 200.
async fn wait_ready(client: &reqwest::Client, nodes: &[LocalNode]) -> anyhow::Result<()> {
    let started = Instant::now();
    for node in nodes {
        loop {
            let ready = client
                .get(format!("{}/readyz", node.http))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{} not ready within 60 s",
                node.http
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "rolling-restart",
    aliases: &[],
    measures: "a rolling restart of 3 local nodes under load: over-admission, shared-tier refusals, latency per restart",
    figures: "docs/benchmarks.md, Rolling restart",
    plots: false,
    upgrades: true,
    run: |settings, _plot| finish(rolling_restart(settings), RollingRestart::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_has_a_cluster_rate_and_a_closed_pool_without_loans() {
        let config = weir_server::ConfigFile::parse(&config()).unwrap();
        let names: Vec<&str> = config.policy.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["steady", "pool"]);
        assert_eq!(config.policy[0].scope, weir::policy::Scope::Cluster);
    }

    #[test]
    fn a_restarts_figures_count_what_passed_the_bound_and_the_slots_refused() {
        let ms = Duration::from_millis;
        let mut log = Vec::new();
        // 2 s span from t = 1 s: 250 admitted against a bound of 100 × 2 + 10 = 210.
        for i in 0..250 {
            log.push((ms(1000 + i * 4), ms(1), Answer::Admitted));
        }
        // Two refusals in one slot and one in another; one before the span, not counted.
        log.push((ms(1200), ms(2), Answer::Unavailable));
        log.push((ms(1250), ms(2), Answer::Unavailable));
        log.push((ms(1500), ms(2), Answer::Unavailable));
        log.push((ms(500), ms(2), Answer::Unavailable));
        log.push((ms(1600), ms(0), Answer::Failed));
        let most = [(ms(900), 9), (ms(1100), 3), (ms(1900), 4)];
        let r = figures(&log, &most, "n1".into(), ms(1000), ms(1500), ms(3000));
        assert_eq!(r.admitted, 250);
        assert_eq!(r.bound, 210.0);
        // All 250 were asked and answered within [1.000 s, 1.997 s]: one second held them all.
        assert_eq!((r.busiest_second, r.busiest_second_at_most), (250, 250));
        assert!((r.over - 40.0 / 200.0).abs() < 1e-9, "{}", r.over);
        assert_eq!(r.shared_refused, 3);
        assert!((r.shared_refusing_seconds - 0.2).abs() < 1e-9);
        assert_eq!(r.most_leases, 4);
        assert_eq!(r.failed, 1);
        assert_eq!(r.down_seconds, 0.5);
    }

    #[test]
    fn the_busiest_second_is_the_fullest_1_s_window_wherever_it_falls() {
        let ms = Duration::from_millis;
        // 20 a second for 4 s, and 30 more asked between 2.0 s and 2.3 s.
        let mut log: Vec<_> = (0..80)
            .map(|i| (ms(i * 50), ms(1), Answer::Admitted))
            .collect();
        log.extend((0..30).map(|i| (ms(2000 + i * 10), ms(1), Answer::Admitted)));
        log.push((ms(2100), ms(1), Answer::Refused));
        let r = figures(&log, &[], "n2".into(), ms(0), ms(0), ms(4000));
        assert_eq!(r.admitted, 110);
        // Any 1 s window holding [2.0 s, 2.3 s) holds 20 of the steady ones and the 30 — and
        // perhaps one more: the one asked at 1.950 s may have been decided as it was answered,
        // at 1.951 s, in the window [1.951 s, 2.951 s).
        assert_eq!((r.busiest_second, r.busiest_second_at_most), (50, 51));
    }

    #[test]
    fn an_answer_that_took_long_is_only_perhaps_in_the_windows_it_spans() {
        let ms = Duration::from_millis;
        // 10 a second for 3 s, and 15 asked at 1.0 s that were answered 1.5 s later: decided
        // at some moment of [1.0 s, 2.5 s], so in no one window surely, and in each that meets
        // that span perhaps: the window from 1.401 s (when the one asked at 1.4 s was answered)
        // meets it, the 15 and the ten asked from 1.5 s to 2.4 s.
        let mut log: Vec<_> = (0..30)
            .map(|i| (ms(i * 100), ms(1), Answer::Admitted))
            .collect();
        log.extend((0..15).map(|_| (ms(1000), ms(1500), Answer::Admitted)));
        let r = figures(&log, &[], "n3".into(), ms(0), ms(0), ms(3000));
        assert_eq!((r.busiest_second, r.busiest_second_at_most), (10, 26));
    }
}
