//! Rate accuracy under contention: many tasks waiting on one fair bucket, in real time.
//!
//! Run with `cargo bench -p weir --bench fair_contention`. 1000 tasks loop on `acquire(1)`
//! against one fair bucket refilling 100 000 tokens/s (1000 every 10 ms, at most 10 000, starting
//! empty) for 2 s of wall time on a 2-worker tokio runtime. The admitted rate should be within
//! 1 % of the configured one. The leaky-bucket crate (what a page server's per-tenant throttle
//! runs on) runs the same load beside it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use weir::{LeakyBucket, LeakyBucketConfig};

const TASKS: usize = 1000;
const RATE: f64 = 100_000.0;
const RUN_FOR: Duration = Duration::from_secs(2);

/// Runs `TASKS` tasks calling `acquire` until time is up; returns admissions per second.
async fn measure<F, Fut>(acquire: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (acquire, admitted, stop) = (acquire.clone(), admitted.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    acquire().await;
                    if start.elapsed() <= RUN_FOR {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
    admitted.load(Ordering::Relaxed) as f64 / RUN_FOR.as_secs_f64()
}

fn report(name: &str, rate: f64) {
    println!(
        "{name:<22} admitted {rate:>9.0}/s of {RATE:.0}/s configured: {:+.2} %",
        (rate / RATE - 1.0) * 100.0
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let weir = Arc::new(
            LeakyBucket::new(LeakyBucketConfig {
                initial: 0,
                refill_interval: Duration::from_millis(10),
                refill_amount: 1000,
                max: 10_000,
                fair: true,
            })
            .unwrap(),
        );
        let rate = measure(move || {
            let weir = weir.clone();
            async move {
                weir.acquire(1).await;
            }
        })
        .await;
        report("weir fair leaky bucket", rate);

        let crate_bucket = Arc::new(
            leaky_bucket::RateLimiter::builder()
                .initial(0)
                .refill(1000)
                .interval(Duration::from_millis(10))
                .max(10_000)
                .fair(true)
                .build(),
        );
        let rate = measure(move || {
            let bucket = crate_bucket.clone();
            async move {
                bucket.acquire_one().await;
            }
        })
        .await;
        report("leaky-bucket crate", rate);
    });
}
