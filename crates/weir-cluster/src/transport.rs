//! How a coordinator reaches a bucket's owner: the [`Transport`] trait, which the gRPC transport
//! ([`crate::grpc`]), the in-memory one ([`crate::in_memory`]) and the batching wrapper
//! ([`crate::batch`]) implement; and the handover of rate buckets through it after a ring
//! change.

use std::sync::Arc;
use std::time::Duration;

use weir::Nanos;

pub use crate::messages::{BoxFuture, LeaseRequest, TransportError};
use crate::pool::Grant;
use crate::rates::{RateDecision, RateOwner, RateRequest, bucket_of};
use crate::ring::Ring;

/// A coordinator's way to an owner.
///
/// The batch calls have defaults that make one call per item; a transport with a wire format
/// for batches (gRPC) overrides them, and [`Batching`](crate::batch::Batching) uses them.
pub trait Transport: Send + Sync {
    /// Asks `owner` for a lease.
    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>>;
    /// Tells `owner` a lease is done.
    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>>;
    /// Hands a live lease of `units` units (a loan, if `lent`) over to the bucket's new
    /// `owner`; returns its id there.
    fn adopt(
        &self,
        owner: &str,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> BoxFuture<'_, Result<u64, TransportError>>;
    /// Gives `units` idle units of a loan back to `owner` (the loan goes on with the rest). A
    /// transport that cannot answers that the owner is unreachable: the units stay lent until
    /// the loan expires, which costs capacity, never the ceiling.
    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let _ = (bucket, lease, units);
        let owner = owner.to_owned();
        Box::pin(async move { Err(TransportError::Unreachable(owner)) })
    }
    /// Extends a lease on `owner` by `ttl` from the owner's now; false if it is gone there (or,
    /// `fenced`, if the owner does not hear from a majority).
    fn renew(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: Nanos,
        fenced: bool,
    ) -> BoxFuture<'_, Result<bool, TransportError>>;

    /// Asks `owner` to decide a request of a cluster-scoped rate policy ([`crate::rates`]).
    /// A transport that does not carry decisions answers that the owner is unreachable (the
    /// asker then decides itself).
    fn decide(
        &self,
        owner: &str,
        request: RateRequest,
    ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
        let _ = request;
        let owner = owner.to_owned();
        Box::pin(async move { Err(TransportError::Unreachable(owner)) })
    }

    /// Asks `owner` to decide several requests that do not wait; one answer per request, in
    /// order.
    fn decide_batch(
        &self,
        owner: &str,
        requests: Vec<RateRequest>,
    ) -> BoxFuture<'_, Vec<Result<RateDecision, TransportError>>> {
        let owner = owner.to_owned();
        Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(self.decide(&owner, request).await);
            }
            answers
        })
    }

    /// Asks `owner` for several leases; one answer per request, in order.
    fn acquire_batch(
        &self,
        owner: &str,
        requests: Vec<LeaseRequest>,
    ) -> BoxFuture<'_, Vec<Result<Grant, TransportError>>> {
        let owner = owner.to_owned();
        Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(self.acquire(&owner, request).await);
            }
            answers
        })
    }

    /// Tells `owner` several leases (bucket, id) are done.
    fn release_batch(
        &self,
        owner: &str,
        leases: Vec<(String, u64)>,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let owner = owner.to_owned();
        Box::pin(async move {
            for (bucket, lease) in leases {
                self.release(&owner, &bucket, lease).await?;
            }
            Ok(())
        })
    }
}

/// Hands every cluster-scoped bucket that `before` named node `me` the owner of, and `after`
/// does not, to its owner in `after` — all at once, so that a batching transport carries many
/// in one call per owner. Returns how many the new owners took. A bucket whose handover fails
/// starts on its new owner as that owner's own state has it (its policy's learning period
/// covers that case as it covers a crash).
pub async fn hand_over<T: Transport + 'static>(
    rates: &dyn RateOwner,
    transport: &Arc<T>,
    me: &str,
    before: &Ring,
    after: &Ring,
) -> usize {
    let handovers = rates.handovers(&mut |bucket| {
        before.owner_of(bucket) == Some(me) && after.owner_of(bucket).is_some_and(|o| o != me)
    });
    let mut sent = tokio::task::JoinSet::new();
    for handover in handovers {
        let Some(owner) = after.owner_of(&bucket_of(&handover.policy, &handover.key)) else {
            continue;
        };
        let owner = owner.to_owned();
        let transport = Arc::clone(transport);
        let request = RateRequest::HandOver(handover);
        sent.spawn(async move { transport.decide(&owner, request).await.is_ok() });
    }
    let mut taken = 0;
    while let Some(answered) = sent.join_next().await {
        taken += usize::from(answered.unwrap_or(false));
    }
    taken
}
