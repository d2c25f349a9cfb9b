//! What a policy counts, and the periodic "policy P was throttled" report.
//!
//! Counters are plain atomics beside the policy (never one series per key), read as a
//! [`StatsSnapshot`]. The core depends on no metrics library: the server turns snapshots into
//! Prometheus text. Waits are recorded in a fixed-bucket histogram whose bounds match
//! Prometheus's default latency buckets.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::keyed::StoreCounters;

/// Upper bounds of the wait histogram's buckets, in seconds (the last bucket is unbounded).
pub const WAIT_BUCKETS: [f64; 11] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Waits in fixed buckets of [`WAIT_BUCKETS`], with their sum.
#[derive(Debug, Default)]
pub struct WaitHistogram {
    sum_ns: AtomicU64,
    counts: [AtomicU64; WAIT_BUCKETS.len() + 1],
}

impl WaitHistogram {
    /// Records one wait.
    pub fn record(&self, waited: Duration) {
        self.sum_ns
            .fetch_add(crate::clock::duration_to_nanos(waited), Ordering::Relaxed);
        let seconds = waited.as_secs_f64();
        let bucket = WAIT_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(WAIT_BUCKETS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The total wait, and the waits per bucket (not cumulative; the last one unbounded).
    pub fn snapshot(&self) -> (Duration, Vec<u64>) {
        (
            Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed)),
            self.counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
        )
    }
}

/// How many places besides its own buckets here a policy's decisions can be told apart by.
/// The caller names them (a node: the bucket's owner deciding for another, a share assigned to
/// it, a store); the counters only keep them apart.
pub const PLACES: usize = 4;

/// The outcomes told apart by place, in the order of [`StatsSnapshot::placed`]'s rows.
pub const PLACED_OUTCOMES: [Outcome; 4] = [
    Outcome::Admitted,
    Outcome::Throttled,
    Outcome::Rejected,
    Outcome::WouldThrottle,
];

/// The column of `outcome` in [`StatsSnapshot::placed`]'s rows.
fn placed_column(outcome: Outcome) -> usize {
    PLACED_OUTCOMES
        .iter()
        .position(|o| *o == outcome)
        .expect("every outcome is placed")
}

/// The live counters of one policy.
#[derive(Debug, Default)]
pub struct PolicyStats {
    started: AtomicU64,
    /// Admitted requests that have finished (in flight = admitted − released).
    released: AtomicU64,
    admitted: AtomicU64,
    throttled: AtomicU64,
    rejected: AtomicU64,
    would_throttle: AtomicU64,
    unkeyed: AtomicU64,
    waits: WaitHistogram,
    waiters: AtomicI64,
    /// Of the decisions counted above, those made at each place (by place, then outcome in
    /// [`PLACED_OUTCOMES`] order); the rest were made by the policy's own buckets.
    placed: [[AtomicU64; 4]; PLACES],
}

/// How a decision ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted without waiting.
    Admitted,
    /// Admitted after waiting.
    Throttled,
    /// Refused.
    Rejected,
    /// Refused by the limiter but admitted because the policy only monitors.
    WouldThrottle,
}

impl PolicyStats {
    /// A request the policy applies to has arrived.
    #[inline]
    pub fn start(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    /// A request had no bucket key (its principal has no value for the dimension) and went
    /// through unthrottled.
    pub fn unkeyed(&self) {
        self.unkeyed.fetch_add(1, Ordering::Relaxed);
    }

    /// A decision was made. Refusals finish the request at once; admissions finish when
    /// [`finish`](Self::finish) is called.
    #[inline]
    pub fn decided(&self, outcome: Outcome, waited: Duration) {
        match outcome {
            Outcome::Admitted => {}
            Outcome::Throttled => {
                self.throttled.fetch_add(1, Ordering::Relaxed);
                self.record_wait(waited);
            }
            Outcome::WouldThrottle => {
                self.would_throttle.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Rejected => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                if !waited.is_zero() {
                    self.record_wait(waited);
                }
                return;
            }
        }
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Decisions made at `place` counted in bulk, as a data plane reports them: `admitted`
    /// requests admitted at once (and done), `refused` refused.
    pub fn decided_many(&self, admitted: u64, refused: u64, place: usize) {
        // Reported by a client: a sum past the counter's range is held at it, never a panic.
        self.started
            .fetch_add(admitted.saturating_add(refused), Ordering::Relaxed);
        self.admitted.fetch_add(admitted, Ordering::Relaxed);
        self.released.fetch_add(admitted, Ordering::Relaxed);
        self.rejected.fetch_add(refused, Ordering::Relaxed);
        if let Some(row) = self.placed.get(place) {
            row[placed_column(Outcome::Admitted)].fetch_add(admitted, Ordering::Relaxed);
            row[placed_column(Outcome::Rejected)].fetch_add(refused, Ordering::Relaxed);
        }
    }

    /// One decision already counted was made at `place` (< [`PLACES`]; others are ignored).
    pub fn placed(&self, place: usize, outcome: Outcome) {
        if let Some(row) = self.placed.get(place) {
            row[placed_column(outcome)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An admitted request has finished.
    #[inline]
    pub fn finish(&self) {
        self.released.fetch_add(1, Ordering::Relaxed);
    }

    /// A request started or stopped waiting.
    pub fn waiting(&self, delta: i64) {
        self.waiters.fetch_add(delta, Ordering::Relaxed);
    }

    fn record_wait(&self, waited: Duration) {
        self.waits.record(waited);
    }

    /// The counters now, with the key counts of the policy's buckets.
    pub fn snapshot(&self, keys: StoreCounters) -> StatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // Read `released` before `admitted`, so in flight never comes out negative.
        let released = load(&self.released);
        let admitted = load(&self.admitted);
        let rejected = load(&self.rejected);
        let (wait_sum, wait_counts) = self.waits.snapshot();
        StatsSnapshot {
            started: load(&self.started),
            finished: released + rejected,
            admitted,
            throttled: load(&self.throttled),
            rejected,
            would_throttle: load(&self.would_throttle),
            unkeyed: load(&self.unkeyed),
            wait_sum,
            wait_counts,
            in_flight: admitted.saturating_sub(released),
            waiters: self.waiters.load(Ordering::Relaxed).max(0) as u64,
            keys: keys.keys,
            evictions: keys.evictions,
            overflow_hits: keys.overflow_hits,
            sketched: keys.sketched,
            sketch_bytes: keys.sketch_bytes,
            placed: self.placed.each_ref().map(|row| row.each_ref().map(load)),
        }
    }
}

/// One policy's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Requests the policy applied to (accounted, started).
    pub started: u64,
    /// Requests that are done: refused, or admitted and finished.
    pub finished: u64,
    /// Requests admitted (with or without waiting, and in monitor mode).
    pub admitted: u64,
    /// Requests admitted after waiting.
    pub throttled: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Requests the limiter refused but monitor mode admitted.
    pub would_throttle: u64,
    /// Requests without a bucket key, admitted unthrottled.
    pub unkeyed: u64,
    /// Total time requests waited.
    pub wait_sum: Duration,
    /// Waits per bucket of [`WAIT_BUCKETS`] (not cumulative), the last one unbounded.
    pub wait_counts: Vec<u64>,
    /// Admitted requests not finished yet.
    pub in_flight: u64,
    /// Requests waiting now.
    pub waiters: u64,
    /// Keys tracked now.
    pub keys: u64,
    /// Idle keys dropped so far.
    pub evictions: u64,
    /// New keys that found the key map full.
    pub overflow_hits: u64,
    /// Of those, the decisions made in the sketch.
    pub sketched: u64,
    /// Memory the sketches take, in bytes.
    pub sketch_bytes: u64,
    /// Of the decisions counted, those made at each place the caller names (by place, then
    /// outcome in [`PLACED_OUTCOMES`] order); the rest were made by the policy's own buckets.
    pub placed: [[u64; 4]; PLACES],
}

/// "Policy P was throttled in the last N s": what changed over one reporting period.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleReport {
    /// The policy.
    pub policy: String,
    /// The period covered.
    pub period: Duration,
    /// Requests the policy applied to in the period.
    pub accounted: u64,
    /// Requests that had to wait.
    pub throttled: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Requests monitor mode would have throttled.
    pub would_throttle: u64,
    /// Total wait in the period.
    pub wait_sum: Duration,
    /// What each bucket allows; `None` where limits adapt per key.
    pub allowed: Option<Allowance>,
}

/// What one bucket of a policy allows, as a report says it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allowance {
    /// A rate: requests a second.
    PerSecond(f64),
    /// A concurrency limit: requests in flight at once.
    InFlight(u64),
}

impl fmt::Display for Allowance {
    /// A rate as a person writes it: a second, with four significant digits, and below one a
    /// second also in the first of a minute, an hour or a day it is a whole number in (else
    /// the first it is at least one in): `0.01157/s (1000/day)`, `0.5/s (30/min)`, `250/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_second = match *self {
            Allowance::InFlight(limit) => return write!(f, "{limit} in flight"),
            Allowance::PerSecond(rate) => rate,
        };
        write!(f, "{}/s", significant(per_second))?;
        if per_second >= 1.0 || per_second <= 0.0 || !per_second.is_finite() {
            return Ok(());
        }
        let units = [(60.0, "min"), (3600.0, "h"), (86_400.0, "day")];
        let whole = |count: f64| (count - count.round()).abs() <= 1e-6 * count && count >= 1.0;
        let (seconds, unit) = units
            .iter()
            .find(|(seconds, _)| whole(per_second * seconds))
            .or_else(|| {
                units
                    .iter()
                    .find(|(seconds, _)| per_second * seconds >= 1.0)
            })
            .unwrap_or(&units[2]);
        write!(f, " ({}/{unit})", significant(per_second * seconds))
    }
}

/// `x` with four significant digits, without trailing zeros (`1000`, `41.67`, `0.01157`).
fn significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.decimals$}");
    match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_owned(),
        false => text,
    }
}

impl ThrottleReport {
    /// The report for the change from `before` to `after`, or `None` if nothing was throttled,
    /// refused or would have been.
    pub fn between(
        policy: &str,
        period: Duration,
        before: &StatsSnapshot,
        after: &StatsSnapshot,
        allowed: Option<Allowance>,
    ) -> Option<Self> {
        let report = ThrottleReport {
            policy: policy.to_owned(),
            period,
            accounted: after.started.saturating_sub(before.started),
            throttled: after.throttled.saturating_sub(before.throttled),
            rejected: after.rejected.saturating_sub(before.rejected),
            would_throttle: after.would_throttle.saturating_sub(before.would_throttle),
            wait_sum: after.wait_sum.saturating_sub(before.wait_sum),
            allowed,
        };
        (report.throttled + report.rejected + report.would_throttle > 0).then_some(report)
    }
}

impl fmt::Display for ThrottleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy `{}` was throttled in the last {:.0?}: {} of {} requests waited ({:.3?} in total), {} refused, {} would have been throttled; ",
            self.policy,
            self.period,
            self.throttled,
            self.accounted,
            self.wait_sum,
            self.rejected,
            self.would_throttle,
        )?;
        match self.allowed {
            Some(allowed) => write!(f, "each bucket allows {allowed}"),
            None => write!(f, "limits adapt to busy signals"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_bucket_allows_is_written_as_a_person_writes_it() {
        let said = |allowance: Allowance| allowance.to_string();
        assert_eq!(said(Allowance::PerSecond(250.0)), "250/s");
        assert_eq!(said(Allowance::PerSecond(12.5)), "12.5/s");
        assert_eq!(said(Allowance::PerSecond(0.5)), "0.5/s (30/min)");
        // A day's quota of 1000, as a rate kept in floating point.
        assert_eq!(
            said(Allowance::PerSecond(0.011574073999994642)),
            "0.01157/s (1000/day)"
        );
        assert_eq!(
            said(Allowance::PerSecond(1.0 / 7.0 / 60.0)),
            "0.002381/s (8.571/h)"
        );
        assert_eq!(said(Allowance::PerSecond(0.0)), "0/s");
        assert_eq!(said(Allowance::InFlight(4)), "4 in flight");
    }

    #[test]
    fn outcomes_land_in_the_right_counters() {
        let stats = PolicyStats::default();
        for _ in 0..4 {
            stats.start();
        }
        stats.decided(Outcome::Admitted, Duration::ZERO);
        stats.decided(Outcome::Throttled, Duration::from_millis(7));
        stats.decided(Outcome::WouldThrottle, Duration::ZERO);
        stats.decided(Outcome::Rejected, Duration::ZERO);
        stats.finish();
        let s = stats.snapshot(StoreCounters::default());
        assert_eq!(
            (
                s.started,
                s.admitted,
                s.throttled,
                s.would_throttle,
                s.rejected
            ),
            (4, 3, 1, 1, 1)
        );
        assert_eq!((s.in_flight, s.finished), (2, 2));
        assert_eq!(s.wait_sum, Duration::from_millis(7));
        // 7 ms falls in the (5 ms, 10 ms] bucket.
        assert_eq!(s.wait_counts[2], 1);
        assert_eq!(s.wait_counts.iter().sum::<u64>(), 1);
    }

    #[test]
    fn a_report_is_only_made_when_something_was_throttled() {
        let quiet = StatsSnapshot {
            started: 10,
            admitted: 10,
            ..Default::default()
        };
        let later = StatsSnapshot {
            started: 30,
            admitted: 30,
            ..Default::default()
        };
        assert_eq!(
            ThrottleReport::between(
                "p",
                Duration::from_secs(10),
                &quiet,
                &later,
                Some(Allowance::PerSecond(5.0))
            ),
            None
        );
        let throttled = StatsSnapshot {
            started: 40,
            throttled: 5,
            wait_sum: Duration::from_millis(250),
            ..later.clone()
        };
        let report = ThrottleReport::between(
            "p",
            Duration::from_secs(10),
            &later,
            &throttled,
            Some(Allowance::PerSecond(5.0)),
        )
        .unwrap();
        assert_eq!((report.accounted, report.throttled), (10, 5));
        assert!(
            report
                .to_string()
                .starts_with("policy `p` was throttled in the last 10s: 5 of 10")
        );
    }
}
