//! The kept buckets' counters on `/metrics`: buckets taken on from the last run, records
//! written, writes by outcome, buckets kept now.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{family, single};
use crate::app::KeptBuckets;

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The kept buckets' counters, read at scrape time.
#[derive(Debug)]
pub(crate) struct KeptCollector {
    kept: Arc<KeptBuckets>,
}

impl KeptCollector {
    /// The collector of `kept`'s counters.
    pub(crate) fn new(kept: Arc<KeptBuckets>) -> Self {
        KeptCollector { kept }
    }
}

impl Collector for KeptCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let c = &self.kept.counters;
        single(
            &mut encoder,
            "weir_kept_buckets",
            "Buckets kept in the data dir across restarts (their policies refill slower than `durable_after`), as of the last write",
            MetricType::Gauge,
            ConstGauge::new(c.kept.load(Relaxed) as i64),
        )?;
        single(
            &mut encoder,
            "weir_kept_bucket_last_walk_seconds",
            "How long the last walk over the kept buckets took, its write included",
            MetricType::Gauge,
            ConstGauge::new(c.last_walk_us.load(Relaxed) as f64 / 1e6),
        )?;
        single(
            &mut encoder,
            "weir_kept_buckets_restored",
            "Kept buckets taken on from the last run: at start, or when their policy came",
            MetricType::Counter,
            ConstCounter::new(c.restored.load(Relaxed)),
        )?;
        single(
            &mut encoder,
            "weir_kept_bucket_walks",
            "Walks over the kept buckets (one every `durable_flush`), whether they had anything to write or not",
            MetricType::Counter,
            ConstCounter::new(c.walks.load(Relaxed)),
        )?;
        single(
            &mut encoder,
            "weir_kept_buckets_written",
            "Kept bucket records written (a bucket is written when a decision changed it since the last write)",
            MetricType::Counter,
            ConstCounter::new(c.written.load(Relaxed)),
        )?;
        family(
            &mut encoder,
            "weir_kept_bucket_writes",
            "Writes of the kept buckets (one durable commit each), by outcome: ok, failed (written again by the next)",
            MetricType::Counter,
            [
                (OutcomeLabel { outcome: "ok" }, c.flushes.load(Relaxed)),
                (OutcomeLabel { outcome: "failed" }, c.failures.load(Relaxed)),
            ]
            .map(|(label, n)| (label, ConstCounter::new(n))),
        )
    }
}
