//! What a run saw: per-client tallies (counts and a latency histogram) merged into one report,
//! rendered as plain lines or JSON.

use hdrhistogram::Histogram;
use serde::Serialize;

/// One second of a run, as the timeline keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Seconds since the run started (warm-up included) at the end of this second.
    pub at: f64,
    /// Requests sent per second.
    pub rps: f64,
    /// Requests admitted per second.
    pub admitted: f64,
    /// Requests refused by the limiter per second.
    pub refused: f64,
    /// Requests missed per second.
    pub missed: f64,
    /// Median latency of this second's answers, in milliseconds (0 when none came).
    pub p50: f64,
    /// 99th percentile, in milliseconds.
    pub p99: f64,
}

/// The longest latency a histogram records, in microseconds (a minute).
const MAX_LATENCY_US: u64 = 60_000_000;

/// An empty latency histogram (µs, 1 µs to a minute, three significant figures).
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant, valid bounds")
}

/// The kind of a failed request's error, for the report's breakdown: the HTTP status or gRPC
/// code it came back with, or what kept it from an answer.
pub fn error_kind(message: &str) -> String {
    let lower = message.to_ascii_lowercase();
    if let Some(status) = message.strip_prefix("HTTP ") {
        return format!("HTTP {}", status.split([' ', ':']).next().unwrap_or(""));
    }
    if let Some(code) = message.split("status: ").nth(1) {
        return format!("gRPC {}", code.split([',', ' ']).next().unwrap_or(""));
    }
    let kind = if lower.contains("connection refused") {
        "connection refused"
    } else if lower.contains("timed out") || lower.contains("timeout") || lower.contains("deadline")
    {
        "timed out"
    } else if lower.contains("connection reset") || lower.contains("broken pipe") {
        "connection reset"
    } else if lower.contains("dns") || lower.contains("resolve") {
        "name not resolved"
    } else {
        "other"
    };
    kind.to_owned()
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Admitted.
    Admitted,
    /// Refused by the limiter (HTTP 429, gRPC `admitted: false`).
    Refused,
    /// Anything else: a transport error, an unknown policy, a 5xx.
    Error,
}

impl RequestOutcome {
    /// How an answer ended: an error answer is an [`RequestOutcome::Error`].
    pub fn of(answer: &Result<RequestOutcome, String>) -> RequestOutcome {
        *answer.as_ref().unwrap_or(&RequestOutcome::Error)
    }
}

/// How many requests ended which way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests sent.
    pub sent: u64,
    /// Requests whose slot passed before they could be sent.
    pub missed: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused by the limiter.
    pub refused: u64,
    /// Requests that failed otherwise.
    pub errors: u64,
}

impl Counts {
    /// Counts one sent request.
    pub fn record(&mut self, outcome: RequestOutcome) {
        self.sent += 1;
        match outcome {
            RequestOutcome::Admitted => self.admitted += 1,
            RequestOutcome::Refused => self.refused += 1,
            RequestOutcome::Error => self.errors += 1,
        }
    }

    /// Adds `other` to these.
    pub fn merge(&mut self, other: &Counts) {
        self.sent += other.sent;
        self.missed += other.missed;
        self.admitted += other.admitted;
        self.refused += other.refused;
        self.errors += other.errors;
    }
}

/// One client's counts, or several merged.
#[derive(Debug, Clone)]
pub struct Tally {
    /// The requests by how they ended.
    pub counts: Counts,
    /// Admissions per key index.
    pub admitted_per_key: Vec<u64>,
    /// Requests sent per key index.
    pub sent_per_key: Vec<u64>,
    /// Latency in microseconds, from each request's due time to its answer.
    pub latency: Histogram<u64>,
    /// The first error's message, so a run against a wrong address or policy says why.
    pub first_error: Option<String>,
    /// Errors by kind (see [`error_kind`]).
    pub error_kinds: std::collections::BTreeMap<String, u64>,
    /// When the last counted answer came back.
    pub last_answer: Option<tokio::time::Instant>,
}

impl Tally {
    /// An empty tally over `keys` keys.
    pub fn new(keys: usize) -> Self {
        Tally {
            counts: Counts::default(),
            admitted_per_key: vec![0; keys],
            sent_per_key: vec![0; keys],
            latency: new_latency_histogram(),
            first_error: None,
            error_kinds: Default::default(),
            last_answer: None,
        }
    }

    /// Counts one answered request for key `key`, `latency_us` after it was due.
    pub fn record(&mut self, key: usize, outcome: RequestOutcome, latency_us: u64) {
        self.counts.record(outcome);
        if let Some(n) = self.sent_per_key.get_mut(key) {
            *n += 1;
        }
        if outcome == RequestOutcome::Admitted
            && let Some(n) = self.admitted_per_key.get_mut(key)
        {
            *n += 1;
        }
        self.latency.saturating_record(latency_us.max(1));
    }

    /// Counts one answer, or one error and its message (the first is kept).
    pub fn record_answer(
        &mut self,
        key: usize,
        answer: Result<RequestOutcome, String>,
        latency_us: u64,
    ) {
        match answer {
            Ok(outcome) => self.record(key, outcome, latency_us),
            Err(message) => {
                self.record(key, RequestOutcome::Error, latency_us);
                *self.error_kinds.entry(error_kind(&message)).or_default() += 1;
                self.first_error.get_or_insert(message);
            }
        }
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Tally) {
        self.counts.merge(&other.counts);
        add_per_key(&mut self.admitted_per_key, &other.admitted_per_key);
        add_per_key(&mut self.sent_per_key, &other.sent_per_key);
        self.latency
            .add(&other.latency)
            .expect("every tally has the same bounds");
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        for (kind, count) in &other.error_kinds {
            *self.error_kinds.entry(kind.clone()).or_default() += count;
        }
        self.last_answer = self.last_answer.max(other.last_answer);
    }
}

fn add_per_key(mine: &mut Vec<u64>, theirs: &[u64]) {
    if mine.len() < theirs.len() {
        mine.resize(theirs.len(), 0);
    }
    for (mine, theirs) in mine.iter_mut().zip(theirs) {
        *mine += theirs;
    }
}

/// Admitted rate per key against the configured one, over the keys offered more than it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgainstConfigured {
    /// Each key's configured rate, per second.
    pub configured: f64,
    /// Keys offered more than their configured rate (the only ones it can be judged on).
    pub saturated_keys: usize,
    /// The lowest `admitted / configured` of those keys.
    pub min: f64,
    /// The median.
    pub median: f64,
    /// The highest.
    pub max: f64,
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// The mean.
    pub mean: f64,
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
    /// The largest.
    pub max: f64,
}

/// Admitted rate per key (keys that admitted anything), in requests per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerKeyRate {
    /// Keys with at least one admission.
    pub keys: usize,
    /// The lowest.
    pub min: f64,
    /// The median.
    pub median: f64,
    /// The highest.
    pub max: f64,
}

/// A run's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// What was measured (`inproc`, `http`, `grpc`).
    pub target: String,
    /// Measured seconds (warm-up excluded).
    pub seconds: f64,
    /// Seconds from the start of the measured time to the last counted answer: the time a
    /// limiter had to refill in. Past `seconds` when the last requests went out late (a loaded
    /// machine), a little short of it when a slow open-loop client's last slot came early.
    pub span: f64,
    /// Requests sent per second.
    pub rps: f64,
    /// Requests sent.
    pub sent: u64,
    /// Requests missed (open loop only).
    pub missed: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused by the limiter.
    pub refused: u64,
    /// Requests that failed otherwise.
    pub errors: u64,
    /// Latency from due time (open loop) or send time (closed loop).
    pub latency_ms: Latency,
    /// Admitted rate per key.
    pub admitted_per_key: PerKeyRate,
    /// Admitted rate per key against the configured rate (rate limiters, when it is known).
    pub against_configured: Option<AgainstConfigured>,
    /// The first error's message, if any request failed.
    pub first_error: Option<String>,
    /// Errors by kind: `HTTP 503`, `connection refused`, `timed out`, `other`…
    pub error_kinds: std::collections::BTreeMap<String, u64>,
    /// A point a second, warm-up included (empty for a run shorter than a second).
    pub timeline: Vec<Point>,
}

impl Report {
    /// The report of `tally`, gathered over `seconds` measured seconds; `configured` is each
    /// key's configured rate per second, if known.
    pub fn new(target: &str, seconds: f64, tally: &Tally, configured: Option<f64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        let h = &tally.latency;
        let mut rates: Vec<f64> = tally
            .admitted_per_key
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| n as f64 / seconds)
            .collect();
        rates.sort_by(f64::total_cmp);
        let admitted_per_key = PerKeyRate {
            keys: rates.len(),
            min: rates.first().copied().unwrap_or(0.0),
            median: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
            max: rates.last().copied().unwrap_or(0.0),
        };
        let against_configured = configured.and_then(|configured| {
            let mut ratios: Vec<f64> = tally
                .sent_per_key
                .iter()
                .zip(&tally.admitted_per_key)
                .filter(|&(&sent, _)| sent as f64 / seconds > configured)
                .map(|(_, &admitted)| admitted as f64 / seconds / configured)
                .collect();
            ratios.sort_by(f64::total_cmp);
            Some(AgainstConfigured {
                configured,
                saturated_keys: ratios.len(),
                min: *ratios.first()?,
                median: ratios[ratios.len() / 2],
                max: *ratios.last()?,
            })
        });
        Report {
            target: target.to_owned(),
            seconds,
            span: seconds,
            rps: tally.counts.sent as f64 / seconds,
            sent: tally.counts.sent,
            missed: tally.counts.missed,
            admitted: tally.counts.admitted,
            refused: tally.counts.refused,
            errors: tally.counts.errors,
            latency_ms: Latency {
                mean: h.mean() / 1000.0,
                p50: ms(h.value_at_quantile(0.5)),
                p90: ms(h.value_at_quantile(0.9)),
                p99: ms(h.value_at_quantile(0.99)),
                p999: ms(h.value_at_quantile(0.999)),
                max: ms(h.max()),
            },
            admitted_per_key,
            against_configured,
            first_error: tally.first_error.clone(),
            error_kinds: tally.error_kinds.clone(),
            timeline: Vec::new(),
        }
    }

    /// The report as plain lines.
    pub fn render(&self) -> String {
        let l = &self.latency_ms;
        let k = &self.admitted_per_key;
        let mut text = format!(
            "target {} over {:.1}s: {:.0} rps, sent {}, MISSED {}\n\
             admitted {}, refused {}, errors {}\n\
             latency ms: mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n\
             admitted per key per second ({} keys): min {:.1}  median {:.1}  max {:.1}\n",
            self.target,
            self.seconds,
            self.rps,
            self.sent,
            self.missed,
            self.admitted,
            self.refused,
            self.errors,
            l.mean,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            k.keys,
            k.min,
            k.median,
            k.max,
        );
        if let Some(a) = &self.against_configured {
            text.push_str(&format!(
                "admitted against the configured {:.1}/s ({} keys offered more): min {:.4}×  median {:.4}×  max {:.4}×\n",
                a.configured, a.saturated_keys, a.min, a.median, a.max
            ));
        }
        if !self.error_kinds.is_empty() {
            let kinds: Vec<String> = self
                .error_kinds
                .iter()
                .map(|(kind, count)| format!("{kind} {count}"))
                .collect();
            text.push_str(&format!("errors by kind: {}\n", kinds.join(", ")));
        }
        if let Some(error) = &self.first_error {
            text.push_str(&format!("first error: {error}\n"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_add_counts_and_histograms() {
        let mut a = Tally::new(3);
        a.record(0, RequestOutcome::Admitted, 1_000);
        a.record(1, RequestOutcome::Refused, 2_000);
        a.counts.missed = 2;
        let mut b = Tally::new(3);
        b.record(0, RequestOutcome::Admitted, 3_000);
        b.record(2, RequestOutcome::Error, 4_000);
        b.first_error = Some("connection refused".to_owned());
        b.error_kinds.insert("connection refused".to_owned(), 1);
        b.counts.missed = 1;
        a.merge(&b);
        assert_eq!(
            (
                a.counts.sent,
                a.counts.admitted,
                a.counts.refused,
                a.counts.errors,
                a.counts.missed
            ),
            (4, 2, 1, 1, 3)
        );
        assert_eq!(a.admitted_per_key, vec![2, 0, 0]);
        assert_eq!(a.sent_per_key, vec![2, 1, 1]);
        assert_eq!(a.latency.len(), 4);
        assert_eq!(a.first_error.as_deref(), Some("connection refused"));
        assert_eq!(a.error_kinds.get("connection refused"), Some(&1));
        assert_eq!(a.latency.max(), a.latency.highest_equivalent(4_000));
    }

    #[test]
    fn errors_are_told_apart_by_kind() {
        let mut tally = Tally::new(1);
        for message in [
            "HTTP 503 Service Unavailable: {\"error\":\"shutting_down\"}",
            "HTTP 503 Service Unavailable: again",
            "HTTP 404 Not Found: {}",
            "error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)",
            "operation timed out",
            "status: Unavailable, message: \"the owner is gone\"",
            "something else entirely",
        ] {
            tally.record_answer(0, Err(message.to_owned()), 10);
        }
        let kinds: Vec<(&str, u64)> = tally
            .error_kinds
            .iter()
            .map(|(kind, count)| (kind.as_str(), *count))
            .collect();
        assert_eq!(
            kinds,
            [
                ("HTTP 404", 1),
                ("HTTP 503", 2),
                ("connection refused", 1),
                ("gRPC Unavailable", 1),
                ("other", 1),
                ("timed out", 1),
            ]
        );
        let report = Report::new("http", 1.0, &tally, None);
        assert!(
            report
                .render()
                .contains("errors by kind: HTTP 404 1, HTTP 503 2, connection refused 1"),
            "{}",
            report.render()
        );
    }

    #[test]
    fn a_report_renders_rates_and_percentiles() {
        let mut tally = Tally::new(2);
        for i in 0..100 {
            tally.record(i % 2, RequestOutcome::Admitted, 1_000 * (i as u64 + 1));
        }
        tally.counts.missed = 5;
        let report = Report::new("inproc", 2.0, &tally, None);
        assert_eq!(report.rps, 50.0);
        assert_eq!(report.admitted_per_key.keys, 2);
        assert_eq!(report.admitted_per_key.max, 25.0);
        assert!(
            (report.latency_ms.p50 - 50.0).abs() < 0.1,
            "{}",
            report.latency_ms.p50
        );
        assert!(
            (report.latency_ms.p99 - 99.0).abs() < 0.1,
            "{}",
            report.latency_ms.p99
        );
        let text = report.render();
        assert!(
            text.starts_with("target inproc over 2.0s: 50 rps, sent 100, MISSED 5\n"),
            "{text}"
        );
        assert!(text.contains("admitted 100, refused 0, errors 0"), "{text}");
        assert!(report.against_configured.is_none());
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["missed"], 5);
        assert_eq!(json["admitted_per_key"]["median"], 25.0);
    }

    /// Only keys offered more than their rate are judged: key 0 (offered 30/s, admitted 10/s)
    /// and key 1 (offered 20/s, admitted 9/s) against 10/s; key 2 (5/s) is not.
    #[test]
    fn admitted_is_compared_with_the_configured_rate_on_saturated_keys() {
        let mut tally = Tally::new(3);
        for (key, sent, admitted) in [(0, 30, 10), (1, 20, 9), (2, 5, 5)] {
            for i in 0..sent {
                let outcome = match i < admitted {
                    true => RequestOutcome::Admitted,
                    false => RequestOutcome::Refused,
                };
                tally.record(key, outcome, 100);
            }
        }
        let report = Report::new("inproc", 1.0, &tally, Some(10.0));
        let against = report.against_configured.clone().unwrap();
        assert_eq!(against.saturated_keys, 2);
        assert_eq!((against.min, against.max), (0.9, 1.0));
        assert!(
            report
                .render()
                .contains("admitted against the configured 10.0/s (2 keys offered more): min 0.9000×  median 1.0000×  max 1.0000×"),
            "{}",
            report.render()
        );
        assert!(
            Report::new("inproc", 1.0, &Tally::new(1), Some(10.0))
                .against_configured
                .is_none()
        );
    }
}
