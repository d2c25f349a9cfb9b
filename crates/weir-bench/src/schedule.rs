//! When each request of an open-loop client is due, and which requests it missed.
//!
//! A schedule is a cumulative count `N(t)`: how many requests are due in the first `t` seconds
//! of the run. Request `k` is due at `N⁻¹(k)` and owns the slot up to the next one's due time;
//! a client still busy when its slot ends has missed it. Pure arithmetic on elapsed time, so
//! it is tested without a clock.

use std::time::Duration;

/// The shape of the offered load over time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// The same rate throughout.
    Steady,
    /// `factor` times the rate for `on` out of every `every` (bursts, as in the latency table's
    /// burst profile).
    Burst {
        /// How many times the base rate the burst offers.
        factor: f64,
        /// How long each burst lasts.
        on: Duration,
        /// The period bursts repeat with (the burst starts each period).
        every: Duration,
    },
}

/// Splits `x` into whole `period`s and the rest, the two taken from one division so they
/// agree (`rem_euclid` and `floor` can round differently and lose or gain a whole period).
fn split(x: f64, period: f64) -> (f64, f64) {
    let cycles = (x / period).floor();
    (cycles, (x - cycles * period).clamp(0.0, period))
}

/// One client's schedule: a base rate (requests per second) shaped by a [`Profile`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    rate: f64,
    profile: Profile,
}

impl Schedule {
    /// A schedule at `rate` requests per second (which must be positive) shaped by `profile`.
    pub fn new(rate: f64, profile: Profile) -> Self {
        Schedule { rate, profile }
    }

    /// How many requests are due in the first `t` seconds (fractional).
    fn due_count(&self, t: f64) -> f64 {
        match self.profile {
            Profile::Steady => self.rate * t,
            Profile::Burst { factor, on, every } => {
                let (on, every) = (on.as_secs_f64(), every.as_secs_f64());
                let per_cycle = self.rate * (factor * on + (every - on));
                let (cycles, u) = split(t, every);
                let within = if u < on {
                    self.rate * factor * u
                } else {
                    self.rate * (factor * on + (u - on))
                };
                cycles * per_cycle + within
            }
        }
    }

    /// When request `k` is due, from the start of the run.
    pub fn due(&self, k: u64) -> Duration {
        let x = k as f64;
        let seconds = match self.profile {
            Profile::Steady => x / self.rate,
            Profile::Burst { factor, on, every } => {
                let (on, every) = (on.as_secs_f64(), every.as_secs_f64());
                let burst = self.rate * factor * on;
                let per_cycle = burst + self.rate * (every - on);
                let (cycles, y) = split(x, per_cycle);
                let within = if y < burst {
                    y / (self.rate * factor)
                } else {
                    on + (y - burst) / self.rate
                };
                cycles * every + within
            }
        };
        Duration::from_secs_f64(seconds)
    }

    /// How many requests are due in a run of `length`.
    pub fn total(&self, length: Duration) -> u64 {
        self.due_count(length.as_secs_f64()).ceil() as u64
    }

    /// The next request a client can still send at `elapsed`, when request `next` is the
    /// first it has not sent: every request between whose slot has ended is missed.
    /// Returns that request and how many were missed.
    pub fn skip_missed(&self, next: u64, elapsed: Duration) -> (u64, u64) {
        // Request k's slot ends when request k + 1 is due, i.e. when N(t) reaches k + 1.
        let open = self.due_count(elapsed.as_secs_f64()).floor() as u64;
        let first_open = open.max(next);
        (first_open, first_open - next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn steady_requests_are_evenly_spaced() {
        let s = Schedule::new(100.0, Profile::Steady);
        assert_eq!(s.due(0), ms(0));
        assert_eq!(s.due(1), ms(10));
        assert_eq!(s.due(250), ms(2500));
        assert_eq!(s.total(Duration::from_secs(3)), 300);
    }

    #[test]
    fn a_burst_offers_factor_times_the_rate_then_the_base_rate() {
        // 10/s, 4× for 1 s of every 5 s: 40 requests in the first second, then 10 a second.
        let s = Schedule::new(
            10.0,
            Profile::Burst {
                factor: 4.0,
                on: Duration::from_secs(1),
                every: Duration::from_secs(5),
            },
        );
        assert_eq!(s.due(1), ms(25));
        assert_eq!(s.due(39), ms(975));
        assert_eq!(s.due(40), ms(1000));
        assert_eq!(s.due(41), ms(1100));
        // The second cycle starts with 80 requests behind it, bursting again.
        assert_eq!(s.due(80), ms(5000));
        assert_eq!(s.due(81), ms(5025));
        assert_eq!(s.total(Duration::from_secs(5)), 80);
        assert_eq!(s.total(Duration::from_secs(10)), 160);
    }

    #[test]
    fn due_times_and_counts_agree() {
        let s = Schedule::new(
            7.0,
            Profile::Burst {
                factor: 3.0,
                on: ms(300),
                every: ms(1100),
            },
        );
        for k in 0..200 {
            let back = s.due_count(s.due(k).as_secs_f64());
            assert!(
                (back - k as f64).abs() < 1e-6,
                "request {k}: N(due) = {back}"
            );
        }
    }

    #[test]
    fn a_client_on_time_misses_nothing() {
        let s = Schedule::new(100.0, Profile::Steady);
        // Request 5 was sent and answered 2 ms into request 6's slot: request 6 is still open.
        assert_eq!(s.skip_missed(6, ms(62)), (6, 0));
        // Exactly when request 6 is due.
        assert_eq!(s.skip_missed(6, ms(60)), (6, 0));
    }

    #[test]
    fn a_late_client_misses_every_slot_that_ended() {
        let s = Schedule::new(100.0, Profile::Steady);
        // Back at 95 ms with request 6 next: slots 6, 7 and 8 ended (at 70, 80, 90 ms).
        assert_eq!(s.skip_missed(6, ms(95)), (9, 3));
        // At the very end of slot 8 (= request 9's due time), 8 is missed too.
        assert_eq!(s.skip_missed(8, ms(90)), (9, 1));
    }
}
