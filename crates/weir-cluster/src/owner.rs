//! The owner's side of a lease request: the ownership fence in front of the pool.
//!
//! A coordinator picks an owner with *its* view of the ring; during a membership change the
//! views of two nodes can differ. So an owner grants only for buckets its own ring says it
//! owns, and answers "not the owner" otherwise — the coordinator then treats the pool as
//! unavailable for this request (the policy's `on_unavailable` decides), rather than two nodes
//! each granting the whole shared limit for the same bucket.

use std::sync::Arc;

use crate::pool::{Grant, SharedPool};
use crate::ring::SharedRing;
use crate::transport::{LeaseRequest, TransportError};

/// One node's pool behind the ownership fence.
#[derive(Debug)]
pub struct Owner {
    node_id: String,
    ring: Arc<SharedRing>,
    pool: Arc<SharedPool>,
}

impl Owner {
    /// Node `node_id`'s pool, fenced by its view of the ring.
    pub fn new(node_id: &str, ring: Arc<SharedRing>, pool: Arc<SharedPool>) -> Self {
        Owner {
            node_id: node_id.to_owned(),
            ring,
            pool,
        }
    }

    /// Grants a lease if this node owns the bucket in its own view of the ring.
    pub fn grant(&self, request: &LeaseRequest) -> Result<Grant, TransportError> {
        self.fence(&request.bucket)?;
        Ok(self.pool.acquire(
            &request.bucket,
            request.limit,
            &request.holder,
            request.ttl,
            request.now,
        ))
    }

    /// Takes over a lease granted by the bucket's previous owner, if this node owns the bucket
    /// now; returns its id here.
    pub fn adopt(
        &self,
        bucket: &str,
        holder: &str,
        expires_at: weir::Nanos,
    ) -> Result<u64, TransportError> {
        self.fence(bucket)?;
        Ok(self.pool.adopt(bucket, holder, expires_at))
    }

    /// Extends a live lease to `now + ttl`; false if it is unknown or expired here.
    pub fn renew(&self, bucket: &str, lease: u64, ttl: weir::Nanos, now: weir::Nanos) -> bool {
        self.pool.renew(bucket, lease, ttl, now).is_some()
    }

    /// Releases a lease (whoever owns the bucket now: a release is never refused).
    pub fn release(&self, bucket: &str, lease: u64) {
        self.pool.release(bucket, lease);
    }

    /// `NotOwner` unless this node's own ring names it `bucket`'s owner.
    fn fence(&self, bucket: &str) -> Result<(), TransportError> {
        match self.ring.is_owner(bucket, &self.node_id) {
            true => Ok(()),
            false => Err(TransportError::NotOwner(self.node_id.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{DEFAULT_VNODES, Member, Ring};

    fn request(bucket: &str) -> LeaseRequest {
        LeaseRequest {
            bucket: bucket.into(),
            limit: 5,
            holder: "coordinator".into(),
            ttl: 1_000,
            now: 0,
        }
    }

    #[test]
    fn an_owner_grants_only_for_buckets_it_owns_in_its_own_view() {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1), Member::owner("b", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)));
        let (mine, theirs): (Vec<String>, Vec<String>) = (0..100)
            .map(|i| format!("bucket-{i}"))
            .partition(|b| ring.owner_of(b).as_deref() == Some("a"));
        assert!(!mine.is_empty() && !theirs.is_empty());
        assert!(matches!(
            a.grant(&request(&mine[0])),
            Ok(Grant::Granted { .. })
        ));
        assert_eq!(
            a.grant(&request(&theirs[0])),
            Err(TransportError::NotOwner("a".into()))
        );
        // When its view changes (b left), it owns everything.
        ring.publish(Ring::new([Member::owner("a", 1)], DEFAULT_VNODES, 1));
        assert!(matches!(
            a.grant(&request(&theirs[0])),
            Ok(Grant::Granted { .. })
        ));
    }
}
