//! Leases over the API: releasing, renewing (on the shared pool's owner first) and reclaiming
//! the expired.

use std::time::Duration;

use weir::Clock;
use weir::lease::LeaseId;

use super::{App, DEFAULT_LEASE_TTL};
use crate::error::ApiError;

impl App {
    fn lease_id(text: &str) -> Result<LeaseId, ApiError> {
        text.parse::<LeaseId>()
            .map_err(|e| ApiError::invalid(format!("`lease`: {e}")))
    }

    /// Releases a lease.
    pub fn release(&self, lease: &str) -> Result<(), ApiError> {
        let id = Self::lease_id(lease)?;
        if self.leases.release(id) {
            Ok(())
        } else {
            Err(ApiError::unknown_lease())
        }
    }

    /// Extends a lease by `ttl_ms` (default and most: its policy's `lease_ttl`); returns the
    /// time left. A longer `ttl_ms` is cut to the policy's `lease_ttl`: a holder cannot pin
    /// capacity beyond what the operator configured. A shared lease is renewed on its owner
    /// first; if it is gone there, so is the lease.
    pub async fn renew(&self, lease: &str, ttl_ms: Option<u64>) -> Result<Duration, ApiError> {
        let id = Self::lease_id(lease)?;
        if ttl_ms == Some(0) {
            return Err(ApiError::invalid("`ttl_ms` must be greater than zero"));
        }
        let policy = self
            .leases
            .policy_of(id)
            .ok_or_else(ApiError::unknown_lease)?;
        // A removed policy's leases are released with it; one removed between the two lookups
        // renews by the default.
        let most = self
            .policies
            .get(&policy)
            .and_then(|p| p.with_config(|c| c.concurrency().map(|c| c.lease_ttl)))
            .unwrap_or(DEFAULT_LEASE_TTL);
        let ttl = ttl_ms.map_or(most, |ms| Duration::from_millis(ms).min(most));
        if let Some((coordinator, shared)) = self.leases.shared_of(id)
            && !coordinator.renew(shared, ttl).await
        {
            self.leases.release(id);
            return Err(ApiError::unknown_lease());
        }
        let now = self.clock.now();
        self.leases
            .renew(id, ttl, now)
            .map(|expires| Duration::from_nanos(expires - now))
            .ok_or_else(ApiError::unknown_lease)
    }

    /// Reclaims expired leases; returns how many.
    pub fn sweep_leases(&self) -> usize {
        if let Some(cluster) = &self.cluster {
            // The owner's pool and the coordinators' lists of shared leases expire alike.
            cluster.sweep();
        }
        self.leases.sweep(self.clock.now())
    }
}
