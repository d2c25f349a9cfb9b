//! Limits sent with requests: a descriptor's own `limit`, compared instead of its rule's.
//!
//! Its hits count in the rule's own window when the reference server would share it (the same
//! descriptor, the same unit), else in the domain's counter of that unit: a policy of its own
//! per domain and unit, `rls:<domain>:sent:<UNIT>`, a window that never refuses. Either is
//! decided wherever its buckets live, as every rule's is — by the key's owner in a cluster, in
//! Redis with `[redis] every_policy` — so a sent limit holds across the nodes, as the
//! reference server's shared Redis holds it, and is not each node's.

use std::sync::Arc;

use weir::Clock;
use weir::limiter::Quota;
use weir::policy::{Policy, PolicySet, Request};

use super::answer::{Code, CurrentLimit, Status, whole_seconds};
use super::config::{Limit, Unit};
use super::counts::Counts;
use super::settings::RlsSettings;
use crate::reserved::RLS_PREFIX;

/// Per domain: the counters of the descriptors that bring their own limit.
pub(super) struct Overrides<C: Clock + Clone> {
    /// The domain's counter of each unit, indexed by [`Unit`] in declaration order (`None`:
    /// the policy set does not hold it).
    pub(super) by_unit: [Option<Arc<Policy<C>>>; 7],
    /// The reference server's counters of the domain's sent limits, kept across reloads
    /// while the domain stays.
    pub(super) counts: Arc<Counts>,
}

impl<C: Clock + Clone> std::fmt::Debug for Overrides<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides").finish_non_exhaustive()
    }
}

impl<C: Clock + Clone> Overrides<C> {
    /// `domain`'s counters as bound in `policies`, its reference counters `counts`.
    pub(super) fn bound(domain: &str, policies: &PolicySet<C>, counts: Arc<Counts>) -> Self {
        Overrides {
            by_unit: Unit::ALL.map(|unit| policies.get(&counter_name(domain, unit))),
            counts,
        }
    }

    /// The domain's counter of `unit`.
    pub(super) fn counter(&self, unit: Unit) -> Option<&Policy<C>> {
        self.by_unit[unit as usize].as_deref()
    }

    /// The status of `sent` once counted: `counted` is what its counter has spent just after
    /// when it was decided elsewhere; else it is counted here now, in `counter`.
    pub(super) fn status(
        &self,
        sent: Sent<'_>,
        counted: Option<Option<Quota>>,
        counter: Option<&Policy<C>>,
        settings: &RlsSettings,
    ) -> Status {
        let quota = counted.unwrap_or_else(|| {
            counter.and_then(|policy| {
                policy
                    .try_acquire_with_quota(&Request::new(sent.key).cost(sent.hits))
                    .1
            })
        });
        let Sent {
            per_unit,
            unit,
            hits,
            ..
        } = sent;
        let quota = quota.unwrap_or(Quota {
            used: hits,
            remaining: 0,
            reset_after: unit.window(),
        });
        let limit = u64::from(per_unit);
        let over = quota.used > limit || (limit == 0 && hits > 0);
        let near = (limit as f64 * settings.near_limit_ratio).floor() as u64;
        self.counts.record(hits, quota.used, limit, near, false);
        Status {
            code: if over { Code::OverLimit } else { Code::Ok },
            current_limit: Some(CurrentLimit {
                requests_per_unit: per_unit,
                unit,
                name: None,
            }),
            limit_remaining: u32::try_from(limit.saturating_sub(quota.used)).unwrap_or(u32::MAX),
            reset_after: Some(whole_seconds(quota.reset_after)),
            quota_mode: false,
        }
    }
}

/// Whether a limit of `unit` sent for the descriptors of a rule limited by `limit` counts in
/// the rule's own window, as in the reference server, whose counter is the descriptor's and the
/// unit's window whatever the limit: a window of the same unit, which counts refused hits too
/// (a bucket keeps no count a limit could be compared with).
pub(super) fn shares_window(limit: &Limit, unit: Unit) -> bool {
    matches!(limit, Limit::Rate { unit: rule_unit, algorithm, .. }
        if *rule_unit == unit && algorithm.counts_refused())
}

/// The name of `domain`'s counter of sent limits of `unit`.
pub fn counter_name(domain: &str, unit: Unit) -> String {
    format!("{RLS_PREFIX}{domain}:sent:{}", unit.name())
}

/// A limit sent with one descriptor, and the hits it asks.
pub(super) struct Sent<'a> {
    pub(super) per_unit: u32,
    pub(super) unit: Unit,
    pub(super) key: &'a str,
    pub(super) hits: u64,
    /// The rule whose window counts them, if one does.
    pub(super) shared: Option<usize>,
}
