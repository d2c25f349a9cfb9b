//! Quota assignments to data planes (Envoys over RLQS): a share of a policy's bucket, decided
//! by the bucket's owner with the same [`AssignmentBook`] that lends rate shares between
//! nodes.
//!
//! A data plane is one more holder. For a cluster-scoped policy in a cluster, its reports go
//! to the bucket's owner on the ring (this node or another, as a node's own reports do);
//! otherwise (one node, or a node-scoped policy) this node is the owner and answers from its
//! own book, setting aside what it lends out of its own bucket before every decision it
//! makes on that bucket itself.

use std::sync::atomic::{AtomicU64, Ordering};

use weir::policy::{Policy, Scope};
use weir::{Clock, SystemClock};
use weir_cluster::assignment::{Assignment, AssignmentBook, RateReport, Whole};
use weir_cluster::rates::{RateDecision, RateRequest, bucket_of};

use super::App;
use super::cluster_rates::shareable;

/// Why a data plane's report got no assignment.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoQuota {
    /// No such policy.
    #[error("no policy `{0}`")]
    UnknownPolicy(String),
    /// The policy's bucket cannot be shared out as a rate.
    #[error(
        "policy `{0}` cannot be assigned: only a token bucket or strict limiter that refills at 20 a second or more, does not wait, and has `assignments` on can be"
    )]
    NotShareable(String),
    /// The bucket's owner did not answer.
    #[error("the owner of the bucket did not answer: {0}")]
    OwnerUnreachable(String),
}

/// The book of this node's own buckets lent to data planes, and what it answered.
#[derive(Debug)]
pub struct QuotaBook {
    book: AssignmentBook,
    /// Reports answered with an assignment (from here or the owner).
    pub answered: AtomicU64,
    /// Reports not answered ([`NoQuota`]).
    pub unanswered: AtomicU64,
    /// Bucket ids reported that no rule maps (counted, and logged once a minute: a stream
    /// can name any number of them).
    pub unmapped: crate::log_gate::LogGate,
}

impl Default for QuotaBook {
    fn default() -> Self {
        QuotaBook {
            book: AssignmentBook::new(100_000),
            answered: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            unmapped: crate::log_gate::LogGate::new(),
        }
    }
}

impl QuotaBook {
    /// Shares of this node's own buckets lent to data planes now.
    pub fn shares_lent(&self) -> u64 {
        self.book.lent(SystemClock::new().now()).values().sum()
    }
}

impl App {
    /// The book of shares lent to data planes, and its counters.
    pub fn quota(&self) -> &QuotaBook {
        &self.quota
    }

    /// Answers data plane `holder`'s report on a bucket: its assignment, and the whole bucket
    /// it is a share of.
    pub async fn assign_quota(
        &self,
        holder: &str,
        report: RateReport,
    ) -> Result<(Assignment, Whole), NoQuota> {
        let answered = self.answer_quota(holder, report).await;
        let counter = match answered {
            Ok(_) => &self.quota.answered,
            Err(_) => &self.quota.unanswered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answered
    }

    async fn answer_quota(
        &self,
        holder: &str,
        report: RateReport,
    ) -> Result<(Assignment, Whole), NoQuota> {
        let Some(policy) = self.policies.get(&report.policy) else {
            return Err(NoQuota::UnknownPolicy(report.policy));
        };
        let Some(whole) = shareable(&policy) else {
            return Err(NoQuota::NotShareable(report.policy));
        };
        if let Some(cluster) = self.cluster.as_ref().filter(|_| in_cluster(&policy)) {
            let request = RateRequest::Report {
                holder: holder.to_owned(),
                report,
            };
            let decided = match cluster.rate_owner(request.policy(), request.key()) {
                Some(owner) => cluster.forward(&owner, request).await,
                None => Ok(self.decide_for_other(request).await),
            };
            return match decided {
                Ok(RateDecision::Assigned(assignment)) => Ok((assignment, whole)),
                Ok(other) => Err(NoQuota::OwnerUnreachable(format!("answered {other:?}"))),
                Err(why) => Err(NoQuota::OwnerUnreachable(why)),
            };
        }
        let now = SystemClock::new().now();
        let bucket = bucket_of(&report.policy, &report.key);
        let (mut assignment, aside) = self.quota.book.report(holder, &bucket, &report, whole, now);
        assignment.tokens = policy.set_aside(
            None,
            &report.key,
            (aside.before, aside.elapsed, aside.after),
        );
        Ok((assignment, whole))
    }

    /// Before this node decides `cost` of `policy`'s bucket `key` itself: sets aside of it
    /// what is lent to data planes from this node's own book, if any. One atomic load when
    /// nothing is lent.
    pub(super) fn set_aside_quota(
        &self,
        policy: &Policy<SystemClock>,
        kind: Option<&str>,
        key: &str,
        cost: u64,
    ) {
        if !self.quota.book.lends_any() || kind.is_some() {
            return;
        }
        if self.cluster.is_some() && in_cluster(policy) {
            // Lent from the owner's cluster book: set aside where it is decided.
            return;
        }
        let now = SystemClock::new().now();
        if let Some(aside) = self
            .quota
            .book
            .decided_here(&bucket_of(policy.name(), key), cost, now)
        {
            policy.set_aside(None, key, (aside.before, aside.elapsed, aside.after));
        }
    }

    /// The rate of `policy`'s buckets, a second, if they may be shared out.
    pub fn rate_of(&self, policy: &str) -> Option<u64> {
        let policy = self.policies.get(policy)?;
        let whole = shareable(&policy)?;
        Some(1_000_000_000 / whole.interval.max(1))
    }

    /// Forgets what no data plane holds any more; what is left.
    pub(crate) fn sweep_quota(&self) -> usize {
        self.quota.book.sweep(SystemClock::new().now())
    }
}

fn in_cluster(policy: &Policy<SystemClock>) -> bool {
    policy.with_config(|config| config.scope == Scope::Cluster)
}
