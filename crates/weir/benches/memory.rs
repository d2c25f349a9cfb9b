//! What keys cost in memory.
//!
//! Run with `cargo bench -p weir --bench memory`. Two measurements, from the process's own
//! resident set (`/proc/self/status`), so allocator overhead is counted as it really is:
//!
//! 1. Churn: 10 million distinct keys stream through a policy whose `max_keys` is 1 million,
//!    each key taking one token and going idle a millisecond later. The peak resident set must
//!    stay bounded by the cap (goal ≤ 250 MB), however many keys pass.
//! 2. Bytes per key: the growth of the resident set while 1 million keys are inserted into a
//!    keyed limiter (goal ≤ 128 B per key, map included), and the same for governor's keyed
//!    limiter, measured the same way.

use std::num::NonZeroU32;
use std::time::Instant;

use governor::{Quota, RateLimiter};
use weir::SystemClock;
use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::policy::{Policy, PolicyConfig, Request};

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

fn churn() {
    let config: PolicyConfig = toml::from_str(
        r#"
        name = "churn"
        on_exhausted = "reject"
        max_keys = 1000000
        token_bucket = { rate = 1000, burst = 1 }
        "#,
    )
    .expect("valid config");
    let policy = Policy::new(config, SystemClock::new()).expect("valid policy");
    let start = Instant::now();
    let mut key = String::new();
    let mut admitted = 0u64;
    for i in 0..10_000_000u64 {
        use std::fmt::Write;
        key.clear();
        write!(key, "tenant-{i:010}").expect("writing to a String");
        if policy.try_acquire(&Request::new(&key)).is_ok() {
            admitted += 1;
        }
    }
    let stats = policy.stats();
    println!(
        "churn: 10M distinct keys through max_keys = 1M in {:.1?}: {} admitted, {} tracked at the end, {} evicted, {} overflowed; peak RSS {:.0} MB",
        start.elapsed(),
        admitted,
        stats.keys,
        stats.evictions,
        stats.overflow_hits,
        status_kib("VmHWM:") as f64 / 1024.0,
    );
}

const KEYS: u64 = 1_000_000;

fn key(i: u64) -> String {
    format!("tenant-{i:010}")
}

/// Resident-set growth per key while `insert` puts `KEYS` keys into a fresh map.
fn per_key(insert: impl FnOnce()) -> f64 {
    let before = status_kib("VmRSS:");
    insert();
    (status_kib("VmRSS:") - before) as f64 * 1024.0 / KEYS as f64
}

fn weir_per_key() {
    let limiter = KeyedLimiter::new(
        Shape::Gcra {
            interval: 1_000_000,
            capacity: 10,
            initial: 10,
            fair: false,
        },
        KEYS as usize,
        Overflow::Shared,
        SystemClock::new(),
    );
    let bytes = per_key(|| {
        for i in 0..KEYS {
            let _ = limiter.try_acquire(&key(i), 1);
        }
    });
    assert_eq!(limiter.counters().keys, KEYS);
    println!(
        "bytes per key, weir keyed limiter: {bytes:.0} B (1M keys like \"tenant-0000000042\")"
    );
}

fn governor_per_key() {
    let quota = Quota::per_second(NonZeroU32::new(1000).expect("non-zero"));
    let limiter = RateLimiter::dashmap(quota);
    let bytes = per_key(|| {
        for i in 0..KEYS {
            let _ = limiter.check_key(&key(i));
        }
    });
    assert_eq!(limiter.len(), KEYS as usize);
    println!("bytes per key, governor dashmap: {bytes:.0} B (same keys)");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    // Each measurement runs in a fresh process of its own, so that memory freed by one (and
    // kept by the allocator) cannot hide the growth of the next, and peaks are not shared.
    match args.get(1).map(String::as_str) {
        Some("churn") => churn(),
        Some("weir-per-key") => weir_per_key(),
        Some("governor-per-key") => governor_per_key(),
        _ => {
            let me = std::env::current_exe().expect("own path");
            for phase in ["churn", "weir-per-key", "governor-per-key"] {
                let status = std::process::Command::new(&me)
                    .arg(phase)
                    .status()
                    .expect("run a phase");
                assert!(status.success(), "phase {phase} failed");
            }
        }
    }
}
