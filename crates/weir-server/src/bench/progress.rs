//! Live progress while a run goes: a line a second of rate, MISSED and outcomes — redrawn in
//! place (indicatif) on a terminal, printed as plain lines otherwise.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::report::Counts;

/// Counts every client adds to as it goes (warm-up included: this is progress, not the report).
#[derive(Debug, Default)]
pub struct Live {
    sent: AtomicU64,
    missed: AtomicU64,
    admitted: AtomicU64,
    throttled: AtomicU64,
    errors: AtomicU64,
}

impl Live {
    /// Adds a client's counts (clients gather a batch first: shared counters bumped on
    /// every in-process decision would cost the closed loop about a tenth of its rate).
    pub fn add(&self, counts: &Counts) {
        for (counter, n) in [
            (&self.sent, counts.sent),
            (&self.missed, counts.missed),
            (&self.admitted, counts.admitted),
            (&self.throttled, counts.throttled),
            (&self.errors, counts.errors),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        Counts {
            sent: self.sent.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// One progress line: the rate over the last `interval`, and the totals so far.
pub fn line(elapsed: Duration, interval: Duration, before: Counts, now: Counts) -> String {
    let rps = (now.sent - before.sent) as f64 / interval.as_secs_f64();
    format!(
        "{:>4}s  {:>9.0} rps  MISSED {}  admitted {}  throttled {}  errors {}",
        elapsed.as_secs(),
        rps,
        now.missed,
        now.admitted,
        now.throttled,
        now.errors
    )
}

/// Shows `live` every second on standard error, from an OS thread of its own (an in-process
/// closed loop keeps every runtime worker busy and would starve a task), until the returned
/// guard is dropped.
pub fn show(live: Arc<Live>) -> Shown {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let terminal = std::io::stderr().is_terminal();
            let bar = terminal.then(ProgressBar::new_spinner);
            let started = Instant::now();
            let mut before = Counts::default();
            let mut next = started + EVERY;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(50)));
                    continue;
                }
                next += EVERY;
                let counts = live.counts();
                let text = line(started.elapsed(), EVERY, before, counts);
                match &bar {
                    Some(bar) => bar.set_message(text),
                    None => eprintln!("{text}"),
                }
                before = counts;
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
        })
    };
    Shown {
        stop,
        thread: Some(thread),
    }
}

/// How often the line is refreshed.
const EVERY: Duration = Duration::from_secs(1);

/// Stops the progress line (and clears it from a terminal) when dropped.
pub struct Shown {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Shown {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::Outcome;

    #[test]
    fn a_line_has_the_last_seconds_rate_and_the_totals() {
        let live = Live::default();
        let before = live.counts();
        let mut batch = Counts::default();
        batch.record(Outcome::Admitted);
        batch.record(Outcome::Throttled);
        live.add(&batch);
        let mut batch = Counts::default();
        batch.record(Outcome::of(&Err("refused connection".to_owned())));
        batch.missed = 2;
        live.add(&batch);
        let now = live.counts();
        assert_eq!(
            now,
            Counts {
                sent: 3,
                missed: 2,
                admitted: 1,
                throttled: 1,
                errors: 1
            }
        );
        let text = line(
            Duration::from_secs(4),
            Duration::from_millis(500),
            before,
            now,
        );
        assert_eq!(
            text,
            "   4s          6 rps  MISSED 2  admitted 1  throttled 1  errors 1"
        );
    }
}
