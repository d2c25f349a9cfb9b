//! Leases: things held for a while, reclaimed when their time runs out.
//!
//! A concurrency permit handed to a remote caller cannot be released by a destructor: the
//! caller may crash, or its release may be lost. So it is held as a *lease*: an id, the value
//! held (the permit), and an expiry. The holder releases it by id, or renews it; a periodic
//! [`expire`](LeaseTracker::expire) reclaims whatever outlived its time. A lease that is never
//! released is reclaimed within its TTL plus one sweep interval.
//!
//! The tracker is pure: no clock, no lock, no task. Time comes in as an argument; the caller
//! wraps it in a mutex and runs the sweep.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use std::time::Duration;

use crate::clock::{Nanos, after};

/// A lease's id: 128 bits the caller draws at random.
///
/// An id is a capability: whoever knows it can renew or release the lease. So ids must not be
/// guessable from one another — the server draws each from a cryptographic generator seeded by
/// the operating system; the tracker only insists that they are unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

impl LeaseId {
    /// The id with these bits.
    pub fn from_bits(bits: u128) -> Self {
        LeaseId(bits)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A string that is not a lease id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a lease id: expected 32 hexadecimal digits")]
pub struct NotALeaseId;

impl FromStr for LeaseId {
    type Err = NotALeaseId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NotALeaseId);
        }
        u128::from_str_radix(text, 16)
            .map(LeaseId)
            .map_err(|_| NotALeaseId)
    }
}

#[derive(Debug)]
struct Lease<T> {
    value: T,
    expires_at: Nanos,
}

/// The live leases; see the [module docs](self).
#[derive(Debug)]
pub struct LeaseTracker<T> {
    leases: HashMap<LeaseId, Lease<T>>,
    by_expiry: BTreeSet<(Nanos, LeaseId)>,
}

impl<T> Default for LeaseTracker<T> {
    fn default() -> Self {
        LeaseTracker::new()
    }
}

impl<T> LeaseTracker<T> {
    /// An empty tracker.
    pub fn new() -> Self {
        LeaseTracker {
            leases: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    /// Holds `value` under `id` until `now + ttl`; returns its expiry. An id a live lease
    /// already has is refused, and `value` comes back in the error: draw another id.
    pub fn insert(&mut self, id: LeaseId, value: T, ttl: Duration, now: Nanos) -> Result<Nanos, T> {
        if self.leases.contains_key(&id) {
            return Err(value);
        }
        let expires_at = after(now, ttl);
        self.leases.insert(id, Lease { value, expires_at });
        self.by_expiry.insert((expires_at, id));
        Ok(expires_at)
    }

    /// Ends a lease early; `None` if it is unknown (never issued, released, or reclaimed).
    /// Releasing twice is harmless.
    pub fn release(&mut self, id: LeaseId) -> Option<T> {
        let lease = self.leases.remove(&id)?;
        self.by_expiry.remove(&(lease.expires_at, id));
        Some(lease.value)
    }

    /// Extends a live lease to `now + ttl`; `None` if it is unknown or already expired (a lease
    /// whose expiry is `now` has expired).
    pub fn renew(&mut self, id: LeaseId, ttl: Duration, now: Nanos) -> Option<Nanos> {
        let lease = self.leases.get_mut(&id)?;
        if lease.expires_at <= now {
            return None;
        }
        self.by_expiry.remove(&(lease.expires_at, id));
        lease.expires_at = after(now, ttl);
        self.by_expiry.insert((lease.expires_at, id));
        Some(lease.expires_at)
    }

    /// Reclaims every lease that expired by `now` (expiry inclusive) and returns their values.
    pub fn expire(&mut self, now: Nanos) -> Vec<T> {
        let mut expired = Vec::new();
        while let Some(&(expires_at, id)) = self.by_expiry.first() {
            if expires_at > now {
                break;
            }
            self.by_expiry.pop_first();
            if let Some(lease) = self.leases.remove(&id) {
                expired.push(lease.value);
            }
        }
        expired
    }

    /// Ends every lease whose value `ends` picks and returns their values: what a lease
    /// belongs to (its policy, say) has gone.
    pub fn release_where(&mut self, mut ends: impl FnMut(&T) -> bool) -> Vec<T> {
        let ids: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, lease)| ends(&lease.value))
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter().filter_map(|id| self.release(id)).collect()
    }

    /// The value held by a live lease.
    pub fn get(&self, id: LeaseId) -> Option<&T> {
        self.leases.get(&id).map(|l| &l.value)
    }

    /// The values of the live leases, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.leases.values().map(|l| &l.value)
    }

    /// Leases held now.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_picked_by_their_value_end_and_the_rest_stay() {
        let mut tracker = LeaseTracker::new();
        for (n, owner) in [(1, "a"), (2, "b"), (3, "a")] {
            tracker
                .insert(id(n), owner, Duration::from_secs(10), 0)
                .unwrap();
        }
        let mut ended = tracker.release_where(|owner| *owner == "a");
        ended.sort();
        assert_eq!(ended, ["a", "a"]);
        assert_eq!(tracker.len(), 1);
        assert_eq!(tracker.get(id(2)), Some(&"b"));
        assert_eq!(tracker.renew(id(1), Duration::from_secs(1), 1), None);
        // Nothing left behind in the expiry order: only b expires.
        assert_eq!(tracker.expire(u64::MAX), ["b"]);
    }

    fn id(n: u128) -> LeaseId {
        LeaseId::from_bits(n)
    }

    #[test]
    fn ids_round_trip_and_reject_garbage() {
        let id = LeaseId::from_bits(0xfeed_u128 << 100 | 7);
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<LeaseId>(), Ok(id));
        for bad in ["", "xyz", &text[1..], &format!("{}g", &text[1..])] {
            assert_eq!(bad.parse::<LeaseId>(), Err(NotALeaseId), "{bad:?}");
        }
    }

    #[test]
    fn release_is_once_and_unknown_ids_are_none() {
        let mut tracker = LeaseTracker::new();
        let a = id(1);
        tracker
            .insert(a, "a", Duration::from_nanos(100), 0)
            .unwrap();
        assert_eq!(
            tracker.insert(a, "again", Duration::from_nanos(100), 0),
            Err("again"),
            "ids are unique"
        );
        assert_eq!(tracker.release(a), Some("a"));
        assert_eq!(tracker.release(a), None);
        assert!(tracker.is_empty());
        assert!(tracker.expire(1_000).is_empty());
    }

    #[test]
    fn expiry_is_inclusive_and_renewal_moves_it() {
        let mut tracker = LeaseTracker::new();
        let a = id(1);
        let expires = tracker
            .insert(a, "a", Duration::from_nanos(100), 0)
            .unwrap();
        tracker
            .insert(id(2), "b", Duration::from_nanos(200), 0)
            .unwrap();
        assert_eq!(expires, 100);
        assert!(tracker.expire(99).is_empty());
        assert_eq!(tracker.renew(a, Duration::from_nanos(100), 99), Some(199));
        assert_eq!(tracker.expire(100), Vec::<&str>::new(), "renewed past 100");
        assert_eq!(tracker.expire(199), vec!["a"]);
        assert_eq!(
            tracker.renew(a, Duration::from_nanos(100), 199),
            None,
            "already reclaimed"
        );
        assert_eq!(tracker.expire(200), vec!["b"]);
    }

    #[test]
    fn an_expired_lease_cannot_be_renewed_even_before_the_sweep() {
        let mut tracker = LeaseTracker::new();
        let a = id(1);
        tracker
            .insert(a, "a", Duration::from_nanos(100), 0)
            .unwrap();
        assert_eq!(tracker.renew(a, Duration::from_nanos(100), 100), None);
        assert_eq!(tracker.expire(100), vec!["a"]);
    }
}
