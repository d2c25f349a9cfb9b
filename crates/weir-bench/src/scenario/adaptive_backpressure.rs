//! `adaptive-backpressure`: adaptive backpressure, in real time, against a toy backend — the
//! step-wise control of the design it comes from and Weir's converging control, side by side.
//!
//! The backend is a meta service that accepts [`CAPACITY`] calls a second in total and answers
//! 503 ("busy") beyond that. Callers go through Weir's client [`ThrottleLayer`]: one hot table
//! at 400/s, one warm at 150/s and five cold at 10/s each — 600/s, twice what the backend takes.
//! Both controllers limit the top 1 table, cut at most by half, at most once a second, and relax
//! after 3 quiet seconds. Each mode has its own backend and callers; both run at once in this
//! process as tower services: the subject is the client layer's control loop, not a transport.
//!
//! The run is the steady phase (`warmup + duration`), then the hot table stops for
//! [`change`] seconds and comes back for as long: how fast each control follows a demand
//! change.
//!
//! The report is, per mode: the utilization and the busy answers' share over the second half of
//! the steady phase, each table's admitted rate against its demand there, when the control
//! converged, the longest spell a table stayed limited below its demand while the backend had
//! 10 % spare, how long each demand change took to follow, and whether a cold table was ever
//! limited; then the first run's timeline, both modes side by side.
//!
//! [`simulate`] runs any [`Mix`] (demands and a capacity over time) with either control: the
//! tests run it on tokio's paused clock, where it is exact, at several phases of the rate
//! window against the simulation's seconds.

mod report;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};
use weir::TokioClock;
use weir::backpressure::{AdaptiveConfig, Backpressure, Control};
use weir::layer::ThrottleLayer;

use super::{Finished, Scenario, ScenarioFuture, ScenarioSettings};

/// Calls a second the toy backend accepts in total.
pub const CAPACITY: u64 = 300;

/// How long the hot table stops, and then runs again, after a steady phase of `steady`
/// seconds: 12 s (enough to see a change followed within 10 s), less for a short run.
pub fn change(steady: u64) -> u64 {
    (steady / 2).clamp(1, 12)
}

/// The second the transient mix's capacity dips, for one second.
const TRANSIENT_AT: u64 = 5;

/// The RPC type every call is.
const RPC: &str = "PREPARE_ROWSET";

/// Share of the capacity (or of the demand, if less) the backend must take for a second to
/// count as settled.
const UTILIZATION_GOAL: f64 = 0.9;
/// The most busy answers may be of the calls the backend received, for a second to count as
/// settled.
const BUSY_GOAL: f64 = 0.02;
/// Settled seconds in a row that make a control converged (or a change followed).
pub const SETTLED_RUN: usize = 3;

/// A table and its calls a second over time: `(from second, rate)` steps, the first from 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// The table's name.
    pub name: String,
    /// Rate steps.
    pub demand: Vec<(u64, u32)>,
}

impl Table {
    /// A table sending `rate` calls a second throughout.
    pub fn steady(name: &str, rate: u32) -> Self {
        Table {
            name: name.to_owned(),
            demand: vec![(0, rate)],
        }
    }

    /// Its rate during second `at` (counting from 0).
    pub fn rate_at(&self, at: u64) -> u32 {
        steps_at(&self.demand, at)
    }
}

fn steps_at<T: Copy + Default>(steps: &[(u64, T)], at: u64) -> T {
    steps
        .iter()
        .take_while(|(from, _)| *from <= at)
        .last()
        .map_or(T::default(), |(_, value)| *value)
}

/// What a simulated run drives: tables, the backend's capacity over time, how long.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mix {
    /// The callers.
    pub tables: Vec<Table>,
    /// The backend's capacity, `(from second, calls a second)` steps.
    pub capacity: Vec<(u64, u64)>,
    /// Seconds run.
    pub seconds: u64,
    /// The steady phase: its second half is where utilization and busy share are measured.
    pub steady: u64,
}

impl Mix {
    /// The scenario's mix: hot 400, warm 150, five cold at 10, against 300 a second; the hot
    /// table stops after `steady` seconds for [`change`] seconds, then comes back for as long.
    pub fn doris(steady: u64) -> Self {
        let change = change(steady);
        let mut tables = vec![
            Table {
                name: "hot".into(),
                demand: vec![(0, 400), (steady, 0), (steady + change, 400)],
            },
            Table::steady("warm", 150),
        ];
        tables.extend((1..=5).map(|i| Table::steady(&format!("cold-{i}"), 10)));
        Mix {
            tables,
            capacity: vec![(0, CAPACITY)],
            seconds: steady + 2 * change,
            steady,
        }
    }

    /// A transient: the hot table at 200 and the warm at 60 with one cold at 10, under the
    /// capacity, which dips to half for the one second from `at`: both controls cut, and
    /// [`ModeRun::let_go`] says how long each takes to let go once the dip is over.
    pub fn transient(at: u64) -> Self {
        Mix {
            tables: vec![
                Table::steady("hot", 200),
                Table::steady("warm", 60),
                Table::steady("cold-1", 10),
            ],
            capacity: vec![(0, CAPACITY), (at, CAPACITY / 2), (at + 1, CAPACITY)],
            seconds: at + 30,
            steady: at,
        }
    }

    fn capacity_at(&self, at: u64) -> u64 {
        steps_at(&self.capacity, at)
    }

    /// The seconds (after 0) at which a demand or the capacity changes.
    fn changes(&self) -> Vec<u64> {
        let mut at: Vec<u64> = self
            .tables
            .iter()
            .flat_map(|t| t.demand.iter().map(|(from, _)| *from))
            .chain(self.capacity.iter().map(|(from, _)| *from))
            .filter(|from| *from > 0 && *from < self.seconds)
            .collect();
        at.sort_unstable();
        at.dedup();
        at
    }
}

/// The controller settings both modes share: the design's own scenario settings.
pub fn adaptive(control: Control) -> AdaptiveConfig {
    AdaptiveConfig {
        enabled: true,
        control,
        top_k: 1,
        ratio: 0.5,
        upgrade_interval: Duration::from_secs(1),
        downgrade_interval: Duration::from_secs(3),
        ..AdaptiveConfig::default()
    }
}

/// One second of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Second {
    /// Seconds since the start, at the end of this one.
    pub at: u64,
    /// The backend's capacity this second.
    pub capacity: u64,
    /// Calls that reached the backend.
    pub arrived: u64,
    /// Of which accepted.
    pub accepted: u64,
    /// Of which answered busy.
    pub busy: u64,
    /// Calls accepted per table.
    pub accepted_per_table: BTreeMap<String, u64>,
    /// What each table wanted to send this second.
    pub demand_per_table: BTreeMap<String, u64>,
    /// The limits the client holds at the end of the second, calls a second per table.
    pub limits: BTreeMap<String, f64>,
}

impl Second {
    /// What the backend could take this second: its capacity, or the demand if less.
    fn takeable(&self) -> f64 {
        let demand: u64 = self.demand_per_table.values().sum();
        demand.min(self.capacity) as f64
    }

    /// The backend took nearly what it could and answered busy rarely.
    fn settled(&self) -> bool {
        self.accepted as f64 >= UTILIZATION_GOAL * self.takeable()
            && self.busy as f64 <= BUSY_GOAL * self.arrived.max(1) as f64
    }

    /// Whether `table` is limited below its demand this second.
    fn held_below_demand(&self, table: &str) -> bool {
        let demand = self.demand_per_table.get(table).copied().unwrap_or(0) as f64;
        self.limits.get(table).is_some_and(|limit| *limit < demand)
    }
}

/// The most seconds with at least 10 % of the capacity spare that some table spent limited
/// below its demand in one unbroken spell of being so limited. (Seconds of overload inside the
/// spell do not count, and do not end it: a saw tooth does not hide a starved table.)
fn longest_starved(timeline: &[Second], tables: &[Table]) -> u64 {
    let mut longest = 0;
    for table in tables {
        let mut starved = 0;
        for second in timeline {
            if !second.held_below_demand(&table.name) {
                starved = 0;
                continue;
            }
            let spare = second.capacity.saturating_sub(second.arrived) as f64;
            if spare >= 0.1 * second.capacity as f64 {
                starved += 1;
                longest = longest.max(starved);
            }
        }
    }
    longest
}

/// A table's admitted calls a second against its demand, over the measured half.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Share {
    /// The table.
    pub table: String,
    /// Mean calls a second it sent demand for.
    pub demand: f64,
    /// Mean calls a second the backend accepted from it.
    pub admitted: f64,
}

/// One mode's run, with its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeRun {
    /// The control.
    pub control: String,
    /// A row a second.
    pub timeline: Vec<Second>,
    /// Second half of the steady phase: calls accepted over the capacity (or the demand, if
    /// less).
    pub utilization: f64,
    /// Second half of the steady phase: busy answers over the calls the backend received.
    pub busy_share: f64,
    /// Second half of the steady phase: each table's admitted rate against its demand.
    pub shares: Vec<Share>,
    /// The first second of the steady phase from which [`SETTLED_RUN`] seconds in a row were
    /// settled (accepted ≥ 90 % of what the backend could take, busy ≤ 2 %); `None`: never.
    pub converged_at: Option<u64>,
    /// The most seconds with at least 10 % spare capacity some table spent limited below its
    /// demand, in one spell of being so limited (seconds of overload inside it do not end it).
    pub longest_starved: u64,
    /// For each change of demand or capacity: (its second, seconds until [`SETTLED_RUN`]
    /// settled seconds in a row began; `None`: not before the next change or the end).
    pub followed: Vec<(u64, Option<u64>)>,
    /// Whether a table outside the top-k (a cold one) was ever limited.
    pub cold_limited: bool,
    /// Seconds from the last change of capacity until no table was limited below its demand
    /// any more, to the end of the run; `None`: a table still was at the end. (Meant for
    /// [`Mix::transient`]: the time to recover from a transient.)
    pub let_go: Option<u64>,
}

/// The first second (index) from `from` to `to` that starts `SETTLED_RUN` settled ones.
fn settled_from(timeline: &[Second], from: usize, to: usize) -> Option<usize> {
    let to = to.min(timeline.len());
    (from..to).find(|&i| {
        i + SETTLED_RUN <= to && timeline[i..i + SETTLED_RUN].iter().all(Second::settled)
    })
}

impl ModeRun {
    fn new(control: Control, mix: &Mix, timeline: Vec<Second>) -> Self {
        let steady = (mix.steady as usize).min(timeline.len());
        let half = &timeline[steady / 2..steady];
        let accepted: u64 = half.iter().map(|s| s.accepted).sum();
        let takeable: f64 = half.iter().map(Second::takeable).sum();
        let arrived: u64 = half.iter().map(|s| s.arrived).sum();
        let busy: u64 = half.iter().map(|s| s.busy).sum();
        let n = half.len().max(1) as f64;
        let shares = mix
            .tables
            .iter()
            .map(|t| Share {
                table: t.name.clone(),
                demand: half
                    .iter()
                    .map(|s| s.demand_per_table.get(&t.name).copied().unwrap_or(0))
                    .sum::<u64>() as f64
                    / n,
                admitted: half
                    .iter()
                    .map(|s| s.accepted_per_table.get(&t.name).copied().unwrap_or(0))
                    .sum::<u64>() as f64
                    / n,
            })
            .collect();
        let changes = mix.changes();
        let followed = changes
            .iter()
            .enumerate()
            .map(|(i, &at)| {
                let next = changes.get(i + 1).map_or(timeline.len(), |&n| n as usize);
                let found = settled_from(&timeline, at as usize, next);
                (at, found.map(|f| f as u64 + 1 - at))
            })
            .collect();
        let dip_over = mix.capacity.last().map_or(0, |(from, _)| *from as usize);
        let held = |s: &Second| mix.tables.iter().any(|t| s.held_below_demand(&t.name));
        let let_go = match timeline.iter().rposition(held) {
            None => Some(0),
            Some(last) if last + 1 < timeline.len() => {
                Some((last + 1).saturating_sub(dip_over) as u64)
            }
            Some(_) => None,
        };
        ModeRun {
            control: name(control).to_owned(),
            let_go,
            utilization: if takeable > 0.0 {
                accepted as f64 / takeable
            } else {
                0.0
            },
            busy_share: busy as f64 / arrived.max(1) as f64,
            shares,
            converged_at: settled_from(&timeline, 0, steady).map(|i| i as u64 + 1),
            longest_starved: longest_starved(&timeline, &mix.tables),
            followed,
            cold_limited: timeline
                .iter()
                .any(|s| s.limits.keys().any(|t| t.starts_with("cold"))),
            timeline,
        }
    }
}

fn name(control: Control) -> &'static str {
    match control {
        Control::Converging => "converging",
        Control::Stepwise => "stepwise",
    }
}

/// What the backend saw in the current second.
#[derive(Default)]
struct Seen {
    accepted: u64,
    busy: u64,
    per_table: BTreeMap<String, u64>,
}

/// Runs `mix` through a [`ThrottleLayer`] with `config` against a backend taking the mix's
/// capacity a second, reporting every second.
///
/// The controller's clock reads `phase` at the start: its rate window's slots (a third of
/// `window` each) then begin `phase` before the simulation's seconds do, modulo a slot. On
/// tokio's paused clock a run is exact, and the same every time for the same mix, settings and
/// phase; how a control fares can depend on the phase, so tests run several.
pub async fn simulate(
    mix: &Mix,
    config: AdaptiveConfig,
    phase: Duration,
) -> anyhow::Result<ModeRun> {
    let control = config.control;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let capacity = Arc::new(std::sync::atomic::AtomicU64::new(mix.capacity_at(0)));
    let backend = {
        let seen = Arc::clone(&seen);
        let capacity = Arc::clone(&capacity);
        service_fn(move |request: http::Request<()>| {
            let seen = Arc::clone(&seen);
            let capacity = capacity.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                let table = request
                    .headers()
                    .get("table")
                    .and_then(|t| t.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let status = if seen.accepted < capacity {
                    seen.accepted += 1;
                    *seen.per_table.entry(table).or_default() += 1;
                    200
                } else {
                    seen.busy += 1;
                    503
                };
                Ok::<_, Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(())
                        .expect("a valid response"),
                )
            }
        })
    };
    let start = Instant::now();
    // The controller's readings are counted from `phase` before the start, not from a process-
    // wide origin in real time, so the slot phase is the same on every run.
    let origin = start
        .checked_sub(phase)
        .context("a phase before the clock's start")?;
    let backpressure = Arc::new(Backpressure::new(config, TokioClock::with_origin(origin))?);
    let ticker = tokio::spawn(backpressure.ticker());
    let target = |request: &http::Request<()>| {
        let table = request.headers().get("table")?.to_str().ok()?.to_owned();
        Some((RPC.to_owned(), table))
    };
    let client = ThrottleLayer::new(Arc::clone(&backpressure), target).layer(backend);

    let mut callers = tokio::task::JoinSet::new();
    for table in mix.tables.clone() {
        let mut client = client.clone();
        callers.spawn(async move {
            let mut next = start;
            loop {
                let at = (next - start).as_secs();
                let rate = table.rate_at(at);
                if rate == 0 {
                    // Idle until the next whole second, when the demand may change.
                    next = start + Duration::from_secs(at + 1);
                    tokio::time::sleep_until(next).await;
                    continue;
                }
                tokio::time::sleep_until(next).await;
                let request = http::Request::builder()
                    .header("table", table.name.as_str())
                    .body(())
                    .expect("a valid request");
                let Ok(ready) = client.ready().await;
                let Ok(_) = ready.call(request).await;
                // A caller held back by its limit sends late rather than in a catch-up burst.
                next = (next + Duration::from_secs(1) / rate).max(Instant::now());
            }
        });
    }

    let mut timeline = Vec::with_capacity(mix.seconds as usize);
    for at in 1..=mix.seconds {
        tokio::time::sleep_until(start + Duration::from_secs(at)).await;
        let now = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
        let limits: BTreeMap<String, f64> = backpressure
            .throttled()
            .into_iter()
            .map(|t| (t.key, t.qps_limit))
            .collect();
        timeline.push(Second {
            at,
            capacity: capacity.load(std::sync::atomic::Ordering::Relaxed),
            arrived: now.accepted + now.busy,
            accepted: now.accepted,
            busy: now.busy,
            accepted_per_table: now.per_table,
            demand_per_table: mix
                .tables
                .iter()
                .map(|t| (t.name.clone(), u64::from(t.rate_at(at - 1))))
                .collect(),
            limits,
        });
        capacity.store(mix.capacity_at(at), std::sync::atomic::Ordering::Relaxed);
    }
    callers.abort_all();
    ticker.abort();
    Ok(ModeRun::new(control, mix, timeline))
}

/// Both modes, run at once on the same mix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pair {
    /// The design's step-wise control.
    pub stepwise: ModeRun,
    /// Weir's converging control.
    pub converging: ModeRun,
}

/// `adaptive-backpressure`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdaptiveBackpressure {
    /// The backend's capacity, calls a second.
    pub capacity: u64,
    /// What the callers would send unthrottled in the steady phase, calls a second.
    pub demand: u64,
    /// The mix every run drove.
    pub mix: Mix,
    /// One pair per run.
    pub runs: Vec<Pair>,
    /// The transient mix, run beside each pair.
    pub transient: Mix,
    /// One pair per run on the transient mix: how long each control takes to let go.
    pub transients: Vec<Pair>,
}

/// Runs both modes at once, `settings.runs` times in a row, and reports every run.
pub async fn adaptive_backpressure(
    settings: &ScenarioSettings,
) -> anyhow::Result<AdaptiveBackpressure> {
    let steady = (settings.warmup + settings.duration).as_secs().max(2);
    let mix = Mix::doris(steady);
    let transient = Mix::transient(TRANSIENT_AT);
    let mut runs = Vec::with_capacity(settings.runs.max(1));
    let mut transients = Vec::with_capacity(settings.runs.max(1));
    for _ in 0..settings.runs.max(1) {
        let (stepwise, converging, transient_stepwise, transient_converging) = tokio::join!(
            simulate(&mix, adaptive(Control::Stepwise), Duration::ZERO),
            simulate(&mix, adaptive(Control::Converging), Duration::ZERO),
            simulate(&transient, adaptive(Control::Stepwise), Duration::ZERO),
            simulate(&transient, adaptive(Control::Converging), Duration::ZERO),
        );
        runs.push(Pair {
            stepwise: stepwise?,
            converging: converging?,
        });
        transients.push(Pair {
            stepwise: transient_stepwise?,
            converging: transient_converging?,
        });
    }
    Ok(AdaptiveBackpressure {
        capacity: CAPACITY,
        demand: mix.tables.iter().map(|t| u64::from(t.rate_at(0))).sum(),
        mix,
        runs,
        transient,
        transients,
    })
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "adaptive-backpressure",
    aliases: &["doris-backpressure"],
    measures: "adaptive backpressure against a toy busy backend, step-wise and converging side by side",
    figures: "docs/benchmarks.md, `weir bench scenario adaptive-backpressure`",
    plots: true,
    upgrades: false,
    run: run_scenario,
};

fn run_scenario<'a>(
    settings: &'a ScenarioSettings,
    plot: Option<&'a std::path::Path>,
) -> ScenarioFuture<'a> {
    Box::pin(async move {
        let report = adaptive_backpressure(settings).await?;
        if let Some(path) = plot {
            report.plot(path)?;
        }
        Finished::of(&report, report.render())
    })
}

#[cfg(test)]
mod tests;
