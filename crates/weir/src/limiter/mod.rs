//! The four limiters: one decision each, for one bucket.
//!
//! | limiter | answers | shape |
//! |---|---|---|
//! | [`TokenBucket`] | may `cost` tokens go now? | continuous refill at `rate`, bursts up to `burst` |
//! | [`LeakyBucket`] | may `cost` tokens go now, and who is next? | `refill_amount` every `refill_interval` up to `max`, optionally fair |
//! | [`Strict`] | *when* may this request run? | exactly `1/qps` apart, no burst |
//! | [`Concurrency`] | may one more run at the same time? | in-flight permits, released on drop |
//!
//! Window limiters ([`window`]: at most `limit` hits per calendar window, counted one way or
//! another, the fixed window among them) exist only per key, for parity with servers that count
//! hits per window.
//!
//! Every limiter has a non-blocking `try_acquire`, which either admits or says why not (and,
//! where it can be known, exactly how long until it could admit), and with the `tokio` feature
//! an async `acquire` that waits. Each can be reconfigured while in use without losing its state
//! or its waiters. None reads the time itself: the rate limiters take a [`Clock`](crate::Clock).

pub mod concurrency;
#[cfg(feature = "tokio")]
pub(crate) mod fair_line;
// Without tokio nothing waits: the same names, for lines that are always empty.
#[cfg(not(feature = "tokio"))]
pub(crate) use no_line as fair_line;
pub mod fixed_window;
pub(crate) mod gcra;
pub mod leaky_bucket;
#[cfg(not(feature = "tokio"))]
pub(crate) mod no_line;
pub mod sliding_window;
pub mod strict;
pub mod token_bucket;
#[cfg(feature = "tokio")]
pub(crate) mod waiting;
pub mod window;
mod word;

pub use concurrency::{Concurrency, ConcurrencyConfig, OwnedPermit, Permit};
pub use gcra::MAX_REFILL_NANOS;
pub use leaky_bucket::{LeakyBucket, LeakyBucketConfig};
pub use strict::{Strict, StrictConfig};
pub use token_bucket::{TokenBucket, TokenBucketConfig};
pub use window::{Count, Quota, WindowConfig};

use std::time::Duration;

/// What a waiting `acquire` reports once the request is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admitted {
    waited: Duration,
}

impl Admitted {
    /// Admitted without waiting.
    pub const AT_ONCE: Admitted = Admitted {
        waited: Duration::ZERO,
    };

    /// Admitted after waiting `waited`.
    pub fn after(waited: Duration) -> Self {
        Admitted { waited }
    }

    /// How long the request waited for its turn.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the limiter actually held the request back (it had to wait).
    pub fn throttled(&self) -> bool {
        !self.waited.is_zero()
    }
}
