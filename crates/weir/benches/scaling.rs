//! How decisions scale from one thread to two.
//!
//! Run with `cargo bench -p weir --bench scaling`. Each case runs a fixed number of admitted
//! `try_acquire` calls per thread and reports throughput; the ratio of two threads to one is the
//! figure to read. Two threads on two limiters should scale almost linearly (each bucket sits on
//! its own cache line); two threads on one limiter contend for one atomic and are reported as
//! they are.

use std::hint::black_box;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use weir::{TokenBucket, TokenBucketConfig};

/// Keeps each of governor's limiters on its own cache line, as Weir's buckets already are, so the
/// two-limiter case measures the limiter and not false sharing.
#[repr(align(128))]
struct Padded<T>(T);

const OPS_PER_THREAD: u64 = 20_000_000;
const ROUNDS: usize = 5;

fn bucket() -> TokenBucket {
    TokenBucket::new(TokenBucketConfig {
        rate: 1e9,
        burst: 1_000_000_000,
    })
    .unwrap()
}

/// Runs `work` on `threads` threads at once and returns the best (shortest) wall time of a few
/// rounds, as decisions per second.
fn throughput(threads: usize, work: impl Fn(usize) + Sync) -> f64 {
    let best = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let work = &work;
                    s.spawn(move || work(t));
                }
            });
            start.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    (threads as u64 * OPS_PER_THREAD) as f64 / best.as_secs_f64()
}

fn run(name: &str, one: f64, two_separate: f64, two_shared: f64) {
    println!(
        "{name:<22} 1 thread {:>7.1} M/s | 2 threads, 2 limiters {:>7.1} M/s ({:.2}x) | 2 threads, 1 limiter {:>7.1} M/s ({:.2}x)",
        one / 1e6,
        two_separate / 1e6,
        two_separate / one,
        two_shared / 1e6,
        two_shared / one,
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        // `cargo test --benches` asks for a listing; there is nothing to list.
        return;
    }
    let limiters = [bucket(), bucket()];
    let weir = |t: usize| {
        for _ in 0..OPS_PER_THREAD {
            let _ = black_box(limiters[t].try_acquire(black_box(1)));
        }
    };
    let shared = |_t: usize| {
        for _ in 0..OPS_PER_THREAD {
            let _ = black_box(limiters[0].try_acquire(black_box(1)));
        }
    };
    run(
        "weir token bucket",
        throughput(1, weir),
        throughput(2, weir),
        throughput(2, shared),
    );

    let quota = Quota::per_second(std::num::NonZeroU32::MAX).allow_burst(std::num::NonZeroU32::MAX);
    let governors = [
        Padded(RateLimiter::direct(quota)),
        Padded(RateLimiter::direct(quota)),
    ];
    let gov = |t: usize| {
        for _ in 0..OPS_PER_THREAD {
            let _ = black_box(governors[t].0.check());
        }
    };
    let gov_shared = |_t: usize| {
        for _ in 0..OPS_PER_THREAD {
            let _ = black_box(governors[0].0.check());
        }
    };
    run(
        "governor direct",
        throughput(1, gov),
        throughput(2, gov),
        throughput(2, gov_shared),
    );
}
