//! Limits sent with requests: a descriptor's own `limit`, compared instead of its rule's, its
//! hits counted in the rule's own window when the reference server would share it (the same
//! descriptor, the same unit), else in a counter of the domain and unit.

use std::sync::OnceLock;

use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::limiter::Quota;
use weir::limiter::fixed_window;
use weir::policy::{Policy, Request};
use weir::{Clock, WindowConfig};

use super::answer::{Code, CurrentLimit, Status, whole_seconds};
use super::config::Unit;
use super::counts::Counts;
use super::settings::RlsSettings;

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

/// A limit sent with one descriptor, and the hits it asks.
pub(super) struct Sent<'a> {
    pub(super) per_unit: u32,
    pub(super) unit: Unit,
    pub(super) key: &'a str,
    pub(super) hits: u64,
}

impl<C: Clock + Clone> Overrides<C> {
    /// Counts `hits` against a limit sent with the request.
    /// `shared` is the policy of the rule whose window counts them, if one does.
    pub(super) fn count(
        &self,
        sent: Sent<'_>,
        shared: Option<&Policy<C>>,
        settings: &RlsSettings,
        clock: &C,
    ) -> Status {
        let Sent {
            per_unit,
            unit,
            key,
            hits,
        } = sent;
        let quota = match shared {
            // The rule's window counts the hits whatever its own limit says of them.
            Some(policy) => {
                policy
                    .try_acquire_with_quota(&Request::new(key).cost(hits))
                    .1
            }
            None => self.count_apart(unit, key, hits, settings.max_keys, clock),
        };
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

    /// Counts `hits` for a sent limit no rule's counter holds: in the domain's counter of
    /// `unit`, which never refuses.
    fn count_apart(
        &self,
        unit: Unit,
        key: &str,
        hits: u64,
        max_keys: usize,
        clock: &C,
    ) -> Option<Quota> {
        let counter = self.by_unit[unit as usize].get_or_init(|| {
            let shape = Shape::try_from(WindowConfig {
                count: fixed_window::COUNT,
                limit: u64::from(u32::MAX),
                window: unit.window(),
            })
            .expect("a whole unit is a valid window");
            KeyedLimiter::new(shape, max_keys, Overflow::Shared, clock.clone())
        });
        // The override's limit is compared by the caller; past the key cap the quota is the
        // shared overflow cell's.
        counter.try_acquire_with_quota(key, hits).1
    }
}
