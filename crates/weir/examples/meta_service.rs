//! A meta service that answers "busy" above a total rate, and a client with Weir's
//! `ThrottleLayer` that slows down only the hottest tables.
//!
//! Run with `cargo run --release -p weir --example meta_service`. The service and the client
//! are tower services in one process; time is tokio's paused clock, so 20 simulated seconds run
//! in a moment and print the same timeline every time.
//!
//! The service accepts 300 calls per second in total and answers 503 beyond that. The client
//! drives one hot table (400 calls/s), one warm (150/s) and five cold ones (10/s each). Each
//! second the example prints what the service saw and the limits the client holds.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{Layer, Service, ServiceExt, service_fn};
use weir::TokioClock;
use weir::backpressure::{AdaptiveConfig, Backpressure};
use weir::layer::ThrottleLayer;

const CAPACITY_PER_SECOND: u64 = 300;
const RPC: &str = "PREPARE_ROWSET";

/// Calls and busy answers in the current second, and per table.
#[derive(Default)]
struct Seen {
    second: u64,
    accepted: u64,
    busy: u64,
    per_table: BTreeMap<String, u64>,
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let start = tokio::time::Instant::now();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let meta_service = {
        let seen = Arc::clone(&seen);
        service_fn(move |request: http::Request<String>| {
            let seen = Arc::clone(&seen);
            async move {
                let table = request.headers()["table"]
                    .to_str()
                    .unwrap_or("?")
                    .to_owned();
                let mut seen = seen.lock().expect("not poisoned");
                let status = if seen.accepted < CAPACITY_PER_SECOND {
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
                        .body(String::new())
                        .expect("a valid response"),
                )
            }
        })
    };

    let backpressure = Arc::new(
        Backpressure::new(
            AdaptiveConfig {
                enabled: true,
                top_k: 1,
                ratio: 0.5,
                upgrade_interval: Duration::from_secs(1),
                downgrade_interval: Duration::from_secs(3),
                ..AdaptiveConfig::default()
            },
            TokioClock::new(),
        )
        .expect("valid config"),
    );
    tokio::spawn(backpressure.ticker());
    let target = |request: &http::Request<String>| {
        let table = request.headers().get("table")?.to_str().ok()?.to_owned();
        Some((RPC.to_owned(), table))
    };
    let client = ThrottleLayer::new(Arc::clone(&backpressure), target).layer(meta_service);

    let mut tables = vec![("hot", 400u64), ("warm", 150)];
    let cold: Vec<String> = (1..=5).map(|i| format!("cold-{i}")).collect();
    tables.extend(cold.iter().map(|name| (name.as_str(), 10)));
    for (table, per_second) in tables {
        let mut client = client.clone();
        let table = table.to_owned();
        tokio::spawn(async move {
            let gap = Duration::from_secs(1) / per_second as u32;
            loop {
                let request = http::Request::builder()
                    .header("table", &table)
                    .body(String::new())
                    .expect("a valid request");
                let Ok(ready) = client.ready().await;
                let Ok(_) = ready.call(request).await;
                tokio::time::sleep(gap).await;
            }
        });
    }

    println!(
        "Meta service capacity: {CAPACITY_PER_SECOND} calls/s. Demand: hot 400/s, warm 150/s, 5 cold × 10/s."
    );
    println!(
        "{:>4}  {:>8}  {:>5}  {:<48}  limits held by the client",
        "t", "accepted", "busy", "accepted per table"
    );
    for second in 1..=20u64 {
        tokio::time::sleep_until(start + Duration::from_secs(second)).await;
        let mut seen = seen.lock().expect("not poisoned");
        let per_table: Vec<String> = ["hot", "warm", "cold-1"]
            .iter()
            .map(|t| format!("{t} {}", seen.per_table.get(*t).copied().unwrap_or(0)))
            .collect();
        let limits: Vec<String> = backpressure
            .throttled()
            .iter()
            .map(|t| format!("{} ≤ {:.1}/s", t.key, t.qps_limit))
            .collect();
        println!(
            "{:>3}s  {:>8}  {:>5}  {:<48}  {}",
            seen.second + 1,
            seen.accepted,
            seen.busy,
            per_table.join(", "),
            if limits.is_empty() {
                "none".to_owned()
            } else {
                limits.join(", ")
            }
        );
        *seen = Seen {
            second,
            ..Seen::default()
        };
    }
    let stats = backpressure.stats();
    println!(
        "\n{} busy answers led to {} upgrades and {} downgrades; cold tables were never limited: {}",
        stats.busy_signals,
        stats.upgrades,
        stats.downgrades,
        cold.iter().all(|t| backpressure.limit(RPC, t).is_none())
    );
}
