//! The shared tier without loans: one lease per request from the bucket's owner, held in the
//! coordinator's registry until it is released, renewed or expires.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir::Clock;

use super::{
    Ask, ClusterAdmission, ClusterRefusal, Fence, Grant, HashMap, HeldLease, Holding, LeaseRequest,
    Renewal, Shared, SharedLease, Tier, Transport, TransportError, TwoTier,
};
use crate::transport::TransportExt;

impl<C: Clock + Clone, T: Transport> TwoTier<C, T> {
    /// The shared tier without loans: a lease from the bucket's owner.
    pub(super) async fn acquire_lease(
        &self,
        bucket: &str,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        // A grant that comes back after the ring moved the bucket is returned and asked for
        // again of the new owner: the handoff of that change may already have run without it,
        // and the new owner would not count it. Twice in a row means the ring is churning.
        for _ in 0..2 {
            let ring = self.ring.load();
            let Some(owner) = ring.owner_of(bucket) else {
                return self.unavailable(bucket, ring.members().len());
            };
            let grant = self.ask_owner(bucket, owner, Ask::Lease).await;
            match grant {
                Ok(Grant::Granted { id, expires_at, .. }) => {
                    // Checked and recorded under the registry's lock: `rehome` loads the ring
                    // before it takes that lock, so it either sees this lease or this check
                    // sees its ring.
                    let handle = {
                        let mut held = self.held_leases();
                        self.ring.is_owner(bucket, owner).then(|| {
                            let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
                            held.insert(
                                handle,
                                HeldLease {
                                    bucket: bucket.to_owned(),
                                    owner: owner.to_owned(),
                                    id,
                                    expires_at,
                                },
                            );
                            handle
                        })
                    };
                    let Some(handle) = handle else {
                        self.counters.raced.fetch_add(1, Ordering::Relaxed);
                        self.release_lease(owner, bucket, id).await;
                        continue;
                    };
                    self.counters.shared.fetch_add(1, Ordering::Relaxed);
                    return Ok(ClusterAdmission {
                        tier: Tier::Shared,
                        hold: Holding::Lease(handle),
                    });
                }
                answer => return self.not_granted(bucket, answer, ring.members().len()),
            }
        }
        let members = self.ring.load().members().len();
        self.unavailable(bucket, members)
    }

    /// Asks `owner` for a lease on `bucket` (or for a loan to grow, or be renewed): this
    /// node's own pool without a hop, else one call bounded by the acquire timeout.
    pub(super) async fn ask_owner(
        &self,
        bucket: &str,
        owner: &str,
        ask: Ask,
    ) -> Result<Grant, TransportError> {
        let request = LeaseRequest {
            bucket: bucket.to_owned(),
            limit: self.config.shared_limit,
            holder: match ask.is_loan() {
                true => self.loan_holder.clone(),
                false => self.node_id.clone(),
            },
            ttl: self.ttl(),
            now: self.clock.now(),
            ask,
            fence: match self.fenced() {
                true => Fence::Closed,
                false => Fence::Learning(self.config.learning_period),
            },
        };
        if owner == self.node_id {
            return self.owner.grant(&request);
        }
        tokio::time::timeout(
            self.config.acquire_timeout,
            self.transport.acquire(owner, request),
        )
        .await
        .unwrap_or_else(|_| Err(TransportError::Unreachable(owner.to_owned())))
    }

    pub(super) fn held_leases(&self) -> std::sync::MutexGuard<'_, HashMap<u64, HeldLease>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Releases a lease where it lives: on this node's pool, or with one call to its owner (if
    /// that call fails, the lease expires with its TTL).
    pub(super) async fn release_lease(&self, owner: &str, bucket: &str, id: u64) {
        if owner == self.node_id {
            self.owner.release(bucket, id);
        } else {
            let _ = self.call(self.transport.release(owner, bucket, id)).await;
        }
    }

    /// Releases what `admission` holds: its node permit, its shared lease, or its lent unit.
    pub async fn release(&self, admission: ClusterAdmission) {
        match admission.hold {
            Holding::Permit(permit) => drop(permit),
            Holding::Nothing => {}
            Holding::Unit(unit) => {
                let owed = self.book().put_back(&unit);
                if let Some(owed) = owed {
                    self.pay(owed).await;
                }
            }
            Holding::Lease(handle) => {
                let held = self.held_leases().remove(&handle);
                if let Some(lease) = held {
                    self.release_lease(&lease.owner, &lease.bucket, lease.id)
                        .await;
                }
            }
        }
    }

    /// Extends a shared lease by `ttl` on its owner; true if it was still live there.
    pub async fn renew(&self, lease: SharedLease, ttl: Duration) -> bool {
        let handle = match lease.0 {
            Shared::Lease(handle) => handle,
            Shared::Unit(unit) => {
                // The loan outlives its units by its margin; renewing it renews them all.
                let Some((owner, id)) = self.book().loan_of(&unit) else {
                    return false;
                };
                return self.renew_loan(&unit.bucket, &owner, id).await;
            }
        };
        let Some(mut lease) = self.held_leases().get(&handle).cloned() else {
            return false;
        };
        if self
            .ring
            .owner_of(&lease.bucket)
            .is_some_and(|o| o != lease.owner)
        {
            // Its bucket moved and its handoff has not happened or failed: hand it over now,
            // so that it is renewed where it is counted.
            self.rehome().await;
            match self.held_leases().get(&handle) {
                Some(moved) => lease = moved.clone(),
                None => return false,
            }
        }
        let now = self.clock.now();
        let fenced = self.fenced();
        let renewed = if lease.owner == self.node_id {
            self.owner.renew(&lease.bucket, lease.id, ttl, now, fenced)
        } else {
            let renewal = Renewal {
                bucket: lease.bucket.clone(),
                lease: lease.id,
                ttl,
                now,
                fenced,
            };
            self.call(self.transport.renew(&lease.owner, renewal))
                .await
                .unwrap_or(false)
        };
        if renewed && let Some(entry) = self.held_leases().get_mut(&handle) {
            entry.expires_at = weir::clock::after(now, ttl);
        }
        renewed
    }

    /// Drops the shared leases held past their expiry (their owners have dropped them too);
    /// returns how many. Releasing an admission whose lease is gone is then a no-op.
    pub fn forget_expired(&self) -> usize {
        let now = self.clock.now();
        let mut held = self.held_leases();
        let before = held.len();
        held.retain(|_, lease| lease.expires_at > now);
        before - held.len()
    }
}
