//! The errors and refusals the limiters return.
//!
//! Two different things can go "wrong" when asking a limiter:
//! - [`ConfigError`]: the parameters make no sense (a zero rate, `initial > max`). The error
//!   names the field, so a config file or an API caller can be told exactly what to fix.
//! - [`Refused`]: the parameters are fine but the request cannot be admitted *now*. This is the
//!   limiter doing its job, and it says when asking again would succeed.

use std::time::Duration;

use thiserror::Error;

/// Limiter parameters that were rejected. Every variant names the offending field; the text
/// is "`field` problem", and [`field`](Self::field) and [`problem`](Self::problem) give the two
/// apart, so a caller naming the field by its own path (`token_bucket.rate`) need not parse it.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigError {
    /// A rate was zero, negative, NaN or infinite.
    NotPositive {
        /// The field, e.g. `rate` or `qps`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// A rate was above what a nanosecond clock can space out (one token per nanosecond).
    TooFast {
        /// The field, e.g. `rate`.
        field: &'static str,
        /// The value given.
        value: f64,
        /// The largest value accepted.
        max: f64,
    },
    /// A rate so low that one token's spacing is beyond what Weir represents
    /// ([`MAX_REFILL_NANOS`](crate::limiter::MAX_REFILL_NANOS), about 36.5 years).
    TooSlow {
        /// The field, e.g. `rate`, `qps` or `refill_interval`.
        field: &'static str,
        /// The rate given, per second.
        value: f64,
        /// The smallest rate accepted.
        min: f64,
    },
    /// A bucket that would take longer than [`MAX_REFILL_NANOS`](crate::limiter::MAX_REFILL_NANOS) to refill
    /// from empty: its arithmetic would not fit in nanoseconds.
    TooLong {
        /// The capacity field, e.g. `burst` or `max`.
        field: &'static str,
        /// The capacity given.
        capacity: u64,
        /// The rate, per second.
        rate: f64,
        /// How long refilling it would take, in years.
        years: f64,
        /// The largest capacity accepted at this rate.
        max: u64,
    },
    /// A count or a duration that must be at least one unit was zero.
    Zero {
        /// The field, e.g. `burst`, `refill_amount` or `refill_interval`.
        field: &'static str,
    },
    /// A value outside the range the limiter accepts.
    OutOfRange {
        /// The field, e.g. `limit` or `window`.
        field: &'static str,
        /// What is accepted, e.g. "between 1 and 4294967295".
        allowed: &'static str,
        /// The value given, as the user wrote it.
        got: String,
    },
    /// The leaky bucket would start with more tokens than it can hold.
    InitialAboveMax {
        /// The `initial` given.
        initial: u64,
        /// The `max` given.
        max: u64,
    },
}

impl ConfigError {
    /// The same problem, said of `field`: for a value checked under another name than the one
    /// it was given as (a per-core rate checked as a token bucket's `rate`).
    pub(crate) fn for_field(self, field: &'static str) -> Self {
        match self {
            ConfigError::NotPositive { value, .. } => ConfigError::NotPositive { field, value },
            ConfigError::TooFast { value, max, .. } => ConfigError::TooFast { field, value, max },
            ConfigError::TooSlow { value, min, .. } => ConfigError::TooSlow { field, value, min },
            ConfigError::TooLong {
                capacity,
                rate,
                years,
                max,
                ..
            } => ConfigError::TooLong {
                field,
                capacity,
                rate,
                years,
                max,
            },
            ConfigError::Zero { .. } => ConfigError::Zero { field },
            ConfigError::OutOfRange { allowed, got, .. } => ConfigError::OutOfRange {
                field,
                allowed,
                got,
            },
            other @ ConfigError::InitialAboveMax { .. } => other,
        }
    }

    /// What is wrong with the field, without its name.
    pub fn problem(&self) -> String {
        match self {
            ConfigError::NotPositive { value, .. } => {
                format!("must be a finite number greater than zero, got {value}")
            }
            ConfigError::TooFast { value, max, .. } => {
                format!("must be at most {max} per second, got {value}")
            }
            ConfigError::TooSlow { value, min, .. } => format!(
                "must be at least {min:e} per second (one token every 36.5 years at most), got {value:e}"
            ),
            ConfigError::TooLong {
                field,
                capacity,
                rate,
                years,
                max,
            } => format!(
                "is too large for the rate: refilling {capacity} tokens at {rate:e} per second takes {years:.1} years; at most 36.5 years is represented, so `{field}` can be at most {max} at this rate"
            ),
            ConfigError::Zero { .. } => "must be greater than zero".to_owned(),
            ConfigError::OutOfRange { allowed, got, .. } => format!("must be {allowed}, got {got}"),
            ConfigError::InitialAboveMax { initial, max } => {
                format!("({initial}) must not exceed `max` ({max})")
            }
        }
    }

    /// The name of the field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            ConfigError::NotPositive { field, .. }
            | ConfigError::TooFast { field, .. }
            | ConfigError::TooSlow { field, .. }
            | ConfigError::TooLong { field, .. }
            | ConfigError::Zero { field }
            | ConfigError::OutOfRange { field, .. } => field,
            ConfigError::InitialAboveMax { .. } => "initial",
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {}", self.field(), self.problem())
    }
}

impl std::error::Error for ConfigError {}

/// Why a non-blocking acquire did not admit the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Refused {
    /// Not enough tokens now. Asking again after `retry_after` succeeds if nothing else takes
    /// them first.
    #[error("rate limited; retry after {retry_after:?}")]
    RetryAfter {
        /// The exact time until the request could be admitted.
        retry_after: Duration,
    },
    /// Every concurrency permit is taken (or waiters are queued ahead). Only a release makes
    /// room, so there is no time to give.
    #[error("no permit available")]
    NoPermit,
    /// The request costs more than the bucket can ever hold at once, so a non-blocking acquire
    /// can never admit it. A waiting `acquire` can: it drains the full bucket and waits for the
    /// rest.
    #[error("cost {cost} exceeds the bucket's capacity of {capacity}")]
    ExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The most the bucket can hold.
        capacity: u64,
    },
}

impl Refused {
    /// The time after which asking again could succeed, where the limiter can know it.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Refused::RetryAfter { retry_after } => Some(*retry_after),
            Refused::NoPermit | Refused::ExceedsCapacity { .. } => None,
        }
    }
}

/// Checks that a rate (tokens or requests per second) can be turned into a spacing in
/// nanoseconds.
pub(crate) fn check_rate(field: &'static str, value: f64) -> Result<(), ConfigError> {
    if !value.is_finite() || value <= 0.0 {
        return Err(ConfigError::NotPositive { field, value });
    }
    const MAX: f64 = 1e9;
    if value > MAX {
        return Err(ConfigError::TooFast {
            field,
            value,
            max: MAX,
        });
    }
    Ok(())
}

/// Checks that a count is at least one.
pub(crate) fn check_nonzero(field: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero { field })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_checks_name_the_field() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = check_rate("qps", bad).unwrap_err();
            assert!(err.to_string().starts_with("`qps` must be"), "{err}");
        }
        assert!(matches!(
            check_rate("rate", 2e9),
            Err(ConfigError::TooFast { field: "rate", .. })
        ));
        assert_eq!(check_rate("rate", 1e9), Ok(()));
        assert_eq!(
            check_nonzero("burst", 0),
            Err(ConfigError::Zero { field: "burst" })
        );
    }

    #[test]
    fn refusals_say_when_to_retry() {
        let wait = Refused::RetryAfter {
            retry_after: Duration::from_millis(20),
        };
        assert_eq!(wait.retry_after(), Some(Duration::from_millis(20)));
        assert_eq!(Refused::NoPermit.retry_after(), None);
    }
}
