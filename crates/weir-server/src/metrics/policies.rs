//! Every policy's counters, gauges and wait histograms, read from its snapshot at scrape time.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use weir::SystemClock;
use weir::policy::PolicySet;
use weir::policy::stats::{StatsSnapshot, WAIT_BUCKETS};

use super::{family, single};
use crate::decide::{HERE, Place};
use crate::leases::Leases;

/// Reads every policy's counters at scrape time.
#[derive(Debug)]
pub(super) struct PolicyCollector {
    pub(super) policies: Arc<PolicySet<SystemClock>>,
    pub(super) leases: Arc<Leases>,
}

/// `{policy}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

/// `{policy, outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    policy: String,
    outcome: &'static str,
    /// Where it was decided (`decide::Place`, or `here`).
    decided: &'static str,
}

/// `{policy, kind}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    policy: String,
    kind: String,
}

/// A histogram from a snapshot: per-bucket (not cumulative) counts over [`WAIT_BUCKETS`] and an
/// unbounded last bucket.
/// `weir_decisions_total`'s series of policy `name`: each outcome decided here, and at each
/// place that decided any (a place never used adds no series).
fn decisions(name: &str, s: &StatsSnapshot) -> impl Iterator<Item = (OutcomeLabels, ConstCounter)> {
    let totals = [
        ("admitted", s.admitted - s.throttled - s.would_throttle),
        ("throttled", s.throttled),
        ("rejected", s.rejected),
        ("would_throttle", s.would_throttle),
    ];
    let label = |outcome, decided| OutcomeLabels {
        policy: name.to_owned(),
        outcome,
        decided,
    };
    let mut series = Vec::with_capacity(5);
    for (column, (outcome, total)) in totals.into_iter().enumerate() {
        let elsewhere: u64 = s.placed.iter().map(|row| row[column]).sum();
        series.push((
            label(outcome, HERE),
            ConstCounter::new(total.saturating_sub(elsewhere)),
        ));
        for place in Place::ALL {
            let n = s.placed[place.index()][column];
            if n > 0 {
                series.push((label(outcome, place.name()), ConstCounter::new(n)));
            }
        }
    }
    series.push((label("unkeyed", HERE), ConstCounter::new(s.unkeyed)));
    series.into_iter()
}

fn wait_histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (impl EncodeLabelSet, Duration, Vec<u64>)>,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, sum, counts) in series {
        let buckets: Vec<(f64, u64)> = WAIT_BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts.iter().copied())
            .collect();
        let count = counts.iter().sum();
        metric
            .encode_family(&labels)?
            .encode_histogram::<PolicyLabel>(sum.as_secs_f64(), count, &buckets, None)?;
    }
    Ok(())
}

impl Collector for PolicyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let policies = self.policies.policies();
        let stats: Vec<_> = policies
            .iter()
            .map(|p| (p.name().to_owned(), p.stats(), p.backpressure_stats()))
            .collect();
        let label = |name: &String| PolicyLabel {
            policy: name.clone(),
        };
        family(
            &mut encoder,
            "weir_requests",
            "Requests a policy applied to (accounted)",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.started))),
        )?;
        family(
            &mut encoder,
            "weir_requests_finished",
            "Requests done: refused, or admitted and finished",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.finished))),
        )?;
        family(
            &mut encoder,
            "weir_decisions",
            "Decisions by outcome: admitted (at once), throttled (admitted after waiting), rejected, would_throttle (monitor mode), unkeyed (no bucket key); and where decided: here (this node's bucket), owner (for another node's request), assigned (within this node's share), redis, envoy_assigned (Envoy within its RLQS share). Each decision is counted once, on the node that made it",
            MetricType::Counter,
            stats.iter().flat_map(|(n, s, _)| decisions(n, s)),
        )?;
        wait_histogram(
            &mut encoder,
            "weir_wait_seconds",
            "How long throttled requests waited",
            stats
                .iter()
                .map(|(n, s, _)| (label(n), s.wait_sum, s.wait_counts.clone())),
        )?;
        for (name, help, value) in [
            ("weir_in_flight", "Admitted requests not finished yet", 0),
            ("weir_waiters", "Requests waiting for their turn", 1),
            ("weir_keys", "Keys (buckets) tracked", 2),
        ] {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Gauge,
                stats.iter().map(|(n, s, _)| {
                    let v = [s.in_flight, s.waiters, s.keys][value];
                    (label(n), ConstGauge::new(v as i64))
                }),
            )?;
        }
        family(
            &mut encoder,
            "weir_evictions",
            "Idle buckets dropped to bound memory",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.evictions))),
        )?;
        family(
            &mut encoder,
            "weir_overflow",
            "New keys that found the key map full",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.overflow_hits))),
        )?;
        family(
            &mut encoder,
            "weir_sketched",
            "Decisions on keys past the key map's cap, made in the policy's sketch",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.sketched))),
        )?;

        let adaptive: Vec<_> = stats
            .iter()
            .filter_map(|(n, _, b)| b.as_ref().map(|b| (n, b)))
            .collect();
        for (name, help, pick) in [
            (
                "weir_backpressure_busy_signals",
                "Busy signals received by adaptive policies",
                0,
            ),
            (
                "weir_backpressure_upgrades",
                "Times an adaptive policy tightened its hottest keys",
                1,
            ),
            (
                "weir_backpressure_downgrades",
                "Times an adaptive policy relaxed limits (a level, or every limited key)",
                2,
            ),
        ] {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Counter,
                adaptive.iter().map(|(n, b)| {
                    let v = [b.busy_signals, b.upgrades, b.downgrades][pick];
                    (label(n), ConstCounter::new(v))
                }),
            )?;
        }
        family(
            &mut encoder,
            "weir_backpressure_throttled_keys",
            "Keys an adaptive policy limits now, per kind (RPC type)",
            MetricType::Gauge,
            adaptive.iter().flat_map(|(n, b)| {
                b.throttled_keys.iter().map(|(kind, count)| {
                    (
                        KindLabels {
                            policy: (*n).clone(),
                            kind: kind.clone(),
                        },
                        ConstGauge::new(*count as i64),
                    )
                })
            }),
        )?;
        wait_histogram(
            &mut encoder,
            "weir_backpressure_wait_seconds",
            "How long calls waited for their slot, per kind (RPC type)",
            adaptive.iter().flat_map(|(n, b)| {
                b.waits.iter().map(|(kind, (sum, counts))| {
                    (
                        KindLabels {
                            policy: (*n).clone(),
                            kind: kind.clone(),
                        },
                        *sum,
                        counts.clone(),
                    )
                })
            }),
        )?;

        let leases = self.leases.counters();
        single(
            &mut encoder,
            "weir_leases_active",
            "Concurrency leases held now",
            MetricType::Gauge,
            ConstGauge::new(leases.active as i64),
        )?;
        single(
            &mut encoder,
            "weir_leases_expired",
            "Leases reclaimed because their holder neither released nor renewed them",
            MetricType::Counter,
            ConstCounter::new(leases.expired),
        )?;
        single(
            &mut encoder,
            "weir_leases_released",
            "Leases released by their holder",
            MetricType::Counter,
            ConstCounter::new(leases.released),
        )?;
        Ok(())
    }
}
