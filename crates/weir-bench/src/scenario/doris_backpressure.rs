//! `doris-backpressure`: adaptive backpressure, in real time, against a toy backend.
//!
//! The backend is a meta service that accepts [`CAPACITY`] calls a second in total and answers
//! 503 ("busy") beyond that. Callers go through Weir's client [`ThrottleLayer`]: one hot table
//! at 400/s, one warm at 150/s and five cold at 10/s each — 600/s, twice what the backend takes.
//! Each busy answer may tighten the hottest tables' limits (top 1, × 0.5, at most once a
//! second); three quiet seconds undo one step. Both run in this process as tower services: the
//! subject is the client layer's control loop, not a transport.
//!
//! The report is a timeline, a row a second: calls that reached the backend, accepted and
//! busy, per table, and the limits the client holds; then how the second half compares with
//! the capacity, and whether a cold table was ever limited (it should not be).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};
use tower::{Layer, Service, ServiceExt, service_fn};
use weir::TokioClock;
use weir::backpressure::{AdaptiveConfig, Backpressure};
use weir::layer::ThrottleLayer;

use super::{ScenarioSettings, median};

/// Calls a second the toy backend accepts in total.
pub const CAPACITY: u64 = 300;

/// The RPC type every call is.
const RPC: &str = "PREPARE_ROWSET";

/// The callers: table and calls a second.
const DEMAND: [(&str, u32); 7] = [
    ("hot", 400),
    ("warm", 150),
    ("cold-1", 10),
    ("cold-2", 10),
    ("cold-3", 10),
    ("cold-4", 10),
    ("cold-5", 10),
];

/// One second of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Second {
    /// Seconds since the start, at the end of this one.
    pub at: u64,
    /// Calls that reached the backend.
    pub arrived: u64,
    /// Of which accepted.
    pub accepted: u64,
    /// Of which answered busy.
    pub busy: u64,
    /// Calls accepted per table.
    pub accepted_per_table: BTreeMap<String, u64>,
    /// The limits the client holds at the end of the second, calls a second per table.
    pub limits: BTreeMap<String, f64>,
}

/// `doris-backpressure`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DorisBackpressure {
    /// The backend's capacity, calls a second.
    pub capacity: u64,
    /// What the callers would send unthrottled, calls a second.
    pub demand: u64,
    /// A row a second.
    pub timeline: Vec<Second>,
    /// The median calls a second reaching the backend over the second half.
    pub settled_arrivals: f64,
    /// Busy answers over the second half, a second on average.
    pub settled_busy: f64,
    /// Whether any cold table was ever limited.
    pub cold_limited: bool,
}

impl DorisBackpressure {
    /// The timeline as a table, then the summary.
    pub fn render(&self) -> String {
        let mut text = format!(
            "toy meta service taking {} calls/s; demand {}/s (hot 400, warm 150, 5 cold × 10)\n{:>4} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}  limits held by the client\n",
            self.capacity, self.demand, "t", "arrived", "accepted", "busy", "hot", "warm", "cold"
        );
        for second in &self.timeline {
            let table = |name: &str| second.accepted_per_table.get(name).copied().unwrap_or(0);
            let cold: u64 = second
                .accepted_per_table
                .iter()
                .filter(|(name, _)| name.starts_with("cold"))
                .map(|(_, n)| n)
                .sum();
            let limits: Vec<String> = second
                .limits
                .iter()
                .map(|(table, limit)| format!("{table} ≤ {limit:.1}/s"))
                .collect();
            text.push_str(&format!(
                "{:>3}s {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}  {}\n",
                second.at,
                second.arrived,
                second.accepted,
                second.busy,
                table("hot"),
                table("warm"),
                cold,
                match limits.is_empty() {
                    true => "none".to_owned(),
                    false => limits.join(", "),
                }
            ));
        }
        text.push_str(&format!(
            "second half: median {:.0} calls/s reached the backend (capacity {}), {:.1} busy answers/s; a cold table was limited: {}\n",
            self.settled_arrivals, self.capacity, self.settled_busy, self.cold_limited
        ));
        text
    }
}

/// What the backend saw in the current second.
#[derive(Default)]
struct Seen {
    accepted: u64,
    busy: u64,
    per_table: BTreeMap<String, u64>,
}

/// Runs the backend and the callers for `warmup + duration` and reports every second.
pub async fn doris_backpressure(settings: &ScenarioSettings) -> anyhow::Result<DorisBackpressure> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let backend = {
        let seen = Arc::clone(&seen);
        service_fn(move |request: http::Request<()>| {
            let seen = Arc::clone(&seen);
            async move {
                let table = request
                    .headers()
                    .get("table")
                    .and_then(|t| t.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let status = match seen.accepted < CAPACITY {
                    true => {
                        seen.accepted += 1;
                        *seen.per_table.entry(table).or_default() += 1;
                        200
                    }
                    false => {
                        seen.busy += 1;
                        503
                    }
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
    let backpressure = Arc::new(Backpressure::new(
        AdaptiveConfig {
            enabled: true,
            top_k: 1,
            ratio: 0.5,
            upgrade_interval: Duration::from_secs(1),
            downgrade_interval: Duration::from_secs(3),
            ..AdaptiveConfig::default()
        },
        TokioClock::new(),
    )?);
    let ticker = tokio::spawn(backpressure.ticker());
    let target = |request: &http::Request<()>| {
        let table = request.headers().get("table")?.to_str().ok()?.to_owned();
        Some((RPC.to_owned(), table))
    };
    let client = ThrottleLayer::new(Arc::clone(&backpressure), target).layer(backend);

    let mut callers = tokio::task::JoinSet::new();
    for (table, per_second) in DEMAND {
        let mut client = client.clone();
        callers.spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1) / per_second);
            // A caller held back by its limit sends late rather than in a catch-up burst.
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let request = http::Request::builder()
                    .header("table", table)
                    .body(())
                    .expect("a valid request");
                let Ok(ready) = client.ready().await;
                let Ok(_) = ready.call(request).await;
            }
        });
    }

    let start = Instant::now();
    let seconds = (settings.warmup + settings.duration).as_secs().max(2);
    let mut timeline = Vec::with_capacity(seconds as usize);
    let mut cold_limited = false;
    for at in 1..=seconds {
        tokio::time::sleep_until(start + Duration::from_secs(at)).await;
        let now = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
        let limits: BTreeMap<String, f64> = backpressure
            .throttled()
            .into_iter()
            .map(|t| (t.key, t.qps_limit))
            .collect();
        cold_limited |= limits.keys().any(|table| table.starts_with("cold"));
        timeline.push(Second {
            at,
            arrived: now.accepted + now.busy,
            accepted: now.accepted,
            busy: now.busy,
            accepted_per_table: now.per_table,
            limits,
        });
    }
    callers.abort_all();
    ticker.abort();
    let settled = &timeline[timeline.len() / 2..];
    Ok(DorisBackpressure {
        capacity: CAPACITY,
        demand: DEMAND.iter().map(|(_, rate)| u64::from(*rate)).sum(),
        settled_arrivals: median(settled.iter().map(|s| s.arrived as f64).collect()),
        settled_busy: settled.iter().map(|s| s.busy as f64).sum::<f64>() / settled.len() as f64,
        cold_limited,
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On tokio's paused clock the control loop is exact: the callers settle under the
    /// backend's capacity, the hot table carries the cut, and no cold table is ever limited.
    #[tokio::test(start_paused = true)]
    async fn the_client_layer_keeps_the_backend_under_its_capacity() {
        let settings = ScenarioSettings {
            duration: Duration::from_secs(30),
            warmup: Duration::ZERO,
            runs: 1,
            binary: std::path::PathBuf::new(),
        };
        let report = doris_backpressure(&settings).await.unwrap();
        assert_eq!(report.timeline.len(), 30);
        assert_eq!(report.demand, 600);
        // Overloaded until the first busy answers tighten the hot table…
        let first = &report.timeline[0];
        assert!(
            first.arrived > CAPACITY && first.busy > 0,
            "{}",
            report.render()
        );
        // …then under the capacity, with fewer busy answers.
        assert!(
            report.settled_arrivals <= CAPACITY as f64,
            "{}",
            report.render()
        );
        assert!(
            report.settled_busy < first.busy as f64,
            "{}",
            report.render()
        );
        assert!(!report.cold_limited, "{}", report.render());
        let last = report.timeline.last().unwrap();
        assert!(last.limits.contains_key("hot"), "{}", report.render());
        let text = report.render();
        assert!(text.contains("limits held by the client"), "{text}");
    }
}
