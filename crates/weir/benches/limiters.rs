//! Single-operation costs of Weir's limiters beside the crates people use today.
//!
//! Run with `cargo bench -p weir --bench limiters`. Every group measures the *admitted* path
//! (limits far above what the loop can reach), on the limiter's default clock:
//!
//! - `clock`: what one time reading costs (`SystemClock`, `std::time::Instant`, `quanta`);
//! - `try_acquire`: one uncontended decision — Weir's token and leaky buckets against
//!   governor's direct limiter and the leaky-bucket crate; then Weir's limiters on
//!   `CoarseClock` beside governor on its `QuantaUpkeepClock` (both refreshed every
//!   millisecond), where the time is read from memory;
//! - `concurrency`: acquire + release of one permit against tokio's `Semaphore`.
//!
//! Scaling across threads is measured by the `scaling` bench, fairness under contention by
//! `fair_contention`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter};
use weir::{
    Clock, CoarseClock, Concurrency, ConcurrencyConfig, LeakyBucket, LeakyBucketConfig, Strict,
    StrictConfig, SystemClock, TokenBucket, TokenBucketConfig,
};

/// A rate no loop on this machine reaches, so every decision admits.
const UNREACHABLE_RATE: u32 = 1_000_000_000;

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    let system = SystemClock::new();
    group.bench_function("weir_system_clock", |b| b.iter(|| black_box(system.now())));
    let coarse = CoarseClock::new(CoarseClock::DEFAULT_INTERVAL).expect("a clock thread");
    group.bench_function("weir_coarse_clock", |b| b.iter(|| black_box(coarse.now())));
    group.bench_function("std_instant_now", |b| b.iter(|| black_box(Instant::now())));
    let quanta = quanta::Clock::new();
    group.bench_function("quanta_now", |b| b.iter(|| black_box(quanta.now())));
    group.finish();
}

/// Weir's four rate limiters on `clock`, each deciding on a limit the loop never reaches.
fn weir_limiters<C: Clock + Clone>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    clock: C,
) {
    let token = TokenBucket::with_clock(
        TokenBucketConfig {
            rate: f64::from(UNREACHABLE_RATE),
            burst: u64::from(UNREACHABLE_RATE),
        },
        clock.clone(),
    )
    .unwrap();
    group.bench_function("weir_token_bucket", |b| {
        b.iter(|| black_box(token.try_acquire(black_box(1))))
    });

    for fair in [true, false] {
        let leaky = LeakyBucket::with_clock(
            LeakyBucketConfig {
                initial: u64::from(UNREACHABLE_RATE),
                refill_interval: Duration::from_secs(1),
                refill_amount: u64::from(UNREACHABLE_RATE),
                max: u64::from(UNREACHABLE_RATE),
                fair,
            },
            clock.clone(),
        )
        .unwrap();
        let name = if fair {
            "weir_leaky_bucket_fair"
        } else {
            "weir_leaky_bucket_unfair"
        };
        group.bench_function(name, |b| {
            b.iter(|| black_box(leaky.try_acquire(black_box(1))))
        });
    }

    let strict = Strict::with_clock(
        StrictConfig {
            qps: f64::from(UNREACHABLE_RATE),
        },
        clock,
    )
    .unwrap();
    group.bench_function("weir_strict", |b| {
        b.iter(|| black_box(strict.try_acquire(black_box(1))))
    });
}

fn try_acquire(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire");
    weir_limiters(&mut group, SystemClock::new());

    let max = NonZeroU32::new(UNREACHABLE_RATE).unwrap();
    let governor = RateLimiter::direct(Quota::per_second(max).allow_burst(max));
    group.bench_function("governor_direct", |b| {
        b.iter(|| black_box(governor.check()))
    });

    let leaky_crate = leaky_bucket::RateLimiter::builder()
        .initial(UNREACHABLE_RATE as usize)
        .refill(UNREACHABLE_RATE as usize)
        .interval(Duration::from_secs(1))
        .max(UNREACHABLE_RATE as usize)
        .build();
    group.bench_function("leaky_bucket_crate", |b| {
        b.iter(|| black_box(leaky_crate.try_acquire(black_box(1))))
    });
    group.finish();
}

/// The same decisions on a clock read from memory: Weir's `CoarseClock` and governor's
/// `QuantaUpkeepClock`, both refreshed every millisecond.
fn try_acquire_coarse(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire_coarse");
    weir_limiters(
        &mut group,
        CoarseClock::new(CoarseClock::DEFAULT_INTERVAL).expect("a clock thread"),
    );

    let max = NonZeroU32::new(UNREACHABLE_RATE).unwrap();
    let upkeep =
        QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("an upkeep thread");
    let governor = RateLimiter::direct_with_clock(Quota::per_second(max).allow_burst(max), upkeep);
    group.bench_function("governor_direct_upkeep", |b| {
        b.iter(|| black_box(governor.check()))
    });
    group.finish();
}

fn concurrency(c: &mut Criterion) {
    let mut group = c.benchmark_group("concurrency");
    let weir = Concurrency::new(ConcurrencyConfig { limit: 1_000_000 });
    group.bench_function("weir_acquire_release", |b| {
        b.iter(|| drop(black_box(weir.try_acquire(black_box(1)))))
    });
    let tokio = tokio::sync::Semaphore::new(1_000_000);
    group.bench_function("tokio_semaphore_acquire_release", |b| {
        b.iter(|| drop(black_box(tokio.try_acquire())))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = clock, try_acquire, try_acquire_coarse, concurrency
}
criterion_main!(benches);
