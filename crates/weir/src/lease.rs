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

use crate::clock::Nanos;

/// A lease's id: unique within the process, and not guessable from another process's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId {
    salt: u64,
    serial: u64,
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.salt, self.serial)
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
        let salt = u64::from_str_radix(&text[..16], 16).map_err(|_| NotALeaseId)?;
        let serial = u64::from_str_radix(&text[16..], 16).map_err(|_| NotALeaseId)?;
        Ok(LeaseId { salt, serial })
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
    salt: u64,
    next: u64,
    leases: HashMap<LeaseId, Lease<T>>,
    by_expiry: BTreeSet<(Nanos, LeaseId)>,
}

impl<T> LeaseTracker<T> {
    /// An empty tracker whose ids start with `salt` (pick it at random per process).
    pub fn new(salt: u64) -> Self {
        LeaseTracker {
            salt,
            next: 0,
            leases: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    /// Holds `value` until `now + ttl`; returns its id and expiry.
    pub fn insert(&mut self, value: T, ttl: Nanos, now: Nanos) -> (LeaseId, Nanos) {
        let id = LeaseId {
            salt: self.salt,
            serial: self.next,
        };
        self.next += 1;
        let expires_at = now.saturating_add(ttl);
        self.leases.insert(id, Lease { value, expires_at });
        self.by_expiry.insert((expires_at, id));
        (id, expires_at)
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
    pub fn renew(&mut self, id: LeaseId, ttl: Nanos, now: Nanos) -> Option<Nanos> {
        let lease = self.leases.get_mut(&id)?;
        if lease.expires_at <= now {
            return None;
        }
        self.by_expiry.remove(&(lease.expires_at, id));
        lease.expires_at = now.saturating_add(ttl);
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

    /// The value held by a live lease.
    pub fn get(&self, id: LeaseId) -> Option<&T> {
        self.leases.get(&id).map(|l| &l.value)
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
    fn ids_round_trip_and_reject_garbage() {
        let mut tracker = LeaseTracker::new(0xfeed);
        let (id, _) = tracker.insert((), 10, 0);
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<LeaseId>(), Ok(id));
        for bad in ["", "xyz", &text[1..], &format!("{}g", &text[1..])] {
            assert_eq!(bad.parse::<LeaseId>(), Err(NotALeaseId), "{bad:?}");
        }
    }

    #[test]
    fn release_is_once_and_unknown_ids_are_none() {
        let mut tracker = LeaseTracker::new(1);
        let (a, _) = tracker.insert("a", 100, 0);
        assert_eq!(tracker.release(a), Some("a"));
        assert_eq!(tracker.release(a), None);
        assert!(tracker.is_empty());
        assert!(tracker.expire(1_000).is_empty());
    }

    #[test]
    fn expiry_is_inclusive_and_renewal_moves_it() {
        let mut tracker = LeaseTracker::new(1);
        let (a, expires) = tracker.insert("a", 100, 0);
        let (_b, _) = tracker.insert("b", 200, 0);
        assert_eq!(expires, 100);
        assert!(tracker.expire(99).is_empty());
        assert_eq!(tracker.renew(a, 100, 99), Some(199));
        assert_eq!(tracker.expire(100), Vec::<&str>::new(), "renewed past 100");
        assert_eq!(tracker.expire(199), vec!["a"]);
        assert_eq!(tracker.renew(a, 100, 199), None, "already reclaimed");
        assert_eq!(tracker.expire(200), vec!["b"]);
    }

    #[test]
    fn an_expired_lease_cannot_be_renewed_even_before_the_sweep() {
        let mut tracker = LeaseTracker::new(1);
        let (a, _) = tracker.insert("a", 100, 0);
        assert_eq!(tracker.renew(a, 100, 100), None);
        assert_eq!(tracker.expire(100), vec!["a"]);
    }
}
