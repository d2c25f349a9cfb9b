//! Keyed decisions at 1, 1 000 and 1 000 000 keys, beside governor's keyed limiter.
//!
//! Run with `cargo bench -p weir --bench keyed`. Both limiters hold one bucket per key, admit
//! every request (limits far above the loop's rate) and see the keys in the same order: a
//! shuffled cycle over the key set, so large key sets miss the caches as they would in a
//! server. governor's keyed limiter is its dashmap store with the standard library's SipHash,
//! the same hasher Weir uses. Each side also runs on its coarse clock (Weir's `CoarseClock`,
//! governor's `QuantaUpkeepClock`, both refreshed every millisecond), where a decision reads the
//! time from memory. A later group runs the same decision through a whole `Policy`, and a last
//! one each limiter's that counts so many hits per window.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter};
use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::policy::{KeyedSpec, Limiter, Policy, PolicyConfig, Request};
use weir::{Clock, CoarseClock, SystemClock};

/// Keys like a tenant id, in a fixed pseudo-random order.
fn keys(count: usize) -> Vec<String> {
    let mut keys: Vec<String> = (0..count).map(|i| format!("tenant-{i:08}")).collect();
    // A fixed xorshift shuffle: the same order every run, no dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..keys.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        keys.swap(i, (state % (i as u64 + 1)) as usize);
    }
    keys
}

/// One keyed Weir limiter over `keys` on `clock`, measured as `name`.
fn bench_weir<C: Clock>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    keys: &[String],
    clock: C,
) {
    let weir = KeyedLimiter::new(
        Shape::Gcra {
            interval: 1,
            capacity: 1_000_000_000,
            initial: 1_000_000_000,
            fair: false,
        },
        keys.len().max(1),
        Overflow::Shared,
        clock,
    );
    for key in keys {
        let _ = weir.try_acquire(key, 1);
    }
    let mut i = 0;
    group.bench_function(BenchmarkId::new(name, keys.len()), |b| {
        b.iter(|| {
            i = if i + 1 == keys.len() { 0 } else { i + 1 };
            black_box(weir.try_acquire(black_box(&keys[i]), 1).is_ok())
        })
    });
}

fn keyed(c: &mut Criterion) {
    let coarse = CoarseClock::new(CoarseClock::DEFAULT_INTERVAL).expect("a clock thread");
    let upkeep =
        QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("an upkeep thread");
    let mut group = c.benchmark_group("keyed_try_acquire");
    for count in [1usize, 1_000, 1_000_000] {
        let keys = keys(count);

        bench_weir(&mut group, "weir", &keys, SystemClock::new());
        bench_weir(&mut group, "weir_coarse", &keys, coarse.clone());

        let max = NonZeroU32::MAX;
        let governor = RateLimiter::dashmap(Quota::per_second(max).allow_burst(max));
        for key in &keys {
            let _ = governor.check_key(key);
        }
        let mut i = 0;
        group.bench_function(BenchmarkId::new("governor_dashmap", count), |b| {
            b.iter(|| {
                i = if i + 1 == keys.len() { 0 } else { i + 1 };
                black_box(governor.check_key(black_box(&keys[i])).is_ok())
            })
        });
        drop(governor);

        let governor = RateLimiter::dashmap_with_clock(
            Quota::per_second(max).allow_burst(max),
            upkeep.clone(),
        );
        for key in &keys {
            let _ = governor.check_key(key);
        }
        let mut i = 0;
        group.bench_function(BenchmarkId::new("governor_dashmap_upkeep", count), |b| {
            b.iter(|| {
                i = if i + 1 == keys.len() { 0 } else { i + 1 };
                black_box(governor.check_key(black_box(&keys[i])).is_ok())
            })
        });
    }
    group.finish();

    // The same decision through a whole policy (kind check, counters, admission object).
    let mut group = c.benchmark_group("policy_try_acquire");
    let keys = keys(1_000);
    let config: PolicyConfig = toml::from_str(
        "name = \"bench\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 1000000000, burst = 1000000000 }",
    )
    .expect("valid config");
    bench_policy(
        &mut group,
        BenchmarkId::new("weir_policy", 1_000),
        config,
        &keys,
    );
    group.finish();

    // Every limiter that counts so many hits per window (the windows, a token bucket), through
    // a whole policy, far below its limit per key.
    let mut group = c.benchmark_group("per_window_try_acquire");
    for table in KeyedSpec::per_window_tables() {
        let mut config: PolicyConfig =
            toml::from_str("name = \"bench\"\non_exhausted = \"reject\"\nstrict = { qps = 1 }")
                .expect("valid config");
        let spec = KeyedSpec::per_window(table, 4_000_000, Duration::from_secs(1))
            .expect("a table it lists");
        config.limiter = Limiter::Keyed(spec);
        bench_policy(&mut group, BenchmarkId::new(table, 1_000), config, &keys);
    }
    group.finish();
}

/// One policy of `config` deciding for `keys` in turn, measured as `id`.
fn bench_policy(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    config: PolicyConfig,
    keys: &[String],
) {
    let policy = Policy::new(config, SystemClock::new()).expect("valid policy");
    let mut i = 0;
    group.bench_function(id, |b| {
        b.iter(|| {
            i = if i + 1 == keys.len() { 0 } else { i + 1 };
            black_box(
                policy
                    .try_acquire(&Request::new(black_box(&keys[i])))
                    .is_ok(),
            )
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = keyed
}
criterion_main!(benches);
