//! `TokenBucket { rate, burst }`: continuous refill, bursts up to `burst`.
//!
//! The bucket starts full and refills continuously at `rate` tokens per second; a request of
//! `cost` tokens goes ahead when that many are in the bucket. A host-level RPC limiter (one per
//! RPC type) is a token bucket with `rate = burst = qps`.
//!
//! ```
//! use std::time::Duration;
//! use weir::{ManualClock, Refused, TokenBucket, TokenBucketConfig};
//!
//! let clock = ManualClock::new(0);
//! let bucket = TokenBucket::with_clock(TokenBucketConfig { rate: 50.0, burst: 50 }, clock.clone())?;
//! for _ in 0..50 {
//!     assert!(bucket.try_acquire(1).is_ok());
//! }
//! assert_eq!(
//!     bucket.try_acquire(1),
//!     Err(Refused::RetryAfter { retry_after: Duration::from_millis(20) })
//! );
//! clock.advance(Duration::from_millis(20));
//! assert!(bucket.try_acquire(1).is_ok());
//! # Ok::<(), weir::ConfigError>(())
//! ```

use std::sync::Mutex;

use super::gcra::{Bucket, Params, Tat, check_shape, wide_interval_for_rate};
use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, Refused, check_nonzero, check_rate};

/// The parameters of a [`TokenBucket`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucketConfig {
    /// Tokens added per second. Finite, at most 10⁹, and at least one token per
    /// [`MAX_REFILL_NANOS`](super::MAX_REFILL_NANOS) (about 36.5 years).
    pub rate: f64,
    /// The most tokens the bucket holds, and so the largest burst. At least 1, and refilled
    /// from empty within [`MAX_REFILL_NANOS`](super::MAX_REFILL_NANOS).
    pub burst: u64,
}

impl TokenBucketConfig {
    /// Checks the parameters; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_rate("rate", self.rate)?;
        check_nonzero("burst", self.burst)?;
        check_shape(
            wide_interval_for_rate(self.rate),
            self.burst,
            self.rate,
            "rate",
            "burst",
        )
    }

    pub(crate) fn params(&self) -> Params {
        Params::new(Params::interval_for_rate(self.rate), self.burst)
    }
}

/// A token bucket: continuous refill at `rate`, bursts up to `burst`. Starts full.
///
/// [`try_acquire`](Self::try_acquire) is one compare-and-swap on one atomic. A waiting
/// [`acquire`](Self::acquire) reserves its tokens and sleeps until they are due, so waiters are
/// served in the order they arrived and a request larger than `burst` is admitted eventually.
#[derive(Debug)]
pub struct TokenBucket<C: Clock = SystemClock> {
    bucket: Bucket,
    clock: C,
    config: Mutex<TokenBucketConfig>,
}

impl TokenBucket<SystemClock> {
    /// A full bucket on the system clock.
    pub fn new(config: TokenBucketConfig) -> Result<Self, ConfigError> {
        TokenBucket::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> TokenBucket<C> {
    /// A full bucket reading time from `clock`.
    pub fn with_clock(config: TokenBucketConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        let params = config.params();
        let bucket = Bucket::new(params, params.capacity(), clock.now());
        Ok(TokenBucket {
            bucket,
            clock,
            config: Mutex::new(config),
        })
    }

    /// Takes `cost` tokens if the bucket has them now.
    ///
    /// Refused with [`Refused::RetryAfter`] and the exact time until they will be there, or with
    /// [`Refused::ExceedsCapacity`] if `cost > burst` (only [`acquire`](Self::acquire) can admit
    /// that).
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<(), Refused> {
        self.bucket.try_acquire(cost, self.clock.now())
    }

    /// Waits until `cost` tokens are available and takes them.
    ///
    /// Cancel-safe: dropping the future before it completes gives the reserved tokens back.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, cost: u64) -> super::Admitted {
        super::waiting::reserve_and_wait(&self.bucket, &self.clock, cost).await
    }

    /// Changes rate and burst while in use, keeping the bucket's current fill (capped at the
    /// new burst; tokens already reserved by waiters stay reserved, converted to the new rate).
    /// Waiters already sleeping keep the time they were given. A rejected config leaves the
    /// bucket untouched.
    pub fn reconfigure(&self, config: TokenBucketConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let mut current = self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.bucket.reshape(config.params(), self.clock.now());
        *current = config;
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> TokenBucketConfig {
        *self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whole tokens in the bucket now.
    pub fn available(&self) -> u64 {
        self.bucket.available(self.clock.now())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;

    fn bucket(rate: f64, burst: u64) -> (TokenBucket<ManualClock>, ManualClock) {
        let clock = ManualClock::new(0);
        let bucket = TokenBucket::with_clock(TokenBucketConfig { rate, burst }, clock.clone())
            .expect("valid config");
        (bucket, clock)
    }

    #[test]
    fn oversize_requests_are_refused_without_waiting() {
        let (bucket, _clock) = bucket(10.0, 5);
        assert_eq!(
            bucket.try_acquire(6),
            Err(Refused::ExceedsCapacity {
                cost: 6,
                capacity: 5
            })
        );
        assert_eq!(bucket.available(), 5, "a refusal takes nothing");
    }

    #[test]
    fn invalid_configs_name_the_field_and_change_nothing() {
        let (bucket, _clock) = bucket(10.0, 5);
        for (rate, burst, field) in [
            (0.0, 5, "rate"),
            (-3.0, 5, "rate"),
            (f64::NAN, 5, "rate"),
            (f64::INFINITY, 5, "rate"),
            (10.0, 0, "burst"),
        ] {
            let err = bucket
                .reconfigure(TokenBucketConfig { rate, burst })
                .unwrap_err();
            assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
        }
        assert_eq!(
            bucket.config(),
            TokenBucketConfig {
                rate: 10.0,
                burst: 5
            }
        );
        assert!(
            TokenBucket::new(TokenBucketConfig {
                rate: 1.0,
                burst: 0
            })
            .is_err()
        );
    }

    #[test]
    fn reconfigure_keeps_the_fill_and_hands_out_no_fresh_burst() {
        let (bucket, clock) = bucket(10.0, 10);
        for _ in 0..10 {
            bucket.try_acquire(1).unwrap();
        }
        bucket
            .reconfigure(TokenBucketConfig {
                rate: 100.0,
                burst: 100,
            })
            .unwrap();
        assert_eq!(bucket.available(), 0, "empty stays empty");
        clock.advance(Duration::from_millis(100));
        assert_eq!(bucket.available(), 10, "refills at the new rate");
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn acquire_waits_exactly_and_serves_oversize() {
        use crate::clock::TokioClock;
        let bucket = TokenBucket::with_clock(
            TokenBucketConfig {
                rate: 100.0,
                burst: 100,
            },
            TokioClock::new(),
        )
        .unwrap();
        let start = tokio::time::Instant::now();
        assert!(!bucket.acquire(100).await.throttled());
        let admitted = bucket.acquire(200).await;
        assert_eq!(admitted.waited(), Duration::from_secs(2));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_acquire_gives_its_reservation_back() {
        use crate::clock::TokioClock;
        let bucket = TokenBucket::with_clock(
            TokenBucketConfig {
                rate: 10.0,
                burst: 1,
            },
            TokioClock::new(),
        )
        .unwrap();
        bucket.try_acquire(1).unwrap();
        let timed_out = tokio::time::timeout(Duration::from_millis(50), bucket.acquire(5)).await;
        assert!(timed_out.is_err());
        // Only the first token's refill time has passed: it must be 50 ms from being back, not
        // 550 ms.
        assert_eq!(
            bucket.try_acquire(1),
            Err(Refused::RetryAfter {
                retry_after: Duration::from_millis(50)
            })
        );
    }
}
