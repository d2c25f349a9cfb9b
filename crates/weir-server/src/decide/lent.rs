//! Shares of this node's own buckets lent to data planes (Envoys over RLQS), in the same
//! [`AssignmentBook`] that lends rate shares between nodes; what is lent is set aside of a
//! bucket before this node decides on it.
//!
//! A cluster-scoped policy's shares are lent from its owner's book instead (`for_others.rs`):
//! a data plane is one more holder, its reports going to the bucket's owner on the ring as a
//! node's own reports do ([`Decider::assign_quota`]).

use std::sync::atomic::{AtomicU64, Ordering};

use weir::policy::{Policy, Scope};
use weir::{Clock, SystemClock};
use weir_cluster::assignment::{Assignment, AssignmentBook, RateReport, Whole};
use weir_cluster::rates::bucket_of;

use super::{Decider, Home, owner::shareable};

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

    /// Answers data plane `holder`'s report on a bucket of `policy` this node owns: its
    /// assignment, what it lends set aside of the bucket.
    pub fn report(
        &self,
        policy: &Policy<SystemClock>,
        holder: &str,
        report: &RateReport,
        whole: Whole,
    ) -> Assignment {
        let now = SystemClock::new().now();
        let bucket = bucket_of(&report.policy, &report.key);
        let (mut assignment, aside) = self.book.report(holder, &bucket, report, whole, now);
        assignment.tokens = policy.set_aside(
            None,
            &report.key,
            (aside.before, aside.elapsed, aside.after),
        );
        assignment
    }

    /// Before this node decides `cost` of `policy`'s bucket `key` itself: sets aside of it
    /// what is lent to data planes from this book, if any. One atomic load when nothing is
    /// lent.
    pub(super) fn set_aside(
        &self,
        policy: &Policy<SystemClock>,
        kind: Option<&str>,
        key: &str,
        cost: u64,
        in_cluster_mode: bool,
    ) {
        if !self.book.lends_any() || kind.is_some() {
            return;
        }
        if in_cluster_mode && policy.with_config(|config| config.scope == Scope::Cluster) {
            // Lent from the owner's cluster book: set aside where it is decided.
            return;
        }
        let now = SystemClock::new().now();
        if let Some(aside) = self
            .book
            .decided_here(&bucket_of(policy.name(), key), cost, now)
        {
            policy.set_aside(None, key, (aside.before, aside.elapsed, aside.after));
        }
    }

    /// Forgets what no data plane holds any more; what is left.
    pub fn sweep(&self) -> usize {
        self.book.sweep(SystemClock::new().now())
    }
}

impl Decider {
    /// Answers data plane `holder`'s report on a bucket: its assignment, and the whole bucket
    /// it is a share of, from the book of wherever the bucket lives (its owner, or this node).
    pub async fn assign_quota(
        &self,
        holder: &str,
        report: RateReport,
    ) -> Result<(Assignment, Whole), NoQuota> {
        let answered = self.answer_quota(holder, report).await;
        let counter = match answered {
            Ok(_) => &self.lent.answered,
            Err(_) => &self.lent.unanswered,
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
        if self.home_of(&policy) == Home::Owner {
            return self
                .report_to_owner(holder, report)
                .await
                .map(|assignment| (assignment, whole));
        }
        let assignment = self.lent.report(&policy, holder, &report, whole);
        Ok((assignment, whole))
    }

    /// The rate of `policy`'s buckets, a second, if they may be shared out.
    pub fn rate_of(&self, policy: &str) -> Option<u64> {
        let policy = self.policies.get(policy)?;
        let whole = shareable(&policy)?;
        Some(1_000_000_000 / whole.interval.max(1))
    }
}
