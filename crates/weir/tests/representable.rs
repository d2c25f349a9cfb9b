//! Every limiter's numbers over the whole range of `f64` rates and `u64` bursts and costs: a
//! configuration is either refused, exactly when its arithmetic would not fit, or decides
//! exactly like a reference bucket kept in 128-bit integers. Nothing in between: a saturated
//! spacing once made the check always pass, and a tiny rate admitted everything.
//!
//! The reference reads an `f64` as the exact dyadic rational it is, so "would not fit" is
//! decided in exact arithmetic, not by the same float expression the limiter uses.

use std::time::Duration;

use proptest::prelude::*;
use weir::limiter::MAX_REFILL_NANOS;
use weir::{
    ConfigError, LeakyBucket, LeakyBucketConfig, ManualClock, Refused, Strict, StrictConfig,
    TokenBucket, TokenBucketConfig,
};

const MAX: u128 = MAX_REFILL_NANOS as u128;

/// `⌈10⁹ / rate⌉` in exact arithmetic for a positive finite `rate`, or `None` when it is above
/// 2^64 (far beyond anything representable). Found as the least `i` with `i × rate ≥ 10⁹`,
/// starting from the float quotient and stepping by whole nanoseconds.
fn exact_interval(rate: f64) -> Option<u128> {
    let bits = rate.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i32;
    let fraction = u128::from(bits & ((1 << 52) - 1));
    // rate = mantissa × 2^power, exactly.
    let (mantissa, power) = if exponent == 0 {
        (fraction, -1074)
    } else {
        (fraction | 1 << 52, exponent - 1075)
    };
    if power >= 0 {
        return Some(1); // rate ≥ 2^52
    }
    let shift = u32::try_from(-power).unwrap();
    if shift > 120 {
        return None;
    }
    // i × mantissa ≥ 10⁹ × 2^shift ⇔ ⌊i × mantissa / 2^shift⌋ ≥ 10⁹ (the right side is a
    // multiple of 2^shift); i ≤ 2^65 and mantissa < 2^53, so the product fits.
    let covers = |i: u128| (i * mantissa) >> shift >= 1_000_000_000;
    let mut i = ((1e9 / rate).ceil().min(2f64.powi(65))) as u128;
    while i > 1 && covers(i - 1) {
        i -= 1;
    }
    while !covers(i) {
        i += 1;
        if i > 1 << 65 {
            return None;
        }
    }
    (i <= u128::from(u64::MAX)).then_some(i)
}

/// The textbook bucket in 128-bit nanoseconds of refill.
struct Reference {
    interval: u128,
    capacity_ns: u128,
    level_ns: u128,
    last: u128,
}

impl Reference {
    fn new(interval: u128, capacity: u64, initial: u64, now: u64) -> Self {
        Reference {
            interval,
            capacity_ns: interval * u128::from(capacity),
            level_ns: interval * u128::from(initial),
            last: u128::from(now),
        }
    }

    fn try_acquire(&mut self, cost: u64, now: u64) -> Result<(), Refused> {
        let now = u128::from(now);
        self.level_ns = (self.level_ns + (now - self.last)).min(self.capacity_ns);
        self.last = now;
        let need = u128::from(cost) * self.interval;
        if need > self.capacity_ns {
            return Err(Refused::ExceedsCapacity {
                cost,
                capacity: u64::try_from(self.capacity_ns / self.interval).unwrap(),
            });
        }
        if self.level_ns >= need {
            self.level_ns -= need;
            Ok(())
        } else {
            let wait = u64::try_from(need - self.level_ns).unwrap();
            Err(Refused::RetryAfter {
                retry_after: Duration::from_nanos(wait),
            })
        }
    }
}

/// Rates from the whole of `f64`: any bit pattern, and a dense band around the limits.
fn any_rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<u64>().prop_map(f64::from_bits),
        (-40.0f64..12.0).prop_map(|e| 10f64.powf(e)),
        Just(1e-12),
        Just(1e-9),
        Just(1e9),
    ]
}

/// Counts from the whole of `u64`, most of them small.
fn any_count() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..100,
        any::<u64>(),
        (0u32..64).prop_map(|shift| 1u64 << shift),
    ]
}

/// Clock steps: small, and now and then years at a time (bounded so that the clock stays
/// within its first century).
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let advance = prop_oneof![0u64..2_000_000_000, 0u64..(1 << 54)];
    prop::collection::vec((advance, any_count()), 1..40)
}

/// Runs `steps` on a limiter (through `decide`) and the reference side by side.
fn same_decisions(
    clock: &ManualClock,
    mut reference: Reference,
    steps: &[(u64, u64)],
    decide: impl Fn(u64) -> Result<(), Refused>,
) -> Result<(), TestCaseError> {
    for &(advance, cost) in steps {
        clock.advance(Duration::from_nanos(advance));
        let now = weir::Clock::now(clock);
        prop_assert_eq!(
            decide(cost),
            reference.try_acquire(cost, now),
            "at {} ns",
            now
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_token_bucket_is_exact_or_refused(rate in any_rate(), burst in any_count(), steps in steps()) {
        let config = TokenBucketConfig { rate, burst };
        let interval = (rate.is_finite() && rate > 0.0).then(|| exact_interval(rate)).flatten();
        let representable = rate.is_finite()
            && rate > 0.0
            && rate <= 1e9
            && burst > 0
            && interval.is_some_and(|i| i * u128::from(burst) <= MAX);
        let verdict = config.validate();
        prop_assert_eq!(verdict.is_ok(), representable, "rate {:e} burst {}: {:?}", rate, burst, verdict);
        let clock = ManualClock::new(0);
        let built = TokenBucket::with_clock(config, clock.clone());
        prop_assert_eq!(built.is_ok(), representable);
        let Ok(bucket) = built else { return Ok(()) };
        let reference = Reference::new(interval.unwrap(), burst, burst, 0);
        same_decisions(&clock, reference, &steps, |cost| bucket.try_acquire(cost))?;
    }

    #[test]
    fn a_leaky_bucket_is_exact_or_refused(
        interval_ns in prop_oneof![1u64..10_000_000_000, any::<u64>()],
        amount in any_count(),
        max in any_count(),
        initial in any_count(),
        steps in steps(),
    ) {
        let config = LeakyBucketConfig {
            initial: initial.min(max),
            refill_interval: Duration::from_nanos(interval_ns),
            refill_amount: amount,
            max,
            fair: false,
        };
        let per_token = (amount > 0).then(|| u128::from(interval_ns).div_ceil(u128::from(amount)));
        let representable = amount > 0
            && max > 0
            && u128::from(amount) <= u128::from(interval_ns)
            && per_token.is_some_and(|p| p * u128::from(max) <= MAX);
        let verdict = config.validate();
        prop_assert_eq!(verdict.is_ok(), representable, "{:?}: {:?}", config, verdict);
        let clock = ManualClock::new(0);
        let Ok(bucket) = LeakyBucket::with_clock(config, clock.clone()) else {
            prop_assert!(!representable);
            return Ok(());
        };
        let reference = Reference::new(per_token.unwrap(), max, config.initial, 0);
        same_decisions(&clock, reference, &steps, |cost| bucket.try_acquire(cost))?;
    }

    #[test]
    fn a_strict_limiter_is_exact_or_refused(qps in any_rate(), steps in steps()) {
        let config = StrictConfig { qps };
        let interval = (qps.is_finite() && qps > 0.0).then(|| exact_interval(qps)).flatten();
        let representable = qps.is_finite() && qps > 0.0 && qps <= 1e9
            && interval.is_some_and(|i| i <= MAX);
        prop_assert_eq!(config.validate().is_ok(), representable, "qps {:e}", qps);
        let clock = ManualClock::new(0);
        let Ok(strict) = Strict::with_clock(config, clock.clone()) else {
            prop_assert!(!representable);
            return Ok(());
        };
        // One request per interval, never two inside one: the slot after an admission is
        // exactly one interval on.
        let interval = interval.unwrap();
        let mut next = 0u128;
        for &(advance, _) in &steps {
            clock.advance(Duration::from_nanos(advance));
            let now = u128::from(weir::Clock::now(&clock));
            let expected = if now >= next {
                next = now + interval;
                Ok(())
            } else {
                Err(Refused::RetryAfter { retry_after: Duration::from_nanos(u64::try_from(next - now).unwrap()) })
            };
            prop_assert_eq!(strict.try_acquire(1), expected);
        }
    }
}

/// The figures from the report that found the bug, each refused with the field named.
#[test]
fn the_reported_tiny_rates_are_refused_by_name() {
    let tiny = TokenBucketConfig {
        rate: 1e-12,
        burst: 1,
    };
    let err = tiny.validate().unwrap_err();
    assert_eq!(err.field(), "rate");
    assert!(err.to_string().contains("must be at least"), "{err}");
    assert!(err.to_string().ends_with("got 1e-12"), "{err}");

    let long = TokenBucketConfig {
        rate: 1e-9,
        burst: 20,
    };
    let err = long.validate().unwrap_err();
    assert!(
        matches!(err, ConfigError::TooLong { field: "burst", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("years"), "{err}");

    let deep = TokenBucketConfig {
        rate: 0.001,
        burst: 100_000_000,
    };
    assert!(matches!(
        deep.validate(),
        Err(ConfigError::TooLong { field: "burst", .. })
    ));
}
