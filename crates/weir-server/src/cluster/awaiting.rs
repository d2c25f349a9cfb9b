//! Rate buckets handed to this node for a policy it does not run yet, kept until it does.
//!
//! A node that joins owns buckets in the other members' rings as soon as gossip names it, and
//! they hand those buckets over at once; but a policy made over the API reaches it through the
//! policy log, which it may still be catching up on. A handover taken on only if its policy
//! is already here loses what the bucket had spent — a day's quota whole again on the new
//! owner. So a handover that comes before its policy waits here, and is taken on the moment
//! the policy starts (`Decider::take_on_awaiting`), before it decides anything.
//!
//! Bounded: at most [`MAX_AWAITING`] buckets, each for at most [`AWAIT_AT_MOST`]. A log catches
//! up in seconds; what waits longer is for a policy this node will not run (deleted meanwhile,
//! or this member's config differs), and is dropped, counted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weir_cluster::rates::Handover;

/// How long a handover waits for its policy at most.
pub const AWAIT_AT_MOST: Duration = Duration::from_secs(600);

/// The most handovers kept waiting at once (a join hands over a share of every member's
/// buckets: far more than this means something other than a join).
pub const MAX_AWAITING: usize = 200_000;

/// Handovers waiting for their policy, by policy name.
#[derive(Debug)]
pub struct Awaiting {
    by_policy: Mutex<HashMap<String, Vec<(Instant, Handover)>>>,
    /// The most kept at once.
    cap: usize,
}

impl Default for Awaiting {
    fn default() -> Self {
        Awaiting::with_cap(MAX_AWAITING)
    }
}

/// What keeping one handover did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// It waits for its policy.
    Waiting,
    /// Dropped: as many wait already as may.
    Full,
}

impl Awaiting {
    /// Keeping at most `cap` handovers at once.
    pub fn with_cap(cap: usize) -> Self {
        Awaiting {
            by_policy: Mutex::default(),
            cap,
        }
    }

    /// Keeps `handover` until its policy starts here, or [`AWAIT_AT_MOST`] from `now`. What
    /// waited past that is dropped first.
    pub fn keep(&self, handover: Handover, now: Instant) -> Kept {
        let mut by_policy = self.by_policy.lock().unwrap_or_else(|p| p.into_inner());
        let mut waiting: usize = by_policy.values().map(Vec::len).sum();
        if waiting >= self.cap {
            expire(&mut by_policy, now);
            waiting = by_policy.values().map(Vec::len).sum();
            if waiting >= self.cap {
                return Kept::Full;
            }
        }
        by_policy
            .entry(handover.policy.clone())
            .or_default()
            .push((now, handover));
        Kept::Waiting
    }

    /// The handovers waiting for a policy `runs` says this node now runs, taken out in the
    /// order they came; those waiting past [`AWAIT_AT_MOST`] at `now` are dropped.
    pub fn take_for(&self, runs: impl Fn(&str) -> bool, now: Instant) -> Vec<Handover> {
        let mut by_policy = self.by_policy.lock().unwrap_or_else(|p| p.into_inner());
        if by_policy.is_empty() {
            return Vec::new();
        }
        expire(&mut by_policy, now);
        let ready: Vec<String> = by_policy
            .keys()
            .filter(|name| runs(name))
            .cloned()
            .collect();
        ready
            .into_iter()
            .filter_map(|name| by_policy.remove(&name))
            .flatten()
            .map(|(_, handover)| handover)
            .collect()
    }

    /// How many handovers wait.
    pub fn len(&self) -> usize {
        let by_policy = self.by_policy.lock().unwrap_or_else(|p| p.into_inner());
        by_policy.values().map(Vec::len).sum()
    }
}

/// Drops what has waited past [`AWAIT_AT_MOST`] at `now`.
fn expire(by_policy: &mut HashMap<String, Vec<(Instant, Handover)>>, now: Instant) {
    by_policy.retain(|_, handovers| {
        handovers.retain(|(since, _)| now.saturating_duration_since(*since) < AWAIT_AT_MOST);
        !handovers.is_empty()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir::limiter::Quota;

    fn handover(policy: &str, key: &str) -> Handover {
        Handover {
            policy: policy.to_owned(),
            key: key.to_owned(),
            kind: None,
            quota: Quota {
                used: 3,
                remaining: 0,
                reset_after: Duration::from_secs(300),
            },
            lent: Vec::new(),
        }
    }

    #[test]
    fn a_handover_waits_until_its_policy_runs_and_is_taken_once() {
        let awaiting = Awaiting::default();
        let t0 = Instant::now();
        assert_eq!(awaiting.keep(handover("api", "k1"), t0), Kept::Waiting);
        assert_eq!(awaiting.keep(handover("api", "k2"), t0), Kept::Waiting);
        assert_eq!(awaiting.keep(handover("other", "k1"), t0), Kept::Waiting);
        assert!(awaiting.take_for(|_| false, t0).is_empty());
        let taken = awaiting.take_for(|name| name == "api", t0 + Duration::from_secs(1));
        let keys: Vec<&str> = taken.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(keys, ["k1", "k2"]);
        assert!(awaiting.take_for(|name| name == "api", t0).is_empty());
        assert_eq!(awaiting.len(), 1);
    }

    #[test]
    fn a_handover_waits_at_most_its_time() {
        let awaiting = Awaiting::default();
        let t0 = Instant::now();
        awaiting.keep(handover("api", "k1"), t0);
        let late = t0 + AWAIT_AT_MOST;
        assert!(awaiting.take_for(|_| true, late).is_empty());
        assert_eq!(awaiting.len(), 0);
    }

    #[test]
    fn past_its_cap_a_handover_is_dropped_unless_older_ones_expired() {
        let awaiting = Awaiting::with_cap(2);
        let t0 = Instant::now();
        awaiting.keep(handover("api", "k1"), t0);
        awaiting.keep(handover("api", "k2"), t0 + Duration::from_secs(1));
        assert_eq!(awaiting.keep(handover("api", "k3"), t0), Kept::Full);
        // k1 has waited its time by then: it makes room.
        assert_eq!(
            awaiting.keep(handover("api", "k4"), t0 + AWAIT_AT_MOST),
            Kept::Waiting
        );
        let keys: Vec<String> = awaiting
            .take_for(|_| true, t0 + AWAIT_AT_MOST)
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(keys, ["k2", "k4"]);
    }
}
