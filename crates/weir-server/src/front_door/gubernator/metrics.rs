//! The Gubernator API's counters on `/metrics`: its decisions by algorithm and status, its
//! errors, and the buckets it keeps.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::Gubernator;

/// `{algorithm, status}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    algorithm: &'static str,
    status: &'static str,
}

/// The door's counters, read at scrape time.
#[derive(Debug)]
pub(super) struct GubernatorCollector {
    door: Arc<Gubernator>,
}

impl GubernatorCollector {
    pub(super) fn new(door: Arc<Gubernator>) -> Self {
        GubernatorCollector { door }
    }
}

impl Collector for GubernatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let counts = &self.door.buckets.counts;
        let mut decided = encoder.encode_descriptor(
            "weir_gubernator_decisions",
            "Requests of Gubernator's API (GetRateLimits, gRPC and HTTP gateway) decided, by algorithm (token_bucket, leaky_bucket) and status (under_limit, over_limit)",
            None,
            MetricType::Counter,
        )?;
        for (a, algorithm) in ["token_bucket", "leaky_bucket"].into_iter().enumerate() {
            for (s, status) in ["under_limit", "over_limit"].into_iter().enumerate() {
                ConstCounter::new(counts.decided[a][s].load(Relaxed))
                    .encode(decided.encode_family(&DecisionLabels { algorithm, status })?)?;
            }
        }
        ConstCounter::new(counts.errors.load(Relaxed)).encode(encoder.encode_descriptor(
            "weir_gubernator_errors",
            "Requests of Gubernator's API answered with an error in their `error` field (a missing name or key, an unknown algorithm, a Gregorian duration that is not an interval)",
            None,
            MetricType::Counter,
        )?)?;
        ConstCounter::new(counts.evicted.load(Relaxed)).encode(encoder.encode_descriptor(
            "weir_gubernator_evicted",
            "Buckets of Gubernator's API dropped before they ended, to keep within `[gubernator] max_keys` (they start again whole)",
            None,
            MetricType::Counter,
        )?)?;
        ConstGauge::new(self.door.buckets.len() as i64).encode(encoder.encode_descriptor(
            "weir_gubernator_buckets",
            "Buckets of Gubernator's API kept now",
            None,
            MetricType::Gauge,
        )?)
    }
}
