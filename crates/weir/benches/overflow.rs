//! Keys past the cap: what counting them in the sketch costs in refusals, memory and time.
//!
//! Run with `cargo bench -p weir --bench overflow`. Two measurements:
//!
//! 1. **False refusals under a Zipf load.** A day quota (100 a day per key, burst 100; then 5)
//!    with
//!    `max_keys` of 10 000 and 10 times as many keys asking, ranked by a Zipf law (s = 1): two
//!    million requests spread over an hour of a manual clock. The same requests go to a limiter
//!    that tracks every key exactly (no cap) and to capped ones that put keys past the cap in
//!    the sketch, in one shared bucket, or refuse them. Reported per mode: requests admitted, the
//!    share of the exact limiter's admissions that the mode refused (false refusals), its
//!    admissions the exact limiter refused, and the most any key was admitted against its bound
//!    of `burst + rate × t` (over the hour: 104, then 6). The sketch must never pass the bound.
//! 2. **Decision cost.** A million decisions on keys in the exact map and a million on keys in
//!    the sketch, in one run, on the system clock; nanoseconds per decision and their ratio.
//!
//! Memory: the sketch's size is printed beside the exact map's (109 bytes a key, `--bench
//! memory`).

use std::collections::HashMap;
use std::time::Instant;

use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::{ManualClock, SystemClock};

const MAX_KEYS: usize = 10_000;
const KEYS: usize = 10 * MAX_KEYS;
const REQUESTS: u64 = 2_000_000;
const HOUR_NS: u64 = 3_600_000_000_000;

/// A day quota: `per_day` a day, all of it at once if asked.
fn day_quota(per_day: u64) -> Shape {
    Shape::Gcra {
        interval: 86_400_000_000_000 / per_day,
        capacity: per_day,
        initial: per_day,
        fair: false,
    }
}

/// xorshift64*: a fixed sequence, so every run sees the same requests.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Key ranks drawn by a Zipf law of exponent 1 over `n` keys (inverse of the cumulative sum).
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize) -> Self {
        let mut sum = 0.0;
        let mut cumulative: Vec<f64> = (1..=n)
            .map(|rank| {
                sum += 1.0 / rank as f64;
                sum
            })
            .collect();
        for c in &mut cumulative {
            *c /= sum;
        }
        Zipf(cumulative)
    }

    fn rank(&self, draws: &mut Draws) -> usize {
        let u = draws.unit();
        self.0.partition_point(|c| *c < u).min(self.0.len() - 1)
    }
}

struct Mode {
    name: &'static str,
    limiter: KeyedLimiter<ManualClock>,
    admitted: u64,
    false_refusals: u64,
    beyond_exact: u64,
    per_key: HashMap<usize, u64>,
}

fn false_refusals(per_day: u64) {
    let clock = ManualClock::new(0);
    let exact = KeyedLimiter::new(
        day_quota(per_day),
        usize::MAX,
        Overflow::Reject,
        clock.clone(),
    );
    let mut modes: Vec<Mode> = [
        ("sketch", Overflow::Sketch),
        ("shared", Overflow::Shared),
        ("reject", Overflow::Reject),
    ]
    .into_iter()
    .map(|(name, overflow)| Mode {
        name,
        limiter: KeyedLimiter::new(day_quota(per_day), MAX_KEYS, overflow, clock.clone()),
        admitted: 0,
        false_refusals: 0,
        beyond_exact: 0,
        per_key: HashMap::new(),
    })
    .collect();
    let zipf = Zipf::new(KEYS);
    let mut draws = Draws(0x9e37_79b9_7f4a_7c15);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("user-{k:06}")).collect();
    let mut exact_admitted = 0u64;
    let started = Instant::now();
    for request in 0..REQUESTS {
        clock.set(request * HOUR_NS / REQUESTS);
        let rank = zipf.rank(&mut draws);
        let key = &keys[rank];
        let by_exact = exact.try_acquire(key, 1).is_ok();
        exact_admitted += u64::from(by_exact);
        for mode in &mut modes {
            let admitted = mode.limiter.try_acquire(key, 1).is_ok();
            if admitted {
                mode.admitted += 1;
                *mode.per_key.entry(rank).or_default() += 1;
            }
            mode.false_refusals += u64::from(by_exact && !admitted);
            mode.beyond_exact += u64::from(admitted && !by_exact);
        }
    }
    // Over the hour a key may take its burst and what an hour refills.
    let bound = per_day + per_day.div_ceil(24);
    println!(
        "Zipf (s = 1) over {KEYS} keys, max_keys = {MAX_KEYS}, {REQUESTS} requests in an hour, a quota of {per_day} a day ({:.1?}):",
        started.elapsed()
    );
    println!("  exact (no cap): {exact_admitted} admitted");
    println!(
        "  {:<7} {:>10} {:>9} {:>14} {:>14} {:>14} {:>12}",
        "mode", "admitted", "overflow", "false refusals", "beyond exact", "most a key", "sketch"
    );
    for mode in &modes {
        let counters = mode.limiter.counters();
        let most = mode.per_key.values().max().copied().unwrap_or(0);
        println!(
            "  {:<7} {:>10} {:>9} {:>13.3}% {:>14} {:>8} ≤ {bound} {:>8} KiB",
            mode.name,
            mode.admitted,
            counters.overflow_hits,
            100.0 * mode.false_refusals as f64 / exact_admitted as f64,
            mode.beyond_exact,
            most,
            counters.sketch_bytes / 1024,
        );
        if mode.name == "sketch" {
            assert!(
                most <= bound,
                "a key was admitted {most} times against a bound of {bound}"
            );
        }
    }
    println!(
        "  the exact map at the cap: about {} KiB (109 bytes a key)",
        MAX_KEYS * 109 / 1024
    );
}

fn decision_cost() {
    const DECISIONS: usize = 1_000_000;
    const HELD: usize = 1_000;
    // A cap of HELD: the first HELD keys are held exactly and kept busy (a day quota), every
    // later key goes to the sketch.
    let limiter = KeyedLimiter::new(day_quota(100), HELD, Overflow::Sketch, SystemClock::new());
    let held: Vec<String> = (0..HELD).map(|k| format!("held-{k}")).collect();
    let past: Vec<String> = (0..HELD).map(|k| format!("past-{k}")).collect();
    for key in &held {
        let _ = limiter.try_acquire(key, 1);
    }
    let time = |keys: &[String]| {
        let started = Instant::now();
        let mut admitted = 0u64;
        for i in 0..DECISIONS {
            admitted += u64::from(
                limiter
                    .try_acquire(std::hint::black_box(&keys[i % keys.len()]), 0)
                    .is_ok(),
            );
        }
        std::hint::black_box(admitted);
        started.elapsed().as_nanos() as f64 / DECISIONS as f64
    };
    // Warm both paths, then alternate: three rounds each, in one run.
    let _ = (time(&held), time(&past));
    let mut exact_ns = Vec::new();
    let mut sketch_ns = Vec::new();
    for _ in 0..3 {
        exact_ns.push(time(&held));
        sketch_ns.push(time(&past));
    }
    let sketched = limiter.counters().sketched;
    assert!(sketched > 0, "no decision went to the sketch");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (exact, sketch) = (median(&mut exact_ns), median(&mut sketch_ns));
    println!(
        "decision cost ({DECISIONS} decisions a round, 3 rounds, median; spread in brackets): exact map {exact:.0} ns ({:.0}–{:.0}), sketch {sketch:.0} ns ({:.0}–{:.0}), sketch/exact {:.2}×",
        exact_ns[0],
        exact_ns[2],
        sketch_ns[0],
        sketch_ns[2],
        sketch / exact
    );
}

fn main() {
    // A generous quota (most keys stay within it) and a tight one (most are spent).
    false_refusals(100);
    false_refusals(5);
    decision_cost();
}
