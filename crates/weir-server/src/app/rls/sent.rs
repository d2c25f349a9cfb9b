//! Limits sent with requests: a descriptor's own `limit`, compared instead of its rule's, its
//! hits counted in the rule's own window when the reference server would share it (the same
//! descriptor, the same unit), else in a counter of the domain and unit.

use std::sync::OnceLock;

use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::limiter::Quota;
use weir::limiter::fixed_window;
use weir::policy::{Request, Scope};
use weir::{Clock, WindowConfig};

use super::answer::{Code, CurrentLimit, Status};
use super::counts::Counts;
use super::decision::{Rls, whole_seconds};
use crate::front_door::rls::config::{Limit, Unit};

/// Per domain: a hit counter per unit for the descriptors that bring their own limit.
pub(super) struct Overrides<C: Clock> {
    /// Indexed by [`Unit`] in declaration order.
    pub(super) by_unit: [OnceLock<KeyedLimiter<C>>; 7],
    /// The reference server's counters of the domain's sent limits.
    pub(super) counts: Counts,
}

impl<C: Clock> std::fmt::Debug for Overrides<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides").finish_non_exhaustive()
    }
}

impl<C: Clock + Clone> Rls<C> {
    /// Whether a limit of `unit` sent for rule `rule`'s descriptors counts in the rule's own
    /// counter, as in the reference server, whose counter is the descriptor's and the unit's
    /// window whatever the limit: a window of the same unit counting on this node.
    pub(super) fn shares_counter(&self, rule: usize, unit: Unit) -> bool {
        let Limit::Rate {
            unit: rule_unit,
            algorithm,
            ..
        } = &self.tree.rules()[rule].limit
        else {
            return false;
        };
        // A cluster-wide rule's count is its owner's, not this node's; a limiter other than a
        // window keeps no count a limit could be compared with.
        *rule_unit == unit
            && algorithm.counts_refused()
            && self.bound[rule]
                .policy
                .as_ref()
                .is_some_and(|p| p.with_config(|c| c.scope == Scope::Node))
    }

    /// Counts `hits` against a limit sent with the request.
    pub(super) fn count_override(
        &self,
        domain: &str,
        per_unit: u32,
        unit: Unit,
        key: &str,
        shared: Option<usize>,
        hits: u64,
    ) -> Status {
        let Some(overrides) = self.overrides.get(domain) else {
            return Status::unlimited(0);
        };
        let shared = shared.and_then(|rule| self.bound[rule].policy.as_ref());
        let quota = match shared {
            // The rule's window counts the hits whatever its own limit says of them.
            Some(policy) => {
                policy
                    .try_acquire_with_quota(&Request::new(key).cost(hits))
                    .1
            }
            None => self.count_apart(overrides, unit, key, hits),
        };
        let quota = quota.unwrap_or(Quota {
            used: hits,
            remaining: 0,
            reset_after: unit.window(),
        });
        let limit = u64::from(per_unit);
        let over = quota.used > limit || (limit == 0 && hits > 0);
        let near = (limit as f64 * self.settings.near_limit_ratio).floor() as u64;
        overrides
            .counts
            .record(hits, quota.used, limit, near, false);
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

    /// Counts `hits` for a sent limit no rule's counter holds: in the domain's counter of
    /// `unit`, which never refuses.
    fn count_apart(
        &self,
        overrides: &Overrides<C>,
        unit: Unit,
        key: &str,
        hits: u64,
    ) -> Option<Quota> {
        let counter = overrides.by_unit[unit as usize].get_or_init(|| {
            let shape = Shape::try_from(WindowConfig {
                count: fixed_window::COUNT,
                limit: u64::from(u32::MAX),
                window: unit.window(),
            })
            .expect("a whole unit is a valid window");
            KeyedLimiter::new(
                shape,
                self.settings.max_keys,
                Overflow::Shared,
                self.clock.clone(),
            )
        });
        // The override's limit is compared by the caller; past the key cap the quota is the
        // shared overflow cell's.
        counter.try_acquire_with_quota(key, hits).1
    }
}
