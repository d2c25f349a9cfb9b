//! Who a policy is holding back: rows of the "who is throttled" table and the periodic
//! report, from the bounded table in [`throttled`](super::throttled).

use std::time::Duration;

use super::Request;
use super::state::PolicyState;
use super::stats::{Allowance, ThrottleReport};
use super::throttled::Changes;
use super::{Policy, lock};
use super::{PolicyConfig, ReportBaseline};
use crate::clock::Clock;
use crate::keyed::{KeyedLimiter, Shape};

/// A row of "who is throttled".
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ThrottledRow {
    /// The policy.
    pub policy: String,
    /// The key held back.
    pub key: String,
    /// The kind of its latest request (empty: of no kind, as the API shows it).
    pub kind: String,
    /// The limit of its bucket (per second, or permits); `None` if unlimited.
    pub qps_limit: Option<f64>,
    /// Requests per second seen for it.
    pub current_qps: f64,
    /// Of those, requests per second refused or made to wait; `None` where not measured (a key
    /// an adaptive policy limits: its limiter refuses without counting per key).
    pub throttled_qps: Option<f64>,
    /// Permits it holds now (concurrency).
    pub in_flight: u64,
    /// Its requests waiting now.
    pub waiters: u64,
}

impl<C: Clock + Clone> Policy<C> {
    /// Notes a throttled key in the "who is throttled" table and keeps the cell marks in step.
    pub(super) fn record_throttled(
        &self,
        state: &PolicyState<C>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
    ) {
        let changes = state
            .throttled
            .throttled(request.key, request.kind, self.clock.now());
        if changes.added {
            limiter.set_tracked(request.key, true);
        }
        self.untrack(state, changes);
    }

    pub(super) fn untrack(&self, state: &PolicyState<C>, changes: Changes) {
        for (key, kind) in changes.removed {
            if let Some(Some(limiter)) = state.buckets(kind.as_deref()) {
                limiter.set_tracked(&key, false);
            }
        }
    }

    /// The keys this policy is holding back, most requests per second first, at most `limit`.
    pub fn throttled_keys(&self, limit: usize) -> Vec<ThrottledRow> {
        let state = self.state.load();
        if let Some(adaptive) = state.adaptive() {
            let mut rows: Vec<ThrottledRow> = adaptive
                .throttled()
                .into_iter()
                .map(|t| ThrottledRow {
                    policy: self.name.clone(),
                    key: t.key,
                    kind: t.rpc,
                    qps_limit: Some(t.qps_limit),
                    current_qps: t.current_qps,
                    throttled_qps: None,
                    in_flight: 0,
                    waiters: 0,
                })
                .collect();
            rows.sort_by(|a, b| b.current_qps.total_cmp(&a.current_qps));
            rows.truncate(limit);
            return rows;
        }
        let (keys, changes) = state.throttled.rows(self.clock.now(), limit);
        self.untrack(&state, changes);
        keys.into_iter()
            .map(|k| {
                let limiter = state.buckets(k.kind.as_deref()).flatten();
                let (in_flight, waiters) =
                    limiter.and_then(|l| l.occupancy(&k.key)).unwrap_or((0, 0));
                ThrottledRow {
                    policy: self.name.clone(),
                    qps_limit: limiter.map(|l| PolicyConfig::limit_of(&l.shape())),
                    key: k.key,
                    kind: k.kind.unwrap_or_default(),
                    current_qps: k.current_qps,
                    throttled_qps: Some(k.throttled_qps),
                    in_flight,
                    waiters,
                }
            })
            .collect()
    }

    /// What each of the policy's default buckets allows (`None`: limits adapt per key).
    fn allowance(&self) -> Option<Allowance> {
        let state = self.state.load();
        let shape = state.default_buckets()?.shape();
        Some(match shape {
            Shape::Concurrency { limit } => Allowance::InFlight(limit),
            _ => Allowance::PerSecond(PolicyConfig::limit_of(&shape)),
        })
    }

    /// "Policy P was throttled in the last N s", if anything was throttled since the last call
    /// (or since the policy was created). Call it periodically.
    pub fn report(&self) -> Option<ThrottleReport> {
        let now = self.clock.now();
        let current = self.stats();
        let mut baseline = lock(&self.reconfiguring);
        let report = ThrottleReport::between(
            &self.name,
            Duration::from_nanos(now.saturating_sub(baseline.at)),
            &baseline.snapshot,
            &current,
            self.allowance(),
        );
        *baseline = ReportBaseline {
            at: now,
            snapshot: current,
        };
        report
    }
}
