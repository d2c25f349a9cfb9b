//! A partition cuts a bucket's owner away from the two other nodes, then heals, on a manual
//! clock: every node keeps acquiring, renewing and releasing shared leases of a `closed` policy
//! on both sides, and at no instant are more than the shared limit held — through the cut and
//! through the heal — and once it has healed the whole limit is held again. The two sides'
//! views are driven as gossip would leave them at worst: the majority drops the cut-off owner
//! from its ring the instant the partition starts and takes it back two seconds after the owner
//! hears it again; the cut-off owner never drops anyone.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::policy::OnUnavailable;
use weir::{Clock, ManualClock, Nanos};
use weir_cluster::admission::{ClusterAdmission, TwoTier, TwoTierConfig};
use weir_cluster::in_memory::InMemory;
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::quorum::Quorum;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::transport::{BoxFuture, Message, Reply, Transport, TransportError};

const BUCKET: &str = "analytics:group:analytics";
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const SHARED_LIMIT: u64 = 4;
const TTL: Duration = Duration::from_secs(10);

fn ring(ids: &[&str]) -> Ring {
    Ring::new(
        ids.iter().map(|id| Member::owner(*id, 1)),
        DEFAULT_VNODES,
        1,
    )
}

/// The in-memory network as seen from one node: calls across the cut go unanswered.
struct Side {
    from: &'static str,
    network: Arc<InMemory>,
    cut_off: Arc<Mutex<HashSet<&'static str>>>,
}

impl Side {
    fn reaches(&self, to: &str) -> Result<(), TransportError> {
        let cut = self.cut_off.lock().unwrap();
        match cut.contains(self.from) == cut.contains(to) {
            true => Ok(()),
            false => Err(TransportError::Unreachable(to.to_owned())),
        }
    }
}

impl Transport for Side {
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        match self.reaches(owner) {
            Ok(()) => self.network.send(owner, message),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

struct Node {
    id: &'static str,
    ring: Arc<SharedRing>,
    owner: Arc<Owner>,
    quorum: Arc<Quorum>,
    coordinator: TwoTier<ManualClock, Side>,
    /// Admissions in use, with when each one's lease runs out on the holder's side.
    held: Vec<(ClusterAdmission, Nanos)>,
}

/// Runs the scenario; `with_quorum` false leaves the owners without the majority fence.
/// Returns the most permits in use at once after the partition, and how many the majority side
/// was granted after it.
async fn partitioned(with_quorum: bool) -> (usize, usize, usize) {
    let clock = ManualClock::new(0);
    let network = Arc::new(InMemory::new());
    let cut_off = Arc::new(Mutex::new(HashSet::new()));
    let mut nodes: Vec<Node> = NODES
        .iter()
        .map(|&id| {
            let ring = Arc::new(SharedRing::new(ring(&NODES)));
            let quorum = Arc::new(Quorum::new(
                id,
                std::time::Duration::from_secs(3),
                id != "n1",
            ));
            let mut owner = Owner::new(id, Arc::clone(&ring), Arc::new(SharedPool::new(100)));
            if with_quorum {
                owner = owner.with_quorum(Arc::clone(&quorum));
            }
            let owner = Arc::new(owner);
            network.add(id, Arc::clone(&owner));
            let coordinator = TwoTier::new(
                id,
                TwoTierConfig {
                    node_limit: 0,
                    shared_limit: SHARED_LIMIT,
                    lease_ttl: TTL,
                    on_unavailable: OnUnavailable::Closed,
                    acquire_timeout: Duration::from_millis(200),
                    max_keys: 100,
                    max_loan: 1,
                    learning_period: Duration::ZERO,
                },
                Arc::clone(&ring),
                Arc::new(Side {
                    from: id,
                    network: Arc::clone(&network),
                    cut_off: Arc::clone(&cut_off),
                }),
                Arc::clone(&owner),
                clock.clone(),
            );
            Node {
                id,
                ring,
                owner,
                quorum,
                coordinator,
                held: Vec::new(),
            }
        })
        .collect();
    let owner_id = ring(&NODES).owner_of(BUCKET).unwrap().to_owned();
    let ttl = TTL;
    let partition_at = 60;
    let (heal_at, readmitted_at) = (120, 122);
    let mut most_after = 0;
    let mut in_use_at_end = 0;
    let mut granted_after = 0;
    for second in 0..200u64 {
        let now = clock.now();
        if second == partition_at {
            cut_off.lock().unwrap().insert(
                NODES
                    .into_iter()
                    .find(|id| *id == owner_id)
                    .expect("the owner is a node"),
            );
            // The majority's gossip drops the owner at once; the owner drops no one.
            for node in nodes.iter().filter(|n| n.id != owner_id) {
                let others: Vec<&str> = NODES.into_iter().filter(|id| *id != owner_id).collect();
                node.ring.publish(ring(&others));
                node.coordinator.rehome().await;
            }
        }
        if second == heal_at {
            cut_off.lock().unwrap().clear();
        }
        if second == readmitted_at {
            // The majority's gossip takes the owner back a little after the owner heard it.
            for node in nodes.iter().filter(|n| n.id != owner_id) {
                node.ring.publish(ring(&NODES));
                node.coordinator.rehome().await;
            }
        }
        // Gossip: every node hears the beats of those on its side.
        let cut = cut_off.lock().unwrap().clone();
        for node in &nodes {
            let heard: Vec<(&str, u128)> = NODES
                .iter()
                .map(|&id| {
                    let same_side = cut.contains(id) == cut.contains(node.id);
                    let beat = if same_side || second >= heal_at {
                        second
                    } else {
                        partition_at
                    };
                    (id, u128::from(beat))
                })
                .collect();
            node.quorum.observe(heard, now);
            node.owner.beat(now);
        }
        for node in &mut nodes {
            // Renew what is held; a lease whose renewal fails is used until it runs out, then
            // given up (the holder's side of the lease contract).
            let mut kept = Vec::new();
            for (admission, until) in node.held.drain(..) {
                let lease = admission.shared().expect("a shared lease");
                if node.coordinator.renew(lease, ttl).await {
                    kept.push((admission, weir::clock::after(now, ttl)));
                } else if until > now {
                    kept.push((admission, until));
                }
            }
            node.held = kept;
            // Every third second, one is done.
            if second % 3 == 0 && !node.held.is_empty() {
                let (admission, _) = node.held.remove(0);
                node.coordinator.release(admission).await;
            }
            while let Ok(admission) = node.coordinator.acquire(BUCKET).await {
                if second > partition_at && node.id != owner_id {
                    granted_after += 1;
                }
                node.held.push((admission, weir::clock::after(now, ttl)));
                assert!(node.held.len() <= 100, "never refused");
            }
        }
        let in_use: usize = nodes.iter().map(|n| n.held.len()).sum();
        if second < partition_at {
            assert!(in_use <= SHARED_LIMIT as usize, "{in_use} before the cut");
        } else {
            most_after = most_after.max(in_use);
        }
        in_use_at_end = in_use;
        clock.advance(Duration::from_secs(1));
    }
    let fenced: u64 = nodes
        .iter()
        .map(|n| n.coordinator.counters.fenced.load(Ordering::Relaxed))
        .sum();
    assert!(fenced > 0, "the fences were met");
    (most_after, granted_after, in_use_at_end)
}

#[tokio::test]
async fn a_cut_off_owner_lets_its_leases_run_out_before_the_other_side_grants() {
    let (most, granted, at_end) = partitioned(true).await;
    assert!(
        most <= SHARED_LIMIT as usize,
        "{most} permits in use at once against a shared limit of {SHARED_LIMIT}"
    );
    assert!(granted > 0, "the majority side took the bucket over");
    assert_eq!(
        at_end, SHARED_LIMIT as usize,
        "after the heal the whole shared limit is usable"
    );
}

/// Without the majority fence, the cut-off owner goes on renewing its side's leases, and once
/// the other side's new owner has settled, both sides hold the shared limit.
#[tokio::test]
async fn without_the_majority_fence_both_sides_hold_the_shared_limit() {
    let (most, _, _) = partitioned(false).await;
    assert!(most > SHARED_LIMIT as usize, "{most}");
}
