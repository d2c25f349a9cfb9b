//! tokio's clock, for limiters that wait on a paused runtime in tests (feature `tokio`).

use std::sync::OnceLock;
use std::time::Duration;

use super::{Clock, Nanos, duration_to_nanos};

/// tokio's clock: real time normally, and frozen or auto-advancing under a paused runtime.
///
/// Use it when a test (or a program) waits with [`acquire`](crate::TokenBucket::acquire) under
/// `tokio::time::pause()`: the limiter then computes its waits on the same timeline that tokio's
/// sleeps run on. All `TokioClock`s in a process share one origin. A paused runtime has no time
/// of day, so its [`unix_offset`](Clock::unix_offset) stays 0: calendar windows count from that
/// origin.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading tokio's time.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio_origin(),
        }
    }
}

impl TokioClock {
    /// A clock reading tokio's time since `origin` (0 before it): for a simulation on a paused
    /// runtime that needs its readings, and so anything that depends on their phase (a rate
    /// window's slots), to be the same on every run.
    pub fn with_origin(origin: tokio::time::Instant) -> Self {
        TokioClock { origin }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> Nanos {
        duration_to_nanos(tokio::time::Instant::now().saturating_duration_since(self.origin))
    }
}

/// One origin for every `TokioClock`, taken a little in the past.
///
/// Paused time is per runtime, so in a test process that runs several paused runtimes, each
/// starts from whatever `Instant` tokio hands it; backdating the origin keeps every reading
/// positive. Readings are only compared within one runtime.
fn tokio_origin() -> tokio::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| {
        let now = std::time::Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    });
    tokio::time::Instant::from_std(origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let before = clock.now();
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now() - before, 250_000_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_with_an_origin_reads_from_it() {
        let origin = tokio::time::Instant::now();
        let clock = TokioClock::with_origin(origin - Duration::from_millis(40));
        assert_eq!(clock.now(), 40_000_000);
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(clock.now(), 45_000_000);
        assert_eq!(
            TokioClock::with_origin(origin + Duration::from_secs(1)).now(),
            0
        );
    }
}
