//! Rate assignments in cluster mode (see [`weir_cluster::assignment`]): a node that asks a
//! cluster-scoped rate bucket's owner often holds a share of the bucket's rate and decides
//! within it, and reports its demand every
//! [`REPORT_EVERY`](weir_cluster::assignment::REPORT_EVERY); as an owner, a node answers the
//! reports and sets aside what it lent out of its own bucket.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use weir::Clock;
use weir_cluster::assignment::{AssignmentBook, HeldRates, Local, RateReport, SetAside, Whole};
use weir_cluster::rates::{Assignment, Lent, Report, ReportAnswer, bucket_of, policy_and_key};
use weir_cluster::transport::TransportExt;

use super::{ClusterCounters, ClusterMode, SystemClock};

/// A node's assignments: those it lent as an owner, those it holds, and what they did.
#[derive(Debug)]
pub(super) struct Assignments {
    book: AssignmentBook,
    held: Mutex<HeldRates>,
    admitted: AtomicU64,
    refused: AtomicU64,
    reports: AtomicU64,
    reports_failed: AtomicU64,
}

impl Default for Assignments {
    fn default() -> Self {
        Assignments {
            book: AssignmentBook::new(100_000),
            held: Mutex::new(HeldRates::new()),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reports_failed: AtomicU64::new(0),
        }
    }
}

impl Assignments {
    fn held(&self) -> std::sync::MutexGuard<'_, HeldRates> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClusterMode {
    /// Decides a request of `cost` on `policy`'s bucket `key` within the assignment this node
    /// holds of it, if any, from its owner now. `Forward` when it holds none (or this node is
    /// the owner): a forwarded request is counted as this node's demand for the bucket.
    pub fn decide_assigned(&self, policy: &str, key: &str, cost: u64) -> Local {
        let bucket = bucket_of(policy, key);
        let Some(owner) = self.ring.owner_of(&bucket).filter(|o| *o != self.node_id) else {
            return Local::Forward;
        };
        let now = SystemClock::new().now();
        let mut held = self.assignments.held();
        let local = held.take(policy, key, &owner, cost, now);
        match local {
            Local::Admitted => self.assignments.admitted.fetch_add(1, Ordering::Relaxed),
            Local::Refused { .. } => self.assignments.refused.fetch_add(1, Ordering::Relaxed),
            Local::Forward => {
                held.forwarded(policy, key, &owner, cost);
                0
            }
        };
        local
    }

    /// Whether this node lends shares of any bucket now: one atomic load, checked before
    /// anything else on an owner's decision.
    pub fn lends_rates(&self) -> bool {
        self.assignments.book.lends_any()
    }

    /// As the owner of `policy`'s bucket `key`, before deciding `cost` of it here: counts it,
    /// and what must be set aside of the bucket first for what is lent of it, if any.
    pub fn lent_before_deciding(&self, policy: &str, key: &str, cost: u64) -> Option<SetAside> {
        self.assignments
            .book
            .decided_here(&bucket_of(policy, key), cost, SystemClock::new().now())
    }

    /// Answers `holder`'s report on a bucket this node owns, whose whole shape is `whole`:
    /// the assignment, and what to set aside of the bucket before it is answered.
    pub fn answer_report(
        &self,
        holder: &str,
        report: &RateReport,
        whole: Whole,
    ) -> (Assignment, SetAside) {
        let bucket = bucket_of(&report.policy, &report.key);
        self.assignments
            .book
            .report(holder, &bucket, report, whole, SystemClock::new().now())
    }

    /// The shares of `policy`'s bucket `key` this node lent, for its handover to the next owner.
    pub fn lent_in(&self, policy: &str, key: &str) -> Vec<Lent> {
        self.assignments
            .book
            .lent_in(&bucket_of(policy, key), SystemClock::new().now())
    }

    /// The buckets this node lends shares of now, as (policy, key): each moves with its book
    /// when the ring moves it, whole or not.
    pub fn lent_buckets(&self) -> Vec<(String, String)> {
        self.assignments
            .book
            .lent_buckets(SystemClock::new().now())
            .iter()
            .filter_map(|bucket| policy_and_key(bucket))
            .map(|(policy, key)| (policy.to_owned(), key.to_owned()))
            .collect()
    }

    /// Takes on the shares of `policy`'s bucket `key` its previous owner lent; what to set
    /// aside of the bucket at once, if any.
    pub fn take_on_lent(&self, policy: &str, key: &str, lent: &[Lent]) -> Option<SetAside> {
        self.assignments.book.take_on(
            &bucket_of(policy, key),
            lent,
            &self.node_id,
            SystemClock::new().now(),
        )
    }

    /// Sends the reports owed now, one batch per owner, and takes on the answers; `whole_of`
    /// gives a policy's whole bucket shape if it may still be assigned (else its assignments
    /// end). Then forgets the buckets lent of that no longer are.
    pub async fn report_demand(&self, whole_of: impl Fn(&str) -> Option<Whole>) {
        let asked_at = SystemClock::new().now();
        let reports = self.assignments.held().reports(asked_at);
        let mut by_owner: std::collections::HashMap<String, Vec<RateReport>> =
            std::collections::HashMap::new();
        for (owner, mut report) in reports {
            // A bucket the ring has moved since is reported to its owner now, running none
            // (a share from its previous owner is not decided on: see `decide_assigned`); the
            // new owner took the previous one's book over and counts that share until this
            // says it is not run.
            let now_owner = self.ring.owner_of(&bucket_of(&report.policy, &report.key));
            let owner = match now_owner {
                Some(now_owner) if now_owner == self.node_id => continue,
                Some(now_owner) if now_owner != owner => {
                    report.running = 0;
                    now_owner
                }
                _ => owner,
            };
            by_owner.entry(owner).or_default().push(report);
        }
        let calls = by_owner.into_iter().map(|(owner, reports)| async move {
            let requests = reports
                .iter()
                .map(|report| Report {
                    holder: self.node_id.clone(),
                    report: report.clone(),
                })
                .collect();
            let answers = self.transport.report(&owner, requests).await;
            (owner, reports, answers)
        });
        for (owner, reports, answers) in futures_util::future::join_all(calls).await {
            let now = SystemClock::new().now();
            let mut held = self.assignments.held();
            for (report, answer) in reports.into_iter().zip(answers) {
                self.assignments.reports.fetch_add(1, Ordering::Relaxed);
                let assignment = match answer {
                    Ok(ReportAnswer::Assigned(assignment)) => assignment,
                    // Not answered: the assignment held, if any, runs out at its TTL.
                    Err(_) => {
                        self.assignments
                            .reports_failed
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // Another answer (the owner moved, or does not assign): none.
                    Ok(_) => Assignment::none(),
                };
                let (assignment, whole) = match whole_of(&report.policy) {
                    Some(whole) => (assignment, whole),
                    // The policy is gone, or no longer assigned: what is held of it ends.
                    None => (
                        Assignment::none(),
                        Whole {
                            interval: 1,
                            capacity: 0,
                        },
                    ),
                };
                held.assigned(
                    (&owner, &report.policy, &report.key),
                    assignment,
                    whole,
                    (asked_at, now),
                );
            }
        }
        self.assignments.book.sweep(SystemClock::new().now());
    }

    /// Adds what assignments did on this node to `counters`.
    pub(super) fn count_assignments(&self, counters: &mut ClusterCounters) {
        let now = SystemClock::new().now();
        let a = &self.assignments;
        counters.assigned_admitted = a.admitted.load(Ordering::Relaxed);
        counters.assigned_refused = a.refused.load(Ordering::Relaxed);
        counters.assignment_reports = a.reports.load(Ordering::Relaxed);
        counters.assignment_reports_failed = a.reports_failed.load(Ordering::Relaxed);
        counters.assignments_held = a.held().held() as u64;
        counters.shares_lent = a.book.lent(now).values().sum();
    }
}
