//! A load client for the bench scripts: open-loop HTTP acquires, or a gRPC acquire stream.
//!
//! ```text
//! load http-open-loop ADDR RATE SECONDS [CONNECTIONS] [POLICY]
//! load grpc-stream ADDR REQUESTS [STREAMS] [POLICY]
//! ```
//!
//! `http-open-loop` sends `RATE` requests per second in total: a pacer thread releases request
//! `k` at its due time `start + k / RATE`, and `CONNECTIONS` tasks send them. Latency is measured
//! from the due time, so a slow server cannot hide its queueing (no coordinated omission); a
//! request sent more than one connection-slot late is also counted as late. `grpc-stream` pushes `REQUESTS` acquisitions through `STREAMS`
//! bidirectional streams as fast as they are answered and reports decisions per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio_stream::StreamExt;
use weir_server::proto::AcquireRequest;
use weir_server::proto::weir_client::WeirClient;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    match args.get(i).map(|a| a.parse::<T>()) {
        Some(Ok(v)) => v,
        _ => default.unwrap_or_else(|| {
            eprintln!("usage: load http-open-loop ADDR RATE SECONDS [CONNECTIONS] [POLICY] | load grpc-stream ADDR REQUESTS [STREAMS] [POLICY]");
            std::process::exit(2)
        }),
    }
}

/// Paces requests on an OS thread: `std::thread::sleep` wakes within tens of microseconds,
/// where tokio's timer rounds up to a millisecond and would add its own delay to every
/// latency measured from the due time.
fn pace(rate: u64, seconds: u64, start: Instant, tx: async_channel::Sender<(Instant, u64)>) {
    let total = rate * seconds;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    for k in 0..total {
        let due = start + interval.mul_f64(k as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if tx.send_blocking((due, k)).is_err() {
            return;
        }
    }
}

async fn http_open_loop(addr: String, rate: u64, seconds: u64, connections: u64, policy: String) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections as usize)
        .build()
        .expect("a client");
    let url = format!("http://{addr}/v1/acquire");
    let slot = Duration::from_secs_f64(connections as f64 / rate as f64);
    let start = Instant::now() + Duration::from_millis(200);
    // The queue between the pacer and the connections is unbounded: a request waiting in it
    // is late, and its latency (from its due time) says so.
    let (tx, rx) = async_channel::unbounded::<(Instant, u64)>();
    let pacer = std::thread::spawn(move || pace(rate, seconds, start, tx));
    let missed = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (client, url, policy, rx) = (client.clone(), url.clone(), policy.clone(), rx.clone());
        let (missed, refused) = (Arc::clone(&missed), Arc::clone(&refused));
        tasks.push(tokio::spawn(async move {
            let mut from_due = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut from_send =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            while let Ok((due, k)) = rx.recv().await {
                let sent = Instant::now();
                // Sent later than one connection's slot after it was due: counted as missed
                // (as pagebench does), but still sent and measured.
                if sent > due + slot {
                    missed.fetch_add(1, Ordering::Relaxed);
                }
                let body = format!(r#"{{"policy":"{policy}","key":"tenant-{}"}}"#, k % 1000);
                let answer = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match answer {
                    Ok(response) => {
                        if response.status() != 200 {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = response.bytes().await;
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let _ = from_due.record((due.elapsed().as_micros() as u64).max(1));
                let _ = from_send.record((sent.elapsed().as_micros() as u64).max(1));
            }
            (from_due, from_send)
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let mut service = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    for task in tasks {
        let (from_due, from_send) = task.await.expect("a load task");
        all.add(from_due).expect("same bounds");
        service.add(from_send).expect("same bounds");
    }
    pacer.join().expect("the pacer");
    let sent = all.len();
    println!(
        "http open loop: target {rate}/s for {seconds}s over {connections} connections: sent {sent} ({:.0}/s), late by more than a slot {}, non-200 {}; latency from due time: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        sent as f64 / seconds as f64,
        missed.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        all.value_at_quantile(0.5) as f64 / 1000.0,
        all.value_at_quantile(0.9) as f64 / 1000.0,
        all.value_at_quantile(0.99) as f64 / 1000.0,
        all.value_at_quantile(0.999) as f64 / 1000.0,
        all.max() as f64 / 1000.0,
    );
    println!(
        "  from send time (excludes the client's own queueing): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
        service.value_at_quantile(0.5) as f64 / 1000.0,
        service.value_at_quantile(0.99) as f64 / 1000.0,
        service.value_at_quantile(0.999) as f64 / 1000.0,
    );
}

async fn grpc_stream(addr: String, requests: u64, streams: u64, policy: String) {
    let per_stream = requests / streams;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (addr, policy) = (addr.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = WeirClient::connect(format!("http://{addr}"))
                .await
                .expect("connecting");
            let outgoing = tokio_stream::iter((0..per_stream).map(move |i| AcquireRequest {
                policy: policy.clone(),
                key: format!("tenant-{}", i % 1000),
                id: s * per_stream + i,
                ..Default::default()
            }));
            let mut answers = client
                .acquire_stream(outgoing)
                .await
                .expect("a stream")
                .into_inner();
            let mut admitted = 0u64;
            let mut answered = 0u64;
            while let Some(answer) = answers.next().await {
                let answer = answer.expect("an answer");
                answered += 1;
                admitted += u64::from(answer.admitted);
            }
            (answered, admitted)
        }));
    }
    let (mut answered, mut admitted) = (0, 0);
    for task in tasks {
        let (a, b) = task.await.expect("a stream task");
        answered += a;
        admitted += b;
    }
    let took = start.elapsed();
    println!(
        "grpc stream: {answered} decisions ({admitted} admitted) over {streams} streams in {:.2?}: {:.0} decisions/s",
        took,
        answered as f64 / took.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("http-open-loop") => {
            http_open_loop(
                arg(&args, 2, None),
                arg(&args, 3, None),
                arg(&args, 4, None),
                arg(&args, 5, Some(32)),
                arg(&args, 6, Some("p".to_owned())),
            )
            .await
        }
        Some("grpc-stream") => {
            grpc_stream(
                arg(&args, 2, None),
                arg(&args, 3, None),
                arg(&args, 4, Some(2)),
                arg(&args, 5, Some("p".to_owned())),
            )
            .await
        }
        _ => {
            let _: u8 = arg(&args, usize::MAX, None);
        }
    }
}
