//! How closely each limiter that counts so many hits per window keeps to "at most `limit` in
//! any `window`", against an exact sliding log, on bursty load.
//!
//! Run with `cargo bench -p weir --bench window_accuracy`. Every limiter
//! [`KeyedSpec::per_window`] knows (the window limiters and the token bucket) gets the same
//! arrivals on one key, through a whole `Policy` on a manual clock: time is simulated, so
//! the figures are exact and the same on every run and every machine. The exact sliding log
//! (every admitted hit's time kept; a hit is admitted if fewer than `limit` were admitted in
//! the `window` before it) gets the same arrivals beside them.
//!
//! For each load and limiter it prints:
//! - **admitted / log**: hits admitted, against what the exact log admitted from the same
//!   arrivals;
//! - **worst window**: the most hits the limiter admitted in any `window`, as a multiple of
//!   `limit` (the log's is 1.00 by construction);
//! - **windows over**: the share of admitted hits after which the last `window` holds more than
//!   `limit`;
//! - **refused early**: the share of its refusals that the exact log would have admitted given
//!   what the limiter itself had admitted (it was stricter than it had to be).

use std::collections::VecDeque;
use std::time::Duration;

use weir::ManualClock;
use weir::policy::{KeyedSpec, Limiter, Policy, PolicyConfig, Request};

const LIMIT: u64 = 100;
const WINDOW: u64 = 10_000_000_000;
const MS: u64 = 1_000_000;

/// A fixed xorshift generator: the same arrivals every run, no dependency.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential gap of mean `mean` nanoseconds.
    fn gap(&mut self, mean: f64) -> u64 {
        (-(1.0 - self.unit()).ln() * mean) as u64
    }
}

/// Arrival times, in nanoseconds, of each load.
fn loads() -> Vec<(&'static str, Vec<u64>)> {
    let windows = 200;
    // Three times the limit in 200 ms around every window's edge: the burst a fixed window
    // admits twice.
    let edges = (1..windows)
        .flat_map(|w| {
            let edge = w * WINDOW;
            (0..3 * LIMIT).map(move |i| edge - 100 * MS + i * 200 * MS / (3 * LIMIT))
        })
        .collect();
    // On for 2 s on average at five times the limit's rate, off for 8 s on average.
    let mut random = Random(0x9E37_79B9_7F4A_7C15);
    let mut on_off = Vec::new();
    let mut t = 0;
    let rate_gap = WINDOW as f64 / (5 * LIMIT) as f64;
    while t < windows * WINDOW {
        let on_until = t + random.gap(2e9);
        while t < on_until {
            on_off.push(t);
            t += random.gap(rate_gap);
        }
        t += random.gap(8e9);
    }
    // Twice the limit's rate, Poisson.
    let mut steady = Vec::new();
    let mut t = 0;
    while t < windows * WINDOW {
        steady.push(t);
        t += random.gap(WINDOW as f64 / (2 * LIMIT) as f64);
    }
    vec![
        ("3× limit at every window's edge", edges),
        ("on-off bursts at 5× the rate", on_off),
        ("steady at 2× the rate (Poisson)", steady),
    ]
}

/// Hits admitted in the `WINDOW` up to and including `now`, the log's front trimmed.
fn in_window(log: &mut VecDeque<u64>, now: u64) -> u64 {
    while log.front().is_some_and(|&t| t + WINDOW <= now) {
        log.pop_front();
    }
    log.len() as u64
}

struct Figures {
    admitted: u64,
    worst: u64,
    over: u64,
    refused: u64,
    refused_early: u64,
}

fn run(table: &str, arrivals: &[u64]) -> Figures {
    let clock = ManualClock::new(0);
    let mut config: PolicyConfig =
        toml::from_str("name = \"accuracy\"\non_exhausted = \"reject\"\nstrict = { qps = 1 }")
            .expect("valid config");
    config.limiter = Limiter::Keyed(
        KeyedSpec::per_window(table, LIMIT, Duration::from_nanos(WINDOW))
            .expect("a table it lists"),
    );
    let policy = Policy::new(config, clock.clone()).expect("valid policy");
    let mut log = VecDeque::new();
    let mut figures = Figures {
        admitted: 0,
        worst: 0,
        over: 0,
        refused: 0,
        refused_early: 0,
    };
    for &t in arrivals {
        clock.set(t);
        let before = in_window(&mut log, t);
        if policy.try_acquire(&Request::new("k")).is_ok() {
            log.push_back(t);
            figures.admitted += 1;
            figures.worst = figures.worst.max(before + 1);
            figures.over += u64::from(before + 1 > LIMIT);
        } else {
            figures.refused += 1;
            figures.refused_early += u64::from(before < LIMIT);
        }
    }
    figures
}

/// What the exact sliding log admits of `arrivals`.
fn exact(arrivals: &[u64]) -> u64 {
    let mut log = VecDeque::new();
    let mut admitted = 0;
    for &t in arrivals {
        if in_window(&mut log, t) < LIMIT {
            log.push_back(t);
            admitted += 1;
        }
    }
    admitted
}

fn main() {
    // `cargo bench` passes `--bench`; a filter is not used here.
    println!(
        "limit {LIMIT} per {} s window, one key; figures are exact (simulated time)\n",
        WINDOW / 1_000_000_000
    );
    for (load, arrivals) in loads() {
        let reference = exact(&arrivals);
        println!(
            "### {load} ({} arrivals; exact log admits {reference})\n",
            arrivals.len()
        );
        println!("| limiter | admitted / log | worst window | windows over | refused early |");
        println!("|---|---:|---:|---:|---:|");
        for table in KeyedSpec::per_window_tables() {
            let f = run(table, &arrivals);
            println!(
                "| {table} | {:.3} | {:.2}× | {:.2} % | {:.2} % |",
                f.admitted as f64 / reference as f64,
                f.worst as f64 / LIMIT as f64,
                100.0 * f.over as f64 / f.admitted.max(1) as f64,
                100.0 * f.refused_early as f64 / f.refused.max(1) as f64,
            );
        }
        println!();
    }
}
