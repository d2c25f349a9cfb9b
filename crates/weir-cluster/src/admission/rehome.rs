//! Handoff: after a ring change, the leases and loans whose buckets moved handed to their new
//! owners, so the new owner counts them and a rebalance does not double the ceiling.

use std::sync::atomic::Ordering;

use weir::Clock;

use super::{Adoption, HeldLease, Moved, Owed, Transport, TwoTier};
use crate::transport::TransportExt;

impl<C: Clock + Clone, T: Transport> TwoTier<C, T> {
    /// After a ring change: hands every loan whose bucket has a new owner over to it with its
    /// units in use, and gives it back to the old one. Returns how many moved.
    pub(super) async fn rehome_loans(&self) -> usize {
        let moving: Vec<Moved> = {
            let ring = self.ring.load();
            self.book()
                .moved(|bucket| ring.owner_of(bucket).map(str::to_owned))
        };
        let mut moved = 0;
        for m in moving {
            let (from, old_id) = m.from.clone();
            let give_back = Owed::GiveBack {
                bucket: m.bucket.clone(),
                owner: from.clone(),
                id: old_id,
                units: m.units,
            };
            if m.in_use == 0 {
                self.book().forget(&m);
                self.pay(give_back).await;
                continue;
            }
            let adopted = if m.to == self.node_id {
                self.owner
                    .adopt(&m.bucket, &self.loan_holder, m.expires_at, m.in_use, true)
                    .ok()
            } else {
                let adoption = Adoption {
                    bucket: m.bucket.clone(),
                    holder: self.loan_holder.clone(),
                    expires_at: m.expires_at,
                    units: m.in_use,
                    lent: true,
                };
                self.call(self.transport.adopt(&m.to, adoption)).await
            };
            let Some(id) = adopted else { continue };
            let rehomed = self.book().rehomed(&m, id);
            self.hand_away(&from, &m.bucket, old_id, m.units.saturating_sub(m.in_use))
                .await;
            if rehomed {
                moved += 1;
            } else {
                self.release_lease(&m.to, &m.bucket, id).await;
            }
        }
        moved
    }

    /// Tells a lease's (or loan's) previous `owner` that it now lives with the bucket's new
    /// owner: see [`Owner::moved_away`](crate::owner::Owner::moved_away). Best effort: if
    /// the call fails, it stays counted there until it expires.
    async fn hand_away(&self, owner: &str, bucket: &str, id: u64, idle: u64) {
        if owner == self.node_id {
            self.owner.moved_away(bucket, id, idle);
        } else {
            let _ = self
                .call(self.transport.moved_away(owner, bucket, id, idle))
                .await;
        }
    }

    /// After a ring change: hands every held lease (and loan) whose bucket has a new owner over
    /// to it (and releases it at the old one, best effort). Returns how many moved. A lease
    /// that cannot be handed over stays where it is and expires there.
    pub async fn rehome(&self) -> usize {
        let loans = self.rehome_loans().await;
        let ring = self.ring.load();
        self.forget_expired();
        let moving: Vec<(u64, HeldLease, String)> = {
            let held = self.held_leases();
            held.iter()
                .filter_map(|(&handle, lease)| {
                    let owner = ring.owner_of(&lease.bucket)?;
                    (owner != lease.owner).then(|| (handle, lease.clone(), owner.to_owned()))
                })
                .collect()
        };
        let mut moved = 0;
        for (handle, lease, new_owner) in moving {
            let adopted = if new_owner == self.node_id {
                self.owner
                    .adopt(&lease.bucket, &self.node_id, lease.expires_at, 1, false)
                    .ok()
            } else {
                let adoption = Adoption {
                    bucket: lease.bucket.clone(),
                    holder: self.node_id.clone(),
                    expires_at: lease.expires_at,
                    units: 1,
                    lent: false,
                };
                self.call(self.transport.adopt(&new_owner, adoption)).await
            };
            let Some(id) = adopted else { continue };
            let still_held = match self.held_leases().get_mut(&handle) {
                Some(entry) => {
                    entry.owner = new_owner.clone();
                    entry.id = id;
                    true
                }
                None => false,
            };
            if still_held {
                self.hand_away(&lease.owner, &lease.bucket, lease.id, 0)
                    .await;
                moved += 1;
            } else {
                // Released while it was being handed over: give back the adopted copy too.
                self.release_lease(&new_owner, &lease.bucket, id).await;
            }
        }
        let moved = moved + loans;
        self.counters
            .handed_off
            .fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}
