//! RLQS's counters on `/metrics`: asks answered with an assignment or not, and the shares of
//! this node's own buckets lent to data planes now.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::app::QuotaBook;

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// RLQS's counters, read at scrape time.
#[derive(Debug)]
pub(crate) struct QuotaCollector {
    quota: Arc<QuotaBook>,
}

impl QuotaCollector {
    /// The collector of `quota`'s counters.
    pub(crate) fn new(quota: Arc<QuotaBook>) -> Self {
        QuotaCollector { quota }
    }
}

impl Collector for QuotaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut asks = encoder.encode_descriptor(
            "weir_rlqs_asks",
            "An RLQS stream's asks for a bucket's share (four a second per bucket, and one per new bucket), by outcome: assigned (a token bucket or deny-all pushed), unanswered (no such policy, one that cannot be shared, or its owner did not answer)",
            None,
            MetricType::Counter,
        )?;
        for (outcome, count) in [
            ("assigned", self.quota.answered.load(Relaxed)),
            ("unanswered", self.quota.unanswered.load(Relaxed)),
        ] {
            ConstCounter::new(count).encode(asks.encode_family(&OutcomeLabel { outcome })?)?;
        }
        ConstCounter::new(self.quota.unmapped.seen()).encode(encoder.encode_descriptor(
            "weir_rlqs_unmapped_buckets",
            "Bucket ids an RLQS stream reported that no [[rlqs.bucket]] rule maps and that name no `policy` and `key`: not answered (logged at most once a minute)",
            None,
            MetricType::Counter,
        )?)?;
        ConstGauge::new(self.quota.shares_lent() as i64).encode(encoder.encode_descriptor(
            "weir_rlqs_shares_lent",
            "Shares (of 1 000 a bucket) of this node's own buckets lent to data planes now; a cluster-scoped bucket's are counted on its owner, in weir_cluster_rate_shares_lent",
            None,
            MetricType::Gauge,
        )?)
    }
}
