//! A clock read from memory: one load instead of a time-stamp-counter read.
//!
//! Reading [`SystemClock`] is most of what a single decision costs (`docs/benchmarks.md`).
//! [`CoarseClock`] trades precision for that: a background
//! thread stores the system time every `interval`, and a reading is one relaxed load of that
//! value — governor's "upkeep clock" idea, with Weir's own thread so that it never competes with
//! another user of quanta's process-wide upkeep.
//!
//! The value lives in one process-wide static rather than behind the clock's own pointer: the
//! decision then reads the time at a fixed address, one dependent load less on its critical path
//! (measured; `docs/benchmarks.md`). Every clock's thread raises the
//! same value, so with several clocks alive the reading is as fresh as the finest of them.
//!
//! # What the coarseness costs
//!
//! A reading lags real time by at most `interval` plus however long the operating system delays
//! the upkeep thread. A lagging clock never lets a limiter admit more than its rate over the
//! long run: the clock still advances exactly as far as real time does. Over any *window*,
//! though, the clock may have moved up to one lag further than real time did (it lagged at the
//! window's start and caught up by its end), so a limiter may admit up to `rate × lag` tokens
//! more in that window than a precise clock would allow, and a `retry_after` may be up to one
//! lag too short or too long. With the default 1 ms interval and a 10 000/s limit that is ten
//! tokens in a window, on top of the burst.
//!
//! Choose it where decisions are so frequent that the clock read matters (millions a second on
//! one limiter) and a millisecond of slack is acceptable; keep [`SystemClock`] otherwise.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use super::{Clock, Nanos, SystemClock};

/// Real monotonic time, refreshed every `interval` by a background thread and read with one
/// memory load. See the [module documentation](self) for what its coarseness costs.
///
/// Clones share the reading and the thread; the thread stops when the last clone is dropped.
/// Readings share [`SystemClock`]'s origin, so the two can be mixed in one program.
#[derive(Debug, Clone)]
pub struct CoarseClock {
    upkeep: Arc<Upkeep>,
}

/// The most recent system time any upkeep thread stored; 0 before the first clock is made.
static RECENT: AtomicU64 = AtomicU64::new(0);

/// Stops the upkeep thread when the last [`CoarseClock`] clone goes.
#[derive(Debug)]
struct Upkeep {
    interval: Duration,
    stop: Arc<AtomicBool>,
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl CoarseClock {
    /// The interval [`CoarseClock::new`] is usually given: a millisecond.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);

    /// A clock refreshed every `interval` by a new thread named `weir-coarse-clock`.
    ///
    /// # Errors
    /// The operating system's error if the thread cannot be started.
    pub fn new(interval: Duration) -> io::Result<Self> {
        let system = SystemClock::new();
        // `fetch_max`: readings must never go back, whatever the OS does to a thread between
        // reading the time and storing it, and whichever of several threads stores last.
        RECENT.fetch_max(system.now(), Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("weir-coarse-clock".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        thread::sleep(interval);
                        RECENT.fetch_max(system.now(), Ordering::Relaxed);
                    }
                })?;
        }
        Ok(CoarseClock {
            upkeep: Arc::new(Upkeep { interval, stop }),
        })
    }

    /// How often the reading is refreshed.
    pub fn interval(&self) -> Duration {
        self.upkeep.interval
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        RECENT.load(Ordering::Relaxed)
    }

    fn unix_offset(&self) -> Nanos {
        SystemClock::new().unix_offset()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_never_go_back_and_never_run_ahead_of_the_system_clock() {
        let system = SystemClock::new();
        let coarse = CoarseClock::new(Duration::from_micros(50)).unwrap();
        let mut last = coarse.now();
        for _ in 0..10_000 {
            let reading = coarse.now();
            assert!(reading >= last, "went back from {last} to {reading}");
            assert!(reading <= system.now(), "ran ahead of the system clock");
            last = reading;
        }
    }

    #[test]
    fn the_thread_stops_with_the_last_clone() {
        let coarse = CoarseClock::new(Duration::from_micros(50)).unwrap();
        let stop = Arc::clone(&coarse.upkeep.stop);
        let clone = coarse.clone();
        drop(coarse);
        assert!(!stop.load(Ordering::Acquire));
        drop(clone);
        assert!(stop.load(Ordering::Acquire));
    }
}
