//! Whether this node is ready, what it does not do as it should, and its shutdown.
//!
//! Readiness is more than "the listeners are bound": a node shutting down drains, a cluster
//! member that has not joined would decide alone, and a ready node whose kept buckets are not
//! written or whose Redis is unreachable says so (`/readyz`) rather than keep nothing quietly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use super::KeptBuckets;
use crate::cluster::ClusterMode;
use crate::redis_buckets::RedisBuckets;

/// A node's readiness and shutdown.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    shutdown: watch::Sender<bool>,
    cluster: Option<Arc<ClusterMode>>,
    kept: Option<Arc<KeptBuckets>>,
    redis: Option<Arc<RedisBuckets>>,
}

impl Health {
    /// A node not yet ready, not shutting down, whose stores are `kept` and `redis`.
    pub(super) fn new(
        cluster: Option<Arc<ClusterMode>>,
        kept: Option<Arc<KeptBuckets>>,
        redis: Option<Arc<RedisBuckets>>,
    ) -> Self {
        Health {
            ready: AtomicBool::new(false),
            shutdown: watch::channel(false).0,
            cluster,
            kept,
            redis,
        }
    }

    /// Marks the server ready (listeners bound) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether the server is ready to serve: started, not shutting down, and in cluster mode
    /// joined to its cluster.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
            && !*self.shutdown.borrow()
            && self.cluster.as_ref().is_none_or(|c| c.has_joined())
    }

    /// Why the server is not ready, if it is not: starting, shutting down, or in cluster mode
    /// still joining (with the seeds it tried and what to check).
    pub fn not_ready_because(&self) -> Option<String> {
        if *self.shutdown.borrow() {
            return Some("shutting down: draining its connections".to_owned());
        }
        if !self.ready.load(Ordering::Acquire) {
            return Some("starting up".to_owned());
        }
        self.cluster.as_ref().and_then(|c| c.joining())
    }

    /// What a ready node does not do as it should, for `/readyz`: its kept buckets not
    /// written, its Redis unreachable.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(error) = self.kept.as_ref().and_then(|kept| kept.failing()) {
            warnings.push(format!(
                "the kept buckets are not being written ({error}): the quotas spent since the last write would start whole after a restart"
            ));
        }
        if let Some((at, error)) = self
            .redis
            .as_ref()
            .and_then(|redis| redis.errors.unreachable())
        {
            warnings.push(format!(
                "the Redis of `scope = \"redis\"` policies is unreachable ({error}, {} s ago): their decisions follow `on_unavailable`",
                at.elapsed().as_secs()
            ));
        }
        warnings
    }

    /// Starts shutting down: waiting requests are answered 503.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves when shutdown begins.
    pub async fn shutting_down(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Whether shutdown has begun, watched (what a waiting request gives up on).
    pub(super) fn subscribe(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}
