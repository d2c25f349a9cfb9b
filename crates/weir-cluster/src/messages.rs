//! What a coordinator and an owner say to each other, whatever carries it: a lease request and
//! why it could not be answered. A leaf: the pool, the owner, the rates and every transport
//! use these, and they use nothing of the crate.

use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::time::Duration;

use weir::Nanos;

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
    /// What is asked: a lease, units for the holder's loan, or the loan renewed.
    pub ask: Ask,
    /// What the owner waits for before it grants.
    pub fence: Fence,
}

/// What a [`LeaseRequest`] asks of a bucket's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// One plain lease of one unit.
    Lease,
    /// The holder's loan of the bucket (one per bucket on this owner) grown by up to `units`
    /// and renewed, or started if it has none live.
    Borrow {
        /// Units wanted.
        units: NonZeroU64,
    },
    /// The holder's loan renewed, nothing added (`Full` if it has none live).
    RenewLoan,
}

impl Ask {
    /// Units for the holder's loan: renewed only if `units` is 0.
    pub fn borrow(units: u64) -> Ask {
        NonZeroU64::new(units).map_or(Ask::RenewLoan, |units| Ask::Borrow { units })
    }

    /// Whether it is about the holder's loan.
    pub fn is_loan(self) -> bool {
        !matches!(self, Ask::Lease)
    }

    /// The units it asks to add.
    pub fn units(self) -> u64 {
        match self {
            Ask::Lease => 1,
            Ask::Borrow { units } => units.get(),
            Ask::RenewLoan => 0,
        }
    }
}

/// What a bucket's owner waits for before it grants a [`LeaseRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The caller's policy must never exceed its ceiling (`on_unavailable = "closed"`): grant
    /// only after one `ttl` of tenure (see [`Tenure`](crate::tenure)) and while a majority is
    /// heard.
    Closed,
    /// Grant only once the owner has held the bucket this long, so that leases other nodes hold
    /// are re-registered first (zero: grant at once).
    Learning(Duration),
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
            ask: Ask::Lease,
            fence: Fence::Learning(Duration::ZERO),
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
