//! Cluster mode's two-tier coordinators, one per concurrency policy: made on demand, released
//! into, swept, and kept up (the loans' upkeep).

use super::{
    Arc, ClusterAdmission, ClusterMode, ConcurrencySpec, Coordinator, Duration, SystemClock,
    TwoTier, TwoTierConfig,
};
use weir::Clock;

impl ClusterMode {
    /// The shared-only coordinator of a policy (re-created if its settings changed).
    pub fn coordinator(
        &self,
        policy: &str,
        spec: &ConcurrencySpec,
        max_keys: usize,
    ) -> Arc<Coordinator> {
        let config = TwoTierConfig {
            node_limit: 0,
            shared_limit: spec.shared.shared_limit,
            lease_ttl: spec.lease_ttl,
            on_unavailable: spec.shared.on_unavailable,
            acquire_timeout: Duration::from_millis(200),
            max_keys,
            max_loan: spec.shared.max_loan,
            learning_period: spec.shared.learning_period,
        };
        let mut coordinators = self.coordinators.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((current, coordinator)) = coordinators.get(policy)
            && *current == config
        {
            return Arc::clone(coordinator);
        }
        let coordinator = Arc::new(TwoTier::new(
            &self.node_id,
            config.clone(),
            Arc::clone(&self.ring),
            Arc::clone(&self.transport),
            Arc::clone(&self.owner),
            SystemClock::new(),
        ));
        coordinators.insert(policy.to_owned(), (config, Arc::clone(&coordinator)));
        coordinator
    }

    /// Releases a shared admission (in the background: the caller's answer does not wait).
    pub fn release(coordinator: Arc<Coordinator>, admission: ClusterAdmission) {
        tokio::spawn(async move { coordinator.release(admission).await });
    }

    /// Shared units this node has lent out as an owner, by holder.
    pub fn lent(&self) -> std::collections::BTreeMap<String, u64> {
        self.pool.lent(SystemClock::new().now())
    }

    /// Renews this node's loans and gives back the units they may not keep, for every policy;
    /// see [`weir_cluster::loan`].
    pub(super) async fn upkeep(&self) {
        for coordinator in self.coordinators() {
            coordinator.upkeep().await;
        }
    }

    /// Every policy's coordinator now (the lock is not held while they are used).
    pub(super) fn coordinators(&self) -> Vec<Arc<Coordinator>> {
        self.coordinators
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|(_, c)| Arc::clone(c))
            .collect()
    }

    /// Periodic upkeep: drops the expired leases of this node's pool (and its empty buckets)
    /// and the expired shared leases its coordinators still list. Returns how many of each.
    pub fn sweep(&self) -> (usize, usize) {
        let swept = self.pool.sweep(SystemClock::new().now());
        let forgotten = self
            .coordinators
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|(_, coordinator)| coordinator.forget_expired())
            .sum();
        (swept, forgotten)
    }
}
