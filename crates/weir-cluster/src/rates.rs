//! Cluster-scoped rate limits: every bucket of such a policy is decided on one node.
//!
//! A token bucket, a leaky bucket, a strict limiter or a fixed window is one word of state per
//! key. Copying that word to every node would make each decision a consensus; splitting the rate
//! between nodes would refuse what a busy node needs while an idle one sits on its share. So,
//! as the shared pool of a concurrency policy does, each bucket has one owner on the ring
//! ([`bucket_of`] names it there), the owner decides with the policy's own limiter, and the
//! other nodes forward the request to it. A waiting request waits on the owner, in the
//! bucket's own line, so fair waiting holds across the cluster.
//!
//! When the ring moves a bucket — a node joins, or leaves gracefully — its previous owner
//! hands over what has been spent of it (a [`Handover`]), and the new owner
//! keeps whichever of its own state and the handed one is emptier. An owner that crashed hands
//! nothing over; a policy's `learning_period` then has the new owner hold each bucket to the
//! share of its capacity that its tenure allows, so that a crash over-admits nothing.
//!
//! This module is the contract between the two sides: what is asked (a [`RateAsk`], a
//! [`Handover`], a [`Report`]), what each is answered ([`RateDecision`], nothing,
//! [`ReportAnswer`]), and the owner's side as a trait ([`RateOwner`]) that the server
//! implements over its policies; [`crate::transport`]'s `Message` carries each between nodes.

use std::time::Duration;

use weir::limiter::Quota;

pub use crate::assignment::{Assignment, Lent, RateReport};

use crate::messages::BoxFuture;

/// A node's (or a data plane's) report of its demand for a bucket, to the bucket's owner:
/// answered with the share of its rate the holder may decide itself ([`crate::assignment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Who reports: a node, or a data plane.
    pub holder: String,
    /// What it reports.
    pub report: RateReport,
}

/// A request of a cluster-scoped rate policy, forwarded to its bucket's owner to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateAsk {
    /// The policy.
    pub policy: String,
    /// The bucket key.
    pub key: String,
    /// The request's kind, if it has one.
    pub kind: Option<String>,
    /// Its cost.
    pub cost: u64,
    /// The longest it may wait on the owner (zero: decide now).
    pub max_wait: Duration,
    /// Passed on by a node that no longer owns the bucket: not to be passed on again.
    pub relayed: bool,
}

/// A bucket as its previous owner left it when the ring moved it (see the module docs): the
/// new owner keeps whichever of its own state and this is emptier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// The policy.
    pub policy: String,
    /// The bucket key.
    pub key: String,
    /// The kind whose own buckets it is one of, if it is not one of the policy's default ones.
    pub kind: Option<String>,
    /// What it had left when it was handed over.
    pub quota: Quota,
    /// The shares of its rate its previous owner had lent, to count on the new owner until
    /// they run out ([`crate::assignment`]): its assignment book moves with it.
    pub lent: Vec<Lent>,
}

/// What a bucket's owner decided on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Admitted on the owner.
    Admitted {
        /// How long it waited there.
        waited: Duration,
        /// Admitted only because the policy monitors.
        would_throttle: bool,
        /// What the key has spent and left just after, if the owner could tell.
        quota: Option<Quota>,
    },
    /// Refused by the owner's bucket.
    Refused {
        /// When asking again could succeed, if known.
        retry_after: Option<Duration>,
        /// Why, in a sentence.
        reason: String,
        /// What the key has spent and left just after, if the owner could tell.
        quota: Option<Quota>,
    },
}

impl Decided {
    /// What the key has spent and left just after the decision, if the owner could tell.
    pub fn quota(&self) -> Option<Quota> {
        match self {
            Decided::Admitted { quota, .. } | Decided::Refused { quota, .. } => *quota,
        }
    }
}

/// An owner's answer to a forwarded [`RateAsk`]: its decision, or why it could not decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateDecision {
    /// The owner decided.
    Decided(Decided),
    /// The callee's ring does not name it the bucket's owner (the rings differ for a moment
    /// while membership changes).
    NotOwner,
    /// The callee has no such cluster-scoped policy (a config change rolling through).
    UnknownPolicy,
}

/// An owner's answer to a [`Report`]: the holder's share, or why it could not assign one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportAnswer {
    /// The share the holder may decide itself until its TTL ([`Assignment::none`] when the
    /// policy's buckets are not shared out).
    Assigned(Assignment),
    /// The callee's ring does not name it the bucket's owner.
    NotOwner,
    /// The callee has no such cluster-scoped policy.
    UnknownPolicy,
}

/// The owner's side: decides forwarded requests with its own policies.
pub trait RateOwner: Send + Sync + 'static {
    /// Decides `ask`, waiting up to its `max_wait` if its policy waits.
    fn decide(&self, ask: RateAsk) -> BoxFuture<'_, RateDecision>;

    /// Takes a bucket's state on from its previous owner (see [`Handover`]).
    fn take_on(&self, handover: Handover);

    /// Answers a holder's report on a bucket this node owns.
    fn report(&self, report: Report) -> ReportAnswer;

    /// A handover for every cluster-scoped bucket this node holds that is not whole, or that it
    /// lends shares of, and whose ring name ([`bucket_of`]) `moving` picks. A walk over every key: for membership
    /// changes, never per request.
    fn handovers(&self, moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover>;
}

/// The name of a cluster-scoped rate bucket on the ring. Apart from the shared pools' buckets
/// ([`shared_bucket_of`](crate::admission::shared_bucket_of)): a rate policy's bucket `k` and a concurrency policy's bucket `k` are two
/// buckets, which may have two owners.
pub fn bucket_of(policy: &str, key: &str) -> String {
    format!("{RATE_BUCKET}{policy}\u{0}{key}")
}

/// What every [`bucket_of`] name starts with.
const RATE_BUCKET: &str = "rate\u{0}";

/// The policy and key a [`bucket_of`] name was made of; `None` for any other name.
pub fn policy_and_key(bucket: &str) -> Option<(&str, &str)> {
    bucket.strip_prefix(RATE_BUCKET)?.split_once('\u{0}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buckets_name_gives_back_its_policy_and_key() {
        assert_eq!(
            policy_and_key(&bucket_of("steady", "k\u{0}x")),
            Some(("steady", "k\u{0}x"))
        );
        assert_eq!(policy_and_key("shared\u{0}pool\u{0}k"), None);
    }
}
