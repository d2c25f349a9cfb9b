//! Property tests: each limiter against a plain reference model, and the rate invariants.
//!
//! - Token and leaky buckets against the textbook token bucket (a fill level that grows with
//!   time up to the capacity and shrinks by each admitted cost): every decision and every
//!   retry-after must be identical.
//! - In any window of length `t`, the admitted cost is at most `burst + rate × t`.
//! - Nothing is admitted before its ready time: one nanosecond early is refused, on time is not.
//! - Strict reservations and concurrency permits against their own small models.
//! - A keyed limiter whose key map is too small, so it keeps evicting: every key it decides for
//!   must still decide exactly like a bucket that was never evicted.
//! - Any sequence of reshapes keeps a bucket's fill: whole tokens after a reshape are exactly
//!   the tokens before it, capped at the new capacity — none created, none lost — for a single
//!   token bucket and for every key of a keyed limiter.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use weir::keyed::{KeyedLimiter, KeyedRefusal, Overflow, Shape};
use weir::{
    Clock, Concurrency, ConcurrencyConfig, LeakyBucket, LeakyBucketConfig, ManualClock, Refused,
    Strict, StrictConfig, TokenBucket, TokenBucketConfig,
};

/// The textbook token bucket, in "nanoseconds of refill" so that it is exact.
struct ReferenceBucket {
    interval: u64,
    capacity_ns: u64,
    level_ns: u64,
    last: u64,
}

impl ReferenceBucket {
    fn new(interval: u64, capacity: u64, initial: u64, now: u64) -> Self {
        ReferenceBucket {
            interval,
            capacity_ns: interval * capacity,
            level_ns: interval * initial,
            last: now,
        }
    }

    fn try_acquire(&mut self, cost: u64, now: u64) -> Result<(), Refused> {
        self.level_ns = (self.level_ns + (now - self.last)).min(self.capacity_ns);
        self.last = now;
        let need = cost * self.interval;
        if need > self.capacity_ns {
            return Err(Refused::ExceedsCapacity {
                cost,
                capacity: self.capacity_ns / self.interval,
            });
        }
        if self.level_ns >= need {
            self.level_ns -= need;
            Ok(())
        } else {
            Err(Refused::RetryAfter {
                retry_after: Duration::from_nanos(need - self.level_ns),
            })
        }
    }
}

/// A bucket under test: either kind, built from the same numbers.
enum Subject {
    Token(TokenBucket<ManualClock>),
    Leaky(LeakyBucket<ManualClock>),
}

impl Subject {
    fn try_acquire(&self, cost: u64) -> Result<(), Refused> {
        match self {
            Subject::Token(b) => b.try_acquire(cost),
            Subject::Leaky(b) => b.try_acquire(cost),
        }
    }
}

#[derive(Debug, Clone)]
struct Setup {
    /// Nanoseconds per token.
    interval: u64,
    capacity: u64,
    initial: u64,
    leaky: bool,
}

impl Setup {
    fn build(&self, clock: &ManualClock) -> (Subject, ReferenceBucket) {
        let now = clock.now();
        let subject = if self.leaky {
            Subject::Leaky(
                LeakyBucket::with_clock(
                    LeakyBucketConfig {
                        initial: self.initial,
                        refill_interval: Duration::from_nanos(self.interval),
                        refill_amount: 1,
                        max: self.capacity,
                        fair: true,
                    },
                    clock.clone(),
                )
                .unwrap(),
            )
        } else {
            // A token bucket starts full; rate chosen so that 1e9 / rate is exactly `interval`
            // after rounding up.
            Subject::Token(
                TokenBucket::with_clock(
                    TokenBucketConfig {
                        rate: 1e9 / self.interval as f64,
                        burst: self.capacity,
                    },
                    clock.clone(),
                )
                .unwrap(),
            )
        };
        let initial = if self.leaky {
            self.initial
        } else {
            self.capacity
        };
        let model = ReferenceBucket::new(self.interval, self.capacity, initial, now);
        (subject, model)
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    // Intervals that are whole in nanoseconds both ways (1e9 / interval is exact), so the token
    // bucket's float rate maps back to the same interval.
    let interval = prop::sample::select(vec![
        1u64,
        1_000,
        2_000_000,
        10_000_000,
        20_000_000,
        1_000_000_000,
    ]);
    (interval, 1u64..40, any::<bool>())
        .prop_flat_map(|(interval, capacity, leaky)| {
            (Just(interval), Just(capacity), 0..=capacity, Just(leaky))
        })
        .prop_map(|(interval, capacity, initial, leaky)| Setup {
            interval,
            capacity,
            initial,
            leaky,
        })
}

/// Steps: how far to move the clock (in units of the interval, and a few odd nanoseconds) and
/// what to ask for.
fn steps(max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((0u64..4, 0u64..7, 0..=max_cost + 2), 1..150)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn buckets_decide_exactly_like_the_reference(setup in setup(), steps in steps(40)) {
        let clock = ManualClock::new(1_000);
        let (subject, mut model) = setup.build(&clock);
        for (intervals, odd_ns, cost) in steps {
            clock.advance(Duration::from_nanos(intervals * setup.interval + odd_ns));
            let now = clock.now();
            prop_assert_eq!(subject.try_acquire(cost), model.try_acquire(cost, now));
        }
    }

    #[test]
    fn no_window_admits_more_than_burst_plus_rate_times_t(setup in setup(), steps in steps(40)) {
        let clock = ManualClock::new(0);
        let (subject, _) = setup.build(&clock);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (intervals, odd_ns, cost) in steps {
            clock.advance(Duration::from_nanos(intervals * setup.interval + odd_ns));
            if subject.try_acquire(cost).is_ok() {
                admitted.push((clock.now(), cost));
            }
        }
        let capacity_ns = u128::from(setup.capacity * setup.interval);
        for i in 0..admitted.len() {
            let mut cost_in_window = 0u128;
            for j in i..admitted.len() {
                cost_in_window += u128::from(admitted[j].1);
                let t = u128::from(admitted[j].0 - admitted[i].0);
                // cost ≤ burst + t / interval, multiplied through by the interval.
                prop_assert!(
                    cost_in_window * u128::from(setup.interval) <= capacity_ns + t,
                    "{} tokens admitted in a window of {} ns", cost_in_window, t
                );
            }
        }
    }

    #[test]
    fn nothing_is_admitted_before_its_ready_time(setup in setup(), steps in steps(40), probe_cost in 1u64..40) {
        let clock = ManualClock::new(0);
        let (subject, _) = setup.build(&clock);
        for (intervals, odd_ns, cost) in steps {
            clock.advance(Duration::from_nanos(intervals * setup.interval + odd_ns));
            let _ = subject.try_acquire(cost);
        }
        if let Err(Refused::RetryAfter { retry_after }) = subject.try_acquire(probe_cost) {
            let wait = retry_after.as_nanos() as u64;
            prop_assert!(wait > 0);
            clock.advance(Duration::from_nanos(wait - 1));
            prop_assert_eq!(
                subject.try_acquire(probe_cost),
                Err(Refused::RetryAfter { retry_after: Duration::from_nanos(1) })
            );
            clock.advance(Duration::from_nanos(1));
            prop_assert_eq!(subject.try_acquire(probe_cost), Ok(()));
        }
    }

    #[test]
    fn strict_reservations_match_the_model(
        qps in prop::sample::select(vec![1.0f64, 10.0, 250.0, 1e6]),
        steps in prop::collection::vec((0u64..3_000_000_000, 1u64..4, any::<bool>()), 1..100),
    ) {
        let clock = ManualClock::new(0);
        let strict = Strict::with_clock(StrictConfig { qps }, clock.clone()).unwrap();
        let interval = (1e9 / qps).ceil() as u64;
        let mut next = 0u64;
        for (dt, cost, reserve) in steps {
            clock.advance(Duration::from_nanos(dt % (4 * interval)));
            let now = clock.now();
            if reserve {
                let slot = next.max(now);
                next = slot + cost * interval;
                prop_assert_eq!(strict.reserve(cost), slot);
            } else if next <= now {
                next = now + cost * interval;
                prop_assert_eq!(strict.try_acquire(cost), Ok(()));
            } else {
                prop_assert_eq!(
                    strict.try_acquire(cost),
                    Err(Refused::RetryAfter { retry_after: Duration::from_nanos(next - now) })
                );
            }
        }
    }

    #[test]
    fn concurrency_never_exceeds_its_limit(
        ops in prop::collection::vec((0u8..3, 1u64..4, 0u64..8), 1..200),
    ) {
        let limiter = Concurrency::new(ConcurrencyConfig { limit: 4 });
        let mut held = Vec::new();
        let mut model_in_flight = 0u64;
        let mut limit = 4u64;
        for (op, cost, arg) in ops {
            match op {
                0 => {
                    let fits = model_in_flight + cost <= limit;
                    match limiter.try_acquire(cost) {
                        Ok(permit) => {
                            prop_assert!(fits);
                            model_in_flight += cost;
                            held.push(permit);
                        }
                        Err(refused) => {
                            prop_assert!(!fits);
                            prop_assert_eq!(refused, Refused::NoPermit);
                        }
                    }
                }
                1 if !held.is_empty() => {
                    let permit = held.swap_remove(arg as usize % held.len());
                    model_in_flight -= permit.cost();
                }
                _ => {
                    limit = arg;
                    limiter.reconfigure(ConcurrencyConfig { limit });
                }
            }
            prop_assert_eq!(limiter.in_flight(), model_in_flight);
        }
        drop(held);
        prop_assert_eq!(limiter.in_flight(), 0);
    }

    #[test]
    fn eviction_never_drops_a_busy_bucket(
        ops in prop::collection::vec((0usize..6, 0u64..40, 1u64..4, any::<bool>()), 1..300),
    ) {
        const INTERVAL: u64 = 10_000_000; // 100 tokens/s
        let clock = ManualClock::new(0);
        let limiter = KeyedLimiter::new(
            Shape::Gcra { interval: INTERVAL, capacity: 3, initial: 3, fair: false },
            3,
            Overflow::Reject,
            clock.clone(),
        );
        // Buckets that are never evicted: the truth.
        let mut models: HashMap<usize, ReferenceBucket> = HashMap::new();
        for (key, advance_ms, cost, sweep) in ops {
            clock.advance(Duration::from_millis(advance_ms));
            let now = clock.now();
            if sweep {
                limiter.sweep();
            }
            let name = format!("key-{key}");
            match limiter.try_acquire(&name, cost) {
                Err(KeyedRefusal::KeysExhausted) => {
                    // No decision was made for this key: the map was full of busy keys.
                    prop_assert_eq!(limiter.counters().keys, 3);
                }
                decided => {
                    let model = models
                        .entry(key)
                        .or_insert_with(|| ReferenceBucket::new(INTERVAL, 3, 3, now));
                    let expected = model.try_acquire(cost, now);
                    prop_assert_eq!(decided.map(|_| ()), expected.map_err(KeyedRefusal::Limited));
                }
            }
            prop_assert!(limiter.counters().keys <= 3);
        }
    }

    #[test]
    fn reshapes_keep_a_token_buckets_fill(
        first in (1u64..=1_000_000, 1u64..=1_000),
        ops in prop::collection::vec(
            (0u64..3_000_000_000, 0u64..50, 1u64..=1_000_000, 1u64..=1_000),
            1..60,
        ),
    ) {
        let clock = ManualClock::new(1_000);
        let bucket = TokenBucket::with_clock(
            TokenBucketConfig { rate: first.0 as f64, burst: first.1 },
            clock.clone(),
        )
        .unwrap();
        for (advance_ns, cost, rate, burst) in ops {
            clock.advance(Duration::from_nanos(advance_ns));
            let _ = bucket.try_acquire(cost);
            let before = bucket.available();
            bucket.reconfigure(TokenBucketConfig { rate: rate as f64, burst }).unwrap();
            prop_assert_eq!(bucket.available(), before.min(burst), "rate {} burst {}", rate, burst);
        }
    }

    #[test]
    fn reshapes_keep_every_keys_fill(
        shapes in prop::collection::vec((1u64..=1_000_000_000, 1u64..=200), 1..20),
        takes in prop::collection::vec((0usize..3, 0u64..50), 0..20),
    ) {
        let clock = ManualClock::new(0);
        let shape = |(interval, capacity): (u64, u64)| Shape::Gcra {
            interval,
            capacity,
            initial: capacity,
            fair: false,
        };
        let limiter = KeyedLimiter::new(shape(shapes[0]), 10, Overflow::Reject, clock.clone());
        // The clock stands still, so each key's fill changes only by what is taken.
        let mut fills = [shapes[0].1; 3];
        // Every key exists before the first reshape (a key made later starts full).
        for (key, fill) in fills.iter_mut().enumerate() {
            let name = format!("key-{key}");
            prop_assert!(limiter.try_acquire(&name, 1).is_ok());
            *fill -= 1;
        }
        for (key, cost) in takes {
            if limiter.try_acquire(&format!("key-{key}"), cost).is_ok() {
                fills[key] -= cost;
            }
        }
        for &next in &shapes[1..] {
            limiter.reshape(shape(next));
            for fill in &mut fills {
                *fill = (*fill).min(next.1);
            }
        }
        // Drain each key one token at a time: exactly its fill, no more, no fewer.
        for (key, fill) in fills.iter().enumerate() {
            let name = format!("key-{key}");
            let mut drained = 0;
            while limiter.try_acquire(&name, 1).is_ok() {
                drained += 1;
                prop_assert!(drained <= 1_000, "never empty");
            }
            prop_assert_eq!(drained, *fill, "key {}", key);
        }
    }
}
