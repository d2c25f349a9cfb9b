//! Weir's keyed limiter beside governor's, timed in alternating rounds in one process, printed as
//! ratios with their spread.
//!
//! Run with `cargo bench -p weir --bench keyed_pairs [-- ROUNDS [KEYS…]]` (defaults: 41 rounds;
//! 1, 1 000 and 1 000 000 keys). Where `keyed` (criterion) times each limiter in turn, a few
//! seconds apart, this one times both in short blocks that alternate (which goes first swaps
//! every round), so a change in the machine's load lands on both sides of each ratio; the
//! median ratio over the rounds and its range are the figures. Two pairs: each limiter on its
//! precise clock, and each on its coarse one (Weir's `CoarseClock`, governor's
//! `QuantaUpkeepClock`, both refreshed every millisecond).
//!
//! Keys arrive as a server sees them: the request's key is fresh in memory (the requests'
//! strings are laid out in the order they are decided), while the map was filled in an order
//! unrelated to it (by name), so the map's entries are where the first requests put them. Every
//! decision admits (limits far above the loop's rate).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::clock::{Clock as GovernorClock, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::{Clock, CoarseClock, SystemClock};

/// Decisions timed per side per round: this many, or one pass over a smaller key set (at least
/// 1 000, so that a block is long beside the clock's resolution).
const BLOCK: usize = 200_000;

/// A shuffled order of `0..count`, the same every run (xorshift, no dependency).
fn shuffled(count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

fn name(i: usize) -> String {
    format!("tenant-{i:08}")
}

fn weir<C: Clock>(count: usize, clock: C) -> KeyedLimiter<C> {
    let limiter = KeyedLimiter::new(
        Shape::Gcra {
            interval: 1,
            capacity: 1_000_000_000,
            initial: 1_000_000_000,
            fair: false,
        },
        count.max(1),
        Overflow::Shared,
        clock,
    );
    for i in 0..count {
        let _ = limiter.try_acquire(&name(i), 1);
    }
    limiter
}

type Governor<C> = RateLimiter<
    String,
    DashMapStateStore<String>,
    C,
    NoOpMiddleware<<C as GovernorClock>::Instant>,
>;

fn governor<C: GovernorClock>(count: usize, clock: C) -> Governor<C> {
    let max = NonZeroU32::MAX;
    let limiter = RateLimiter::dashmap_with_clock(Quota::per_second(max).allow_burst(max), clock);
    for i in 0..count {
        let _ = limiter.check_key(&name(i));
    }
    limiter
}

/// Nanoseconds per decision over one block of `requests`, starting at `*next`.
fn block(requests: &[String], next: &mut usize, mut decide: impl FnMut(&String) -> bool) -> f64 {
    let n = BLOCK.min(requests.len().max(1000));
    let start = Instant::now();
    for _ in 0..n {
        *next = if *next + 1 >= requests.len() {
            0
        } else {
            *next + 1
        };
        black_box(decide(black_box(&requests[*next])));
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Times `a` and `b` alternately for `rounds` rounds; prints each side's median and the ratio's.
fn pair(
    label: &str,
    rounds: usize,
    requests: &[String],
    mut a: impl FnMut(&String) -> bool,
    mut b: impl FnMut(&String) -> bool,
) {
    let (mut next_a, mut next_b) = (0, 0);
    // One unrecorded round each, to touch what the first block would otherwise pay for.
    block(requests, &mut next_a, &mut a);
    block(requests, &mut next_b, &mut b);
    let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (x, y) = if round % 2 == 0 {
            let x = block(requests, &mut next_a, &mut a);
            (x, block(requests, &mut next_b, &mut b))
        } else {
            let y = block(requests, &mut next_b, &mut b);
            (block(requests, &mut next_a, &mut a), y)
        };
        ta.push(x);
        tb.push(y);
        ratios.push(x / y);
    }
    let (ma, mb, mr) = (median(&mut ta), median(&mut tb), median(&mut ratios));
    let q = |p: usize| ratios[(ratios.len() - 1) * p / 4];
    println!(
        "{label:<28} {:>9} keys  weir {ma:7.1} ns  governor {mb:7.1} ns  ratio {mr:.3} (quartiles {:.3}–{:.3}, range {:.3}–{:.3}, {rounds} rounds)",
        requests.len(),
        q(1),
        q(3),
        ratios[0],
        ratios[ratios.len() - 1],
    );
}

fn main() {
    // `cargo bench` passes `--bench`; numbers are ours.
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = numbers.first().copied().unwrap_or(41).max(1);
    let counts = if numbers.len() > 1 {
        numbers[1..].to_vec()
    } else {
        vec![1, 1_000, 1_000_000]
    };
    let coarse = CoarseClock::new(CoarseClock::DEFAULT_INTERVAL).expect("a clock thread");
    let upkeep =
        QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("an upkeep thread");
    for count in counts {
        let requests: Vec<String> = shuffled(count).into_iter().map(name).collect();
        {
            let w = weir(count, SystemClock::new());
            let g = governor(count, governor::clock::DefaultClock::default());
            pair(
                "precise clocks",
                rounds,
                &requests,
                |key| w.try_acquire(key, 1).is_ok(),
                |key| g.check_key(key).is_ok(),
            );
        }
        {
            let w = weir(count, coarse.clone());
            let g = governor(count, upkeep.clone());
            pair(
                "coarse clocks",
                rounds,
                &requests,
                |key| w.try_acquire(key, 1).is_ok(),
                |key| g.check_key(key).is_ok(),
            );
        }
    }
}
