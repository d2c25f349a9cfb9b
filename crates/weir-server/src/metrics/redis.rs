//! The Redis store's counters on `/metrics`: decisions Redis made, and those `on_unavailable`
//! made because it could not.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use super::family;
use crate::redis_buckets::RedisBuckets;

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `{kind}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The Redis store's counters, read at scrape time.
#[derive(Debug)]
pub(crate) struct RedisCollector {
    redis: Arc<RedisBuckets>,
}

impl RedisCollector {
    /// The collector of `redis`'s counters.
    pub(crate) fn new(redis: Arc<RedisBuckets>) -> Self {
        RedisCollector { redis }
    }
}

impl Collector for RedisCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let c = &self.redis.counters;
        family(
            &mut encoder,
            "weir_redis_decisions",
            "Decisions on buckets kept in Redis, by outcome: admitted and refused by Redis; fail_open and fail_closed by `on_unavailable`, when Redis could not decide; error, refused because Redis answered with an error",
            MetricType::Counter,
            [
                ("admitted", &c.admitted),
                ("refused", &c.refused),
                ("fail_open", &c.fail_open),
                ("fail_closed", &c.fail_closed),
                ("error", &c.error),
            ]
            .map(|(outcome, n)| (OutcomeLabel { outcome }, ConstCounter::new(n.load(Relaxed)))),
        )?;
        ConstCounter::new(self.redis.script_calls()).encode(encoder.encode_descriptor(
            "weir_redis_script_calls",
            "Script calls sent to Redis: decisions sent together share one (one a decision in a Redis Cluster); weir_redis_decisions_total over it is the batches' mean size",
            None,
            MetricType::Counter,
        )?)?;
        family(
            &mut encoder,
            "weir_redis_errors",
            "Failures asking Redis, by kind: outages (timeout, connection, loading, read_only) are decided by `on_unavailable`; answers (out_of_memory, wrong_type, auth, no_script, reply, other) refuse the request",
            MetricType::Counter,
            self.redis
                .errors
                .counts()
                .map(|(kind, n)| (KindLabel { kind: kind.name() }, ConstCounter::new(n))),
        )
    }
}
