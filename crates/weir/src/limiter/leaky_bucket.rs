//! `LeakyBucket { initial, refill_interval, refill_amount, max, fair }`: a per-tenant
//! throttle's bucket, optionally fair.
//!
//! The parameters describe a stepped bucket: `refill_amount` tokens added every `refill_interval`,
//! up to `max`, starting with `initial`. Weir runs the same bucket as GCRA with a continuous
//! refill: one token every `refill_interval / refill_amount`, a capacity of `max`. The long-run
//! rate and the largest burst are the same as the stepped bucket's; what differs is that a waiter
//! is let through the moment its tokens have accrued instead of at the next refill step, so waits
//! are shorter and smoother.
//!
//! With `fair = true` (the default) waiters are admitted strictly in arrival order, and a
//! request larger than `max` is admitted eventually: it drains the full bucket and waits for
//! the rest. With `fair = false` a non-blocking [`try_acquire`](LeakyBucket::try_acquire) may
//! overtake queued waiters on a lock-free fast path.
//!
//! ```
//! use std::time::Duration;
//! use weir::{LeakyBucket, LeakyBucketConfig, ManualClock, Refused};
//!
//! let clock = ManualClock::new(0);
//! // 5000 requests per second, bursts of up to 5000: a page server's per-tenant settings.
//! let config = LeakyBucketConfig {
//!     initial: 0,
//!     refill_interval: Duration::from_millis(100),
//!     refill_amount: 500,
//!     max: 5000,
//!     fair: true,
//! };
//! let bucket = LeakyBucket::with_clock(config, clock.clone())?;
//! // `initial = 0`: even the first request waits for one token to accrue.
//! assert_eq!(
//!     bucket.try_acquire(1),
//!     Err(Refused::RetryAfter { retry_after: Duration::from_micros(200) })
//! );
//! # Ok::<(), weir::ConfigError>(())
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::gcra::{Bucket, Params, Tat, check_shape};
use crate::clock::{Clock, SystemClock, duration_to_nanos};
use crate::error::{ConfigError, Refused, check_nonzero};

/// The parameters of a [`LeakyBucket`], named as a page server's tenant config names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucketConfig {
    /// Tokens in the bucket when it is created (at most `max`). Only used at creation: a
    /// reconfiguration keeps the bucket's current fill instead.
    pub initial: u64,
    /// Over this interval, `refill_amount` tokens are added. Greater than zero.
    pub refill_interval: Duration,
    /// Tokens added per `refill_interval`. At least 1.
    pub refill_amount: u64,
    /// The most tokens the bucket holds. At least 1.
    pub max: u64,
    /// Admit waiters strictly in arrival order.
    pub fair: bool,
}

impl LeakyBucketConfig {
    /// Checks the parameters; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.refill_interval.is_zero() {
            return Err(ConfigError::Zero {
                field: "refill_interval",
            });
        }
        check_nonzero("refill_amount", self.refill_amount)?;
        check_nonzero("max", self.max)?;
        if self.initial > self.max {
            return Err(ConfigError::InitialAboveMax {
                initial: self.initial,
                max: self.max,
            });
        }
        let interval_ns = self.refill_interval.as_nanos();
        if u128::from(self.refill_amount) > interval_ns {
            return Err(ConfigError::TooFast {
                field: "refill_amount",
                value: self.rate(),
                max: 1e9,
            });
        }
        let per_token = interval_ns.div_ceil(u128::from(self.refill_amount));
        check_shape(per_token, self.max, self.rate(), "refill_interval", "max")
    }

    /// The long-run rate in tokens per second.
    pub fn rate(&self) -> f64 {
        self.refill_amount as f64 / self.refill_interval.as_secs_f64()
    }

    pub(crate) fn params(&self) -> Params {
        let interval_ns = u128::from(duration_to_nanos(self.refill_interval));
        let amount = u128::from(self.refill_amount.max(1));
        // Rounded up, so rounding only ever makes the bucket stricter.
        let per_token = u64::try_from(interval_ns.div_ceil(amount)).unwrap_or(u64::MAX);
        Params::new(per_token, self.max)
    }
}

/// A per-tenant leaky bucket, optionally fair. See the [module docs](self).
#[derive(Debug)]
pub struct LeakyBucket<C: Clock = SystemClock> {
    bucket: Bucket,
    clock: C,
    fair: AtomicBool,
    config: Mutex<LeakyBucketConfig>,
    line: super::fair_line::FairLine,
}

impl LeakyBucket<SystemClock> {
    /// A bucket holding `config.initial` tokens, on the system clock.
    pub fn new(config: LeakyBucketConfig) -> Result<Self, ConfigError> {
        LeakyBucket::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> LeakyBucket<C> {
    /// A bucket holding `config.initial` tokens, reading time from `clock`.
    pub fn with_clock(config: LeakyBucketConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        let bucket = Bucket::new(config.params(), config.initial, clock.now());
        Ok(LeakyBucket {
            bucket,
            clock,
            fair: AtomicBool::new(config.fair),
            config: Mutex::new(config),
            line: Default::default(),
        })
    }

    /// Takes `cost` tokens if the bucket has them now and, when fair, nobody is waiting.
    ///
    /// Refused with [`Refused::RetryAfter`] and the time until the tokens (and, when fair, the
    /// tokens of everyone queued ahead) will have accrued, or with [`Refused::ExceedsCapacity`]
    /// if `cost > max`.
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<(), Refused> {
        let now = self.clock.now();
        if self.line.len() > 0 && self.fair.load(Ordering::Relaxed) {
            return Err(self
                .bucket
                .refusal_behind(self.line.unclaimed_cost(), cost, now));
        }
        self.bucket.try_acquire(cost, now)
    }

    /// Changes the bucket's shape while in use. The current fill is kept (capped at the new
    /// `max`), waiters keep their places in line, and the head is re-served under the new rate.
    /// `initial` is ignored: it only applies to a new bucket. A rejected config changes nothing.
    pub fn reconfigure(&self, config: LeakyBucketConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let mut current = self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = self.clock.now();
        let reshape = || self.bucket.reshape(config.params(), now);
        self.line
            .with_claim_released(|taken| self.bucket.give_back(taken), reshape);
        self.fair.store(config.fair, Ordering::Relaxed);
        *current = config;
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> LeakyBucketConfig {
        *self
            .config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whole tokens in the bucket now (0 while waiters' claims hold it in debt).
    pub fn available(&self) -> u64 {
        self.bucket.available(self.clock.now())
    }

    /// Requests waiting in line.
    pub fn waiters(&self) -> usize {
        self.line.len()
    }
}

/// Waiting (feature `tokio`).
#[cfg(feature = "tokio")]
impl<C: Clock> LeakyBucket<C> {
    /// Waits until `cost` tokens can be taken, and takes them.
    ///
    /// When fair, waiters are admitted strictly in arrival order. A `cost` above `max` is
    /// admitted once the full bucket plus what accrues covers it. Cancel-safe: a dropped waiter
    /// leaves the line, hands back anything it had claimed and passes its turn on.
    pub async fn acquire(&self, cost: u64) -> super::Admitted {
        if self.fair.load(Ordering::Relaxed) {
            self.acquire_in_line(cost).await
        } else {
            super::waiting::reserve_and_wait(&self.bucket, &self.clock, cost).await
        }
    }

    async fn acquire_in_line(&self, cost: u64) -> super::Admitted {
        let start = self.clock.now();
        if self.line.len() == 0 && self.bucket.try_acquire(cost, start).is_ok() {
            return super::Admitted::AT_ONCE;
        }
        let ticket = self.line.join(cost);
        let (_, waited) = super::fair_line::wait_in_line(
            &self.line,
            ticket,
            &self.clock,
            |cost, now| self.bucket.reserve(cost, now),
            |taken| self.bucket.give_back(taken),
        )
        .await;
        super::Admitted::after(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(initial: u64, max: u64) -> LeakyBucketConfig {
        LeakyBucketConfig {
            initial,
            refill_interval: Duration::from_millis(100),
            refill_amount: 10,
            max,
            fair: true,
        }
    }

    #[test]
    fn invalid_configs_name_the_field() {
        let cases = [
            (
                LeakyBucketConfig {
                    refill_amount: 0,
                    ..config(0, 10)
                },
                "`refill_amount`",
            ),
            (
                LeakyBucketConfig {
                    refill_interval: Duration::ZERO,
                    ..config(0, 10)
                },
                "`refill_interval`",
            ),
            (config(0, 0), "`max`"),
            (config(11, 10), "`initial` (11) must not exceed `max` (10)"),
            (
                LeakyBucketConfig {
                    refill_interval: Duration::from_nanos(5),
                    refill_amount: 6,
                    ..config(0, 10)
                },
                "`refill_amount`",
            ),
        ];
        for (bad, field) in cases {
            let err = bad.validate().unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
            assert!(LeakyBucket::new(bad).is_err());
        }
        assert_eq!(config(10, 10).rate(), 100.0);
    }

    #[test]
    fn a_rejected_reconfiguration_leaves_the_bucket_as_it_was() {
        let bucket = LeakyBucket::with_clock(config(10, 10), crate::ManualClock::new(0)).unwrap();
        bucket.try_acquire(4).unwrap();
        assert!(bucket.reconfigure(config(0, 0)).is_err());
        assert_eq!(bucket.config(), config(10, 10));
        assert_eq!(bucket.available(), 6);
    }
}
