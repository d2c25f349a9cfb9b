//! Envoy's rate limit quota service (RLQS v3): data planes report usage per bucket on a
//! stream; Weir answers each with a share of a Weir policy's bucket, as a token bucket with a
//! TTL, decided by the same assignment book that lends rate shares between nodes (see
//! [`weir_cluster::assignment`]).
//!
//! | file | job |
//! |---|---|
//! | `service.rs` | the gRPC stream: reports in, bucket actions out, one task per Envoy |
//! | `buckets.rs` | the config file's `[rlqs]` table: bucket id → policy and key |
//! | `action.rs` | a share as Envoy's token bucket, and a bucket's demand as reported |
//! | `metrics.rs` | its counters on `/metrics` |
//!
//! What a report is answered is decided by `Decider::assign_quota` (`decide/lent.rs`).

pub mod action;
pub mod buckets;
mod metrics;
mod service;

pub use buckets::RlqsTable;
pub use service::RlqsService;

use std::sync::Arc;

use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

use crate::app::App;

/// The RLQS service for the gRPC listener, mapping bucket ids by `table`; its counters
/// registered on `/metrics`.
pub fn service(app: &Arc<App>, table: RlqsTable) -> RateLimitQuotaServiceServer<RlqsService> {
    app.metrics()
        .register_collector(Box::new(metrics::QuotaCollector::new(Arc::clone(
            app.decider().lent(),
        ))));
    RateLimitQuotaServiceServer::new(RlqsService::new(Arc::clone(app), table))
}

#[cfg(test)]
mod tests;
