//! Live progress while a run goes: a line a second of rate, MISSED, outcomes and p99 — redrawn
//! in place (indicatif) on a terminal, printed as plain lines otherwise — and the same seconds
//! kept as a timeline for `--plot`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;

use super::report::{Counts, Point, new_latency_histogram};

/// Counts every client adds to as it goes (warm-up included: this is progress, not the report),
/// and the latencies of the current second.
#[derive(Debug)]
pub struct Live {
    sent: AtomicU64,
    missed: AtomicU64,
    admitted: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    /// Latencies (µs) since the last sample.
    second: Mutex<Histogram<u64>>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            sent: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            second: Mutex::new(new_latency_histogram()),
        }
    }
}

/// What a client has gathered since it last reported to [`Live`].
#[derive(Debug, Default)]
pub struct Batch {
    /// Its counts.
    pub counts: Counts,
    /// Its latencies, in microseconds.
    pub latencies: Vec<u64>,
}

impl Batch {
    /// Counts one answer `latency_us` after it was due.
    pub fn record(&mut self, outcome: super::report::RequestOutcome, latency_us: u64) {
        self.counts.record(outcome);
        self.latencies.push(latency_us);
    }
}

impl Live {
    /// Adds a client's batch (clients gather a batch first: shared counters bumped on every
    /// in-process decision would cost the closed loop about a tenth of its rate).
    pub fn add(&self, batch: &mut Batch) {
        self.add_counts(&batch.counts);
        if !batch.latencies.is_empty() {
            let mut second = self.second.lock().unwrap_or_else(|e| e.into_inner());
            for &us in &batch.latencies {
                second.saturating_record(us.max(1));
            }
        }
        batch.counts = Counts::default();
        batch.latencies.clear();
    }

    fn add_counts(&self, counts: &Counts) {
        for (counter, n) in [
            (&self.sent, counts.sent),
            (&self.missed, counts.missed),
            (&self.admitted, counts.admitted),
            (&self.refused, counts.refused),
            (&self.errors, counts.errors),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Ends a second: the rates since `before` over `interval`, and the percentiles of the
    /// latencies added since the last sample (which starts the next second's).
    pub fn sample(&self, at: Duration, interval: Duration, before: Counts) -> (Point, Counts) {
        let now = self.counts();
        let histogram = {
            let mut second = self.second.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *second, new_latency_histogram())
        };
        let per_second = |n: u64, m: u64| (n - m) as f64 / interval.as_secs_f64();
        let ms = |q: f64| match histogram.is_empty() {
            true => 0.0,
            false => histogram.value_at_quantile(q) as f64 / 1000.0,
        };
        let point = Point {
            at: at.as_secs_f64(),
            rps: per_second(now.sent, before.sent),
            admitted: per_second(now.admitted, before.admitted),
            refused: per_second(now.refused, before.refused),
            missed: per_second(now.missed, before.missed),
            p50: ms(0.5),
            p99: ms(0.99),
        };
        (point, now)
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        Counts {
            sent: self.sent.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// One progress line: this second's rates and p99, and the totals so far.
pub fn line(point: &Point, now: Counts) -> String {
    format!(
        "{:>4.0}s  {:>9.0} rps  p99 {:.3} ms  MISSED {}  admitted {}  refused {}  errors {}",
        point.at, point.rps, point.p99, now.missed, now.admitted, now.refused, now.errors
    )
}

/// Samples `live` every second from an OS thread of its own (an in-process closed loop keeps
/// every runtime worker busy and would starve a task), keeping the timeline and, when `show`,
/// printing a line on standard error, until [`Sampler::finish`].
pub fn sample(live: Arc<Live>, show: bool) -> Sampler {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let bar = (show && std::io::stderr().is_terminal()).then(ProgressBar::new_spinner);
            let started = Instant::now();
            let mut before = Counts::default();
            let mut timeline = Vec::new();
            let mut next = started + EVERY;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(50)));
                    continue;
                }
                next += EVERY;
                let (point, counts) = live.sample(started.elapsed(), EVERY, before);
                if show {
                    let text = line(&point, counts);
                    match &bar {
                        Some(bar) => bar.set_message(text),
                        None => eprintln!("{text}"),
                    }
                }
                timeline.push(point);
                before = counts;
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            timeline
        })
    };
    Sampler {
        stop,
        thread: Some(thread),
    }
}

/// How often a sample is taken.
const EVERY: Duration = Duration::from_secs(1);

/// The sampling thread; stopped (and its line cleared from a terminal) by [`finish`](Self::finish)
/// or when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Point>>>,
}

impl Sampler {
    /// Stops sampling and returns the timeline, a point a second.
    pub fn finish(mut self) -> Vec<Point> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Vec<Point> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RequestOutcome;

    #[test]
    fn a_sample_has_the_seconds_rates_and_percentiles_and_starts_the_next() {
        let live = Live::default();
        let before = live.counts();
        let mut batch = Batch::default();
        for us in 1..=100 {
            batch.record(RequestOutcome::Admitted, us * 1000);
        }
        batch.record(RequestOutcome::Refused, 1000);
        live.add(&mut batch);
        assert_eq!(batch.counts, Counts::default());
        assert!(batch.latencies.is_empty());
        let mut batch = Batch::default();
        batch.record(
            RequestOutcome::of(&Err("refused connection".to_owned())),
            1000,
        );
        batch.counts.missed = 2;
        live.add(&mut batch);
        let (point, now) = live.sample(Duration::from_secs(4), Duration::from_millis(500), before);
        assert_eq!(
            now,
            Counts {
                sent: 102,
                missed: 2,
                admitted: 100,
                refused: 1,
                errors: 1
            }
        );
        assert_eq!(
            (point.rps, point.admitted, point.refused, point.missed),
            (204.0, 200.0, 2.0, 4.0)
        );
        assert!((point.p99 - 99.0).abs() < 0.1, "{}", point.p99);
        assert_eq!(
            line(&point, now),
            "   4s        204 rps  p99 99.007 ms  MISSED 2  admitted 100  refused 1  errors 1"
        );
        // The next second starts empty.
        let (point, _) = live.sample(Duration::from_secs(5), Duration::from_secs(1), now);
        assert_eq!((point.rps, point.p50, point.p99), (0.0, 0.0, 0.0));
    }
}
