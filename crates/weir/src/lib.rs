//! # Weir
//!
//! Throttling and admission control for shared backends: the decisions, without the I/O.
//!
//! A shared backend — a metadata service, a page server, a search cluster — is hurt when one
//! tenant, table or user floods it. This crate holds the pieces that decide whether a request
//! may go ahead, each small, exact and testable on its own:
//!
//! - [`limiter`]: the four limiters — [`TokenBucket`], [`LeakyBucket`] (optionally fair),
//!   [`Strict`] and [`Concurrency`];
//! - [`clock`]: where they read the time from ([`SystemClock`], [`ManualClock`] for tests,
//!   [`TokioClock`] for paused-time async tests, [`CoarseClock`] where the clock read is too
//!   dear).
//!
//! Nothing here opens a socket, and the only thread is the one a [`CoarseClock`] starts when
//! asked for. Every rate limiter takes its time from a
//! [`Clock`], so a test can drive it to the nanosecond. With the `tokio` feature (on by default)
//! each limiter also has an async `acquire` that waits its turn.
//!
//! Every limiter is built and changed the same way: `new(config)` (on the system clock) or
//! `with_clock(config, clock)`, and `reconfigure(config)` while in use, keeping its state. The
//! same config types give a [`KeyedLimiter`](keyed::KeyedLimiter) its per-key shape
//! (`Shape::try_from(config)`).
//!
//! ```
//! use weir::{Concurrency, ConcurrencyConfig, TokenBucket, TokenBucketConfig};
//!
//! let per_host = TokenBucket::new(TokenBucketConfig { rate: 100.0, burst: 100 })?;
//! let in_flight = Concurrency::new(ConcurrencyConfig { limit: 10 });
//! if per_host.try_acquire(1).is_ok() {
//!     if let Ok(_permit) = in_flight.try_acquire(1) {
//!         // ... call the backend; the permit is released when dropped ...
//!     }
//! }
//! # Ok::<(), weir::ConfigError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backpressure;
pub mod clock;
pub mod duration;
pub mod error;
pub mod keyed;
#[cfg(feature = "tower")]
pub mod layer;
pub mod lease;
pub mod limiter;
#[cfg(all(test, loom))]
mod loom_models;
#[cfg(feature = "openapi")]
mod openapi;
pub mod policy;
mod sync;

#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, CoarseClock, ManualClock, Nanos, SystemClock};
pub use error::{ConfigError, Refused};
pub use limiter::{
    Admitted, Concurrency, ConcurrencyConfig, LeakyBucket, LeakyBucketConfig, OwnedPermit, Permit,
    Strict, StrictConfig, TokenBucket, TokenBucketConfig, WindowConfig,
};
