//! How a coordinator reaches a bucket's owner, and an in-memory implementation for tests and
//! simulation.
//!
//! The coordinator only needs two calls of an owner: grant a shared lease, and release one.
//! [`Transport`] is that interface; the gRPC transport (a later step) and [`InMemory`] implement
//! it. `InMemory` holds every node's [`Owner`] (its pool behind the ownership fence) in one
//! process and can make a node unreachable, to test what happens when an owner crashes or is
//! partitioned away.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use weir::Nanos;

use crate::owner::Owner;
use crate::pool::Grant;
use crate::rates::{RateDecision, RateRequest};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A grant request to an owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The bucket.
    pub bucket: String,
    /// The bucket's shared limit.
    pub limit: u64,
    /// The node asking (it holds the lease).
    pub holder: String,
    /// How long the lease lives unless renewed.
    pub ttl: Duration,
    /// The time on the caller's clock (the simulation shares one clock).
    pub now: Nanos,
    /// The caller's policy must never exceed its ceiling (`on_unavailable = "closed"`): grant
    /// only after one `ttl` of tenure (see [`Tenure`](crate::tenure)).
    pub fenced: bool,
    /// Units asked for: 1 for a plain lease; for a loan, how many to add (0: renew only).
    pub units: u64,
    /// A loan: the holder keeps one per bucket on this owner, which this request grows and
    /// renews (or starts), rather than a lease of its own.
    pub lend: bool,
    /// An unfenced request's learning period: grant only once the owner has held the bucket
    /// this long, so that leases other nodes hold are re-registered first (zero: grant at
    /// once).
    pub learning: Duration,
}

impl LeaseRequest {
    /// A request for one plain lease.
    pub fn one(bucket: &str, limit: u64, holder: &str, ttl: Duration, now: Nanos) -> Self {
        LeaseRequest {
            bucket: bucket.to_owned(),
            limit,
            holder: holder.to_owned(),
            ttl,
            now,
            fenced: false,
            units: 1,
            lend: false,
            learning: Duration::ZERO,
        }
    }
}

/// Why an owner could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// No answer: the node is down, partitioned away, or too slow.
    #[error("owner `{0}` is unreachable")]
    Unreachable(String),
    /// The node answered that it does not own the bucket (its ring differs from ours).
    #[error("`{0}` is not the bucket's owner")]
    NotOwner(String),
    /// The owner has held the bucket for less than the lease TTL and the request is fenced:
    /// leases granted before it took over may still be live (see [`Tenure`](crate::tenure)).
    #[error(
        "its owner `{owner}` took it over too recently: leases granted before may still be live (it grants in {} ms)",
        wait.as_nanos().div_ceil(1_000_000)
    )]
    Settling {
        /// The owner.
        owner: String,
        /// How long until it grants.
        wait: Duration,
    },
    /// The request is fenced and the owner does not hear from a majority of the cluster: it may
    /// be cut off, with the bucket granted on the other side (see [`Quorum`](crate::quorum)).
    #[error(
        "its owner `{owner}` hears from {heard} of the cluster's {known} members, not a majority"
    )]
    NoMajority {
        /// The owner.
        owner: String,
        /// Members it heard from recently, itself included.
        heard: usize,
        /// Members it knows.
        known: usize,
    },
}

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

/// Every node's owner side in one process, with unreachable nodes.
#[derive(Debug, Default)]
pub struct InMemory {
    owners: Mutex<HashMap<String, Arc<Owner>>>,
    down: Mutex<BTreeSet<String>>,
}

impl InMemory {
    /// An empty network.
    pub fn new() -> Self {
        InMemory::default()
    }

    /// Adds a node's owner side.
    pub fn add(&self, node: &str, owner: Arc<Owner>) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned(), owner);
    }

    /// Makes a node unreachable (`down = true`) or reachable again.
    pub fn set_down(&self, node: &str, down: bool) {
        let mut set = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if down {
            set.insert(node.to_owned());
        } else {
            set.remove(node);
        }
    }

    fn owner(&self, node: &str) -> Result<Arc<Owner>, TransportError> {
        if self
            .down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(node)
        {
            return Err(TransportError::Unreachable(node.to_owned()));
        }
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
            .ok_or_else(|| TransportError::Unreachable(node.to_owned()))
    }
}

impl Transport for InMemory {
    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        let owner = self.owner(owner);
        Box::pin(async move { owner?.grant(&request) })
    }

    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move {
            owner?.release(&bucket, lease);
            Ok(())
        })
    }

    fn adopt(
        &self,
        owner: &str,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> BoxFuture<'_, Result<u64, TransportError>> {
        let owner = self.owner(owner);
        let (bucket, holder) = (bucket.to_owned(), holder.to_owned());
        Box::pin(async move { owner?.adopt(&bucket, &holder, expires_at, units, lent) })
    }

    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move {
            owner?.give_back(&bucket, lease, units);
            Ok(())
        })
    }

    fn renew(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: Nanos,
        fenced: bool,
    ) -> BoxFuture<'_, Result<bool, TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move { Ok(owner?.renew(&bucket, lease, ttl, now, fenced)) })
    }
}
