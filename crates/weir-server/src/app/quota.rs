//! Quota assignments to data planes (Envoys over RLQS): a share of a policy's bucket, decided
//! by the bucket's owner with the same `AssignmentBook` that lends rate shares between nodes.
//!
//! A data plane is one more holder. For a cluster-scoped policy in a cluster, its reports go
//! to the bucket's owner on the ring (this node or another, as a node's own reports do);
//! otherwise (one node, or a node-scoped policy) this node is the owner and answers from its
//! own book ([`QuotaBook`]), which every decision this node makes on that bucket sets aside
//! first.

use std::sync::atomic::Ordering;

use weir_cluster::assignment::{Assignment, RateReport, Whole};

use super::App;
use crate::decide::{Home, NoQuota, QuotaBook, shareable};

impl App {
    /// The book of shares lent to data planes, and its counters.
    pub fn quota(&self) -> &std::sync::Arc<QuotaBook> {
        self.decider.lent()
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
            Ok(_) => &self.quota().answered,
            Err(_) => &self.quota().unanswered,
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
        // Where the bucket lives decides who lends its shares: its owner, or this node.
        if self.decider.home_of(&policy) == Home::Owner {
            return self
                .decider
                .report_to_owner(holder, report)
                .await
                .map(|assignment| (assignment, whole));
        }
        let assignment = self.quota().report(&policy, holder, &report, whole);
        Ok((assignment, whole))
    }

    /// The rate of `policy`'s buckets, a second, if they may be shared out.
    pub fn rate_of(&self, policy: &str) -> Option<u64> {
        let policy = self.policies.get(policy)?;
        let whole = shareable(&policy)?;
        Some(1_000_000_000 / whole.interval.max(1))
    }

    /// Forgets what no data plane holds any more; what is left.
    pub(crate) fn sweep_quota(&self) -> usize {
        self.quota().sweep()
    }
}
