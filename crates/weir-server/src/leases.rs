//! The server's leases: admissions of concurrency policies, held until released or expired.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::lease::{LeaseId, LeaseTracker};
use weir::policy::Admission;
use weir::{Nanos, SystemClock};

/// What a lease holds: the admission (its permit is released when it is dropped).
#[derive(Debug)]
pub struct Held {
    /// The policy that admitted it.
    pub policy: String,
    /// The admission itself.
    pub admission: Hold,
}

/// A node admission, or a shared one from the bucket's owner (cluster mode).
#[derive(Debug)]
pub enum Hold {
    /// Admitted by this node's buckets.
    Node(Admission<SystemClock>),
    /// A shared lease or a lent unit; released through its coordinator, also when it expires
    /// here unreleased (a lent unit has no expiry of its own on the owner: only its loan does,
    /// and the loan lives on while the node renews it).
    Shared(
        weir_cluster::admission::ClusterAdmission,
        Arc<crate::cluster::SharedCoordinator>,
    ),
}

impl Hold {
    /// Releases it (a shared lease in the background).
    fn release(self) {
        match self {
            Hold::Node(admission) => drop(admission),
            Hold::Shared(admission, coordinator) => {
                crate::cluster::ClusterMode::release(coordinator, admission)
            }
        }
    }
}

/// Lease counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounters {
    /// Held now.
    pub active: u64,
    /// Reclaimed on expiry.
    pub expired: u64,
    /// Released by their holder.
    pub released: u64,
}

/// The lease table, shared by the HTTP and gRPC APIs and the sweeper.
///
/// A lease id is a capability (whoever has it can release the lease), so each is 128 bits from
/// a cryptographic generator (ChaCha) seeded by the operating system: seeing one id tells
/// nothing about any other.
#[derive(Debug)]
pub struct Leases {
    tracker: Mutex<LeaseTracker<Held>>,
    ids: Mutex<StdRng>,
    expired: AtomicU64,
    released: AtomicU64,
}

impl Default for Leases {
    fn default() -> Self {
        Leases::new()
    }
}

impl Leases {
    /// An empty table.
    pub fn new() -> Self {
        Leases {
            tracker: Mutex::new(LeaseTracker::new()),
            ids: Mutex::new(StdRng::from_os_rng()),
            expired: AtomicU64::new(0),
            released: AtomicU64::new(0),
        }
    }

    fn draw_id(&self) -> LeaseId {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        LeaseId::from_bits(ids.random())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseTracker<Held>> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `held` for `ttl` from `now`.
    pub fn insert(&self, mut held: Held, ttl: Duration, now: Nanos) -> (LeaseId, Nanos) {
        loop {
            let id = self.draw_id();
            match self.lock().insert(id, held, ttl, now) {
                Ok(expires) => return (id, expires),
                // 2^-128 per live lease; drawn again rather than assumed away.
                Err(back) => held = back,
            }
        }
    }

    /// Releases a lease; false if it is unknown.
    pub fn release(&self, id: LeaseId) -> bool {
        // Released outside the lock (dropped at the end of this statement): releasing a
        // permit may wake a waiter.
        let Some(held) = self.lock().release(id) else {
            return false;
        };
        held.admission.release();
        self.released.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Renews a live lease to `now + ttl`; its new expiry, or `None` if unknown or expired.
    pub fn renew(&self, id: LeaseId, ttl: Duration, now: Nanos) -> Option<Nanos> {
        self.lock().renew(id, ttl, now)
    }

    /// The coordinator and shared lease behind a live cluster lease, to renew it on its owner.
    pub fn shared_of(
        &self,
        id: LeaseId,
    ) -> Option<(
        Arc<crate::cluster::SharedCoordinator>,
        weir_cluster::admission::SharedLease,
    )> {
        match &self.lock().get(id)?.admission {
            Hold::Shared(admission, coordinator) => {
                Some((Arc::clone(coordinator), admission.shared()?))
            }
            Hold::Node(_) => None,
        }
    }

    /// Releases every lease `policy` holds, as its holders would: the policy was removed, and a
    /// lease belongs to its policy's life (renewing one then answers that it is unknown, and a
    /// policy of that name made later starts with nothing in flight). Returns how many.
    pub fn release_policy(&self, policy: &str) -> usize {
        let ended = self.lock().release_where(|held| held.policy == policy);
        let count = ended.len();
        for held in ended {
            held.admission.release();
        }
        self.released.fetch_add(count as u64, Ordering::Relaxed);
        count
    }

    /// The policy holding a live lease.
    pub fn policy_of(&self, id: LeaseId) -> Option<String> {
        self.lock().get(id).map(|h| h.policy.clone())
    }

    /// Reclaims what expired by `now`; returns how many.
    pub fn sweep(&self, now: u64) -> usize {
        let expired = self.lock().expire(now);
        let count = expired.len();
        for held in expired {
            held.admission.release();
        }
        self.expired.fetch_add(count as u64, Ordering::Relaxed);
        count
    }

    /// Leases held now per policy, split by where each came from: `(node, shared)`, the node's
    /// own buckets or the cluster's shared pool (a lent unit counts as shared).
    pub fn held_by_policy(&self) -> std::collections::BTreeMap<String, (u64, u64)> {
        let mut held = std::collections::BTreeMap::<String, (u64, u64)>::new();
        for lease in self.lock().values() {
            // Looked up before inserting: the name is copied once per policy, not per lease.
            let counts = match held.get_mut(&lease.policy) {
                Some(counts) => counts,
                None => held.entry(lease.policy.clone()).or_default(),
            };
            match lease.admission {
                Hold::Node(_) => counts.0 += 1,
                Hold::Shared(..) => counts.1 += 1,
            }
        }
        held
    }

    /// Counts for `/metrics`.
    pub fn counters(&self) -> LeaseCounters {
        LeaseCounters {
            active: self.lock().len() as u64,
            expired: self.expired.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }
}
