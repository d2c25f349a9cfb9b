//! A short tour of Weir's four limiters, in real time (about four seconds).
//!
//! Run with `cargo run --release -p weir --example tour`. Each section drives one limiter and
//! prints what it decided and when, in milliseconds since the section started.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use weir::{
    Concurrency, ConcurrencyConfig, LeakyBucket, LeakyBucketConfig, Strict, StrictConfig,
    TokenBucket, TokenBucketConfig,
};

fn ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}

async fn token_bucket() {
    println!("\n1. TokenBucket {{ rate: 5/s, burst: 3 }} — starts full, refills continuously");
    let bucket = TokenBucket::new(TokenBucketConfig {
        rate: 5.0,
        burst: 3,
    })
    .expect("valid config");
    let start = Instant::now();
    for i in 1..=5 {
        match bucket.try_acquire(1) {
            Ok(()) => println!("   t={:>4} ms  request {i}: admitted", ms(start)),
            Err(refused) => println!("   t={:>4} ms  request {i}: {refused}", ms(start)),
        }
    }
    for i in 6..=8 {
        let admitted = bucket.acquire(1).await;
        println!(
            "   t={:>4} ms  request {i}: admitted after waiting {} ms",
            ms(start),
            admitted.waited().as_millis()
        );
    }
}

async fn fair_leaky_bucket() {
    println!(
        "\n2. LeakyBucket {{ 1 token per 100 ms, max 5, initial 0, fair }} — arrival order wins"
    );
    let bucket = Arc::new(
        LeakyBucket::new(LeakyBucketConfig {
            initial: 0,
            refill_interval: Duration::from_millis(100),
            refill_amount: 1,
            max: 5,
            fair: true,
        })
        .expect("valid config"),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (name, cost) in [("big", 4), ("small-1", 1), ("small-2", 1)] {
        let bucket = Arc::clone(&bucket);
        println!(
            "   t={:>4} ms  {name} (cost {cost}) starts waiting",
            ms(start)
        );
        tasks.push(tokio::spawn(async move {
            bucket.acquire(cost).await;
            println!("   t={:>4} ms  {name} (cost {cost}) admitted", ms(start));
        }));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.expect("task ran");
    }
    println!(
        "   the small ones could have fit sooner, but a fair bucket never lets them starve the big one"
    );
}

async fn strict() {
    println!("\n3. Strict {{ qps: 4 }} — exactly 250 ms apart, no burst even after idling");
    let strict = Strict::new(StrictConfig { qps: 4.0 }).expect("valid config");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    for i in 1..=4 {
        strict.acquire(1).await;
        println!("   t={:>4} ms  request {i} runs", ms(start));
    }
}

async fn concurrency() {
    println!("\n4. Concurrency {{ limit: 2 }} — five jobs of 300 ms each, two at a time");
    let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 2 }));
    let start = Instant::now();
    let tasks: Vec<_> = (1..=5)
        .map(|job| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let _permit = limiter.acquire_owned(1).await;
                println!("   t={:>4} ms  job {job} starts", ms(start));
                tokio::time::sleep(Duration::from_millis(300)).await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task ran");
    }
}

async fn live_reconfiguration() {
    println!("\n5. Live reconfiguration — 2/s raised to 20/s while a request waits");
    let bucket = Arc::new(
        TokenBucket::new(TokenBucketConfig {
            rate: 2.0,
            burst: 1,
        })
        .expect("valid config"),
    );
    bucket.try_acquire(1).expect("starts full");
    let start = Instant::now();
    println!(
        "   t={:>4} ms  bucket empty; at 2/s the next token is 500 ms away",
        ms(start)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    bucket
        .reconfigure(TokenBucketConfig {
            rate: 20.0,
            burst: 1,
        })
        .expect("valid config");
    println!(
        "   t={:>4} ms  rate set to 20/s: the fifth of a token already accrued is kept",
        ms(start)
    );
    bucket.acquire(1).await;
    println!(
        "   t={:>4} ms  admitted (0.2 token kept, 0.8 more at 20/s = 40 ms)",
        ms(start)
    );
    let refused = bucket
        .reconfigure(TokenBucketConfig {
            rate: -1.0,
            burst: 1,
        })
        .unwrap_err();
    println!("   a bad change is refused and the old one stays: {refused}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("Weir — a tour of the four limiters");
    token_bucket().await;
    fair_leaky_bucket().await;
    strict().await;
    concurrency().await;
    live_reconfiguration().await;
}
