//! Two-tier admission across several coordinators over the in-memory transport, on a manual
//! clock: the cluster-wide ceiling, the refusal reasons, owner failure per `on_unavailable`,
//! leases reclaimed after a coordinator vanishes, and a change of owner with and without the
//! tenure fence.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;
use weir::ManualClock;
use weir::policy::OnUnavailable;
use weir_cluster::admission::{ClusterAdmission, Tier, TwoTier, TwoTierConfig};
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};

use weir_cluster::in_memory::InMemory;
use weir_cluster::transport::{BoxFuture, Message, Reply, Transport, TransportError};

const BUCKET: &str = "analytics:group:analytics";

struct Cluster {
    nodes: Vec<TwoTier<ManualClock, InMemory>>,
    pools: Vec<Arc<SharedPool>>,
    owners: Vec<Arc<Owner>>,
    network: Arc<InMemory>,
    ring: Arc<SharedRing>,
    clock: ManualClock,
}

fn config(node_limit: u64, shared_limit: u64, on_unavailable: OnUnavailable) -> TwoTierConfig {
    TwoTierConfig {
        node_limit,
        shared_limit,
        lease_ttl: Duration::from_secs(30),
        on_unavailable,
        acquire_timeout: Duration::from_millis(200),
        max_keys: 1000,
        max_loan: 1,
        learning_period: Duration::ZERO,
    }
}

fn cluster(n: usize, config: TwoTierConfig) -> Cluster {
    let ids: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
    let ring = Arc::new(SharedRing::new(Ring::new(
        ids.iter().map(|id| Member::owner(id.clone(), 1)),
        DEFAULT_VNODES,
        1,
    )));
    let network = Arc::new(InMemory::new());
    let clock = ManualClock::new(0);
    let pools: Vec<Arc<SharedPool>> = ids
        .iter()
        .map(|_| Arc::new(SharedPool::new(10_000)))
        .collect();
    let owners: Vec<Arc<Owner>> = ids
        .iter()
        .zip(&pools)
        .map(|(id, pool)| Arc::new(Owner::new(id, Arc::clone(&ring), Arc::clone(pool))))
        .collect();
    for (id, owner) in ids.iter().zip(&owners) {
        network.add(id, Arc::clone(owner));
    }
    let nodes = ids
        .iter()
        .zip(&owners)
        .map(|(id, owner)| {
            TwoTier::new(
                id,
                config.clone(),
                Arc::clone(&ring),
                Arc::clone(&network),
                Arc::clone(owner),
                clock.clone(),
            )
        })
        .collect();
    let c = Cluster {
        nodes,
        pools,
        owners,
        network,
        ring,
        clock,
    };
    // The cluster has been up for one lease TTL (a loan's, with loans): every owner has held
    // its buckets that long.
    let margin = match config.max_loan > 1 {
        true => weir_cluster::loan::LOAN_MARGIN,
        false => Duration::ZERO,
    };
    c.advance(config.lease_ttl + margin);
    c
}

impl Cluster {
    /// Moves the clock on by `by`, every owner beating once a second as its ticker would.
    fn advance(&self, by: Duration) {
        let mut left = by;
        loop {
            for owner in &self.owners {
                owner.beat(weir::Clock::now(&self.clock));
            }
            if left.is_zero() {
                return;
            }
            let step = left.min(Duration::from_secs(1));
            self.clock.advance(step);
            left -= step;
        }
    }

    fn owner(&self) -> usize {
        let owner = self.ring.owner_of(BUCKET).unwrap();
        owner[1..].parse::<usize>().unwrap() - 1
    }
}

/// Admits on `node` until refused; returns the admissions.
async fn fill(node: &TwoTier<ManualClock, InMemory>) -> Vec<ClusterAdmission> {
    fill_bucket(node, BUCKET).await
}

/// Admits `bucket` on `node` until refused; returns the admissions.
async fn fill_bucket(node: &TwoTier<ManualClock, InMemory>, bucket: &str) -> Vec<ClusterAdmission> {
    let mut held = Vec::new();
    while let Ok(admission) = node.acquire(bucket).await {
        held.push(admission);
        assert!(held.len() < 1000, "never refused");
    }
    held
}

#[tokio::test]
async fn the_ceiling_is_node_limit_times_n_plus_shared_limit_exactly() {
    let c = cluster(3, config(2, 3, OnUnavailable::Open));
    let mut held = Vec::new();
    for node in &c.nodes {
        held.extend(fill(node).await);
    }
    assert_eq!(held.len(), 2 * 3 + 3);
    assert_eq!(held.iter().filter(|a| a.tier == Tier::Node).count(), 6);
    assert_eq!(held.iter().filter(|a| a.tier == Tier::Shared).count(), 3);
    for node in &c.nodes {
        assert!(
            node.acquire(BUCKET).await.is_err(),
            "every coordinator is at the ceiling"
        );
    }
    assert_eq!(c.pools[c.owner()].in_use(BUCKET, 0), 3);
}

#[tokio::test]
async fn two_coordinators_with_one_and_one_hold_three_and_a_release_lets_one_in() {
    let c = cluster(2, config(1, 1, OnUnavailable::Open));
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let first = a.acquire(BUCKET).await.unwrap();
    let shared = a.acquire(BUCKET).await.unwrap();
    assert_eq!((first.tier, shared.tier), (Tier::Node, Tier::Shared));
    let third = b.acquire(BUCKET).await.unwrap();
    assert_eq!(third.tier, Tier::Node);
    let refused = b.acquire(BUCKET).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        format!("bucket `{BUCKET}` reached its per-node limit of 1 and its shared limit of 1")
    );
    a.release(shared).await;
    let again = b.acquire(BUCKET).await.unwrap();
    assert_eq!(again.tier, Tier::Shared);
    assert!(a.acquire(BUCKET).await.is_err());
    assert!(b.acquire(BUCKET).await.is_err());
}

#[tokio::test]
async fn an_unreachable_owner_follows_on_unavailable() {
    for mode in [
        OnUnavailable::Open,
        OnUnavailable::Closed,
        OnUnavailable::LocalShare,
    ] {
        let c = cluster(3, config(1, 4, mode));
        let owner = c.owner();
        let coordinator = &c.nodes[(owner + 1) % 3];
        c.network.set_down(&format!("n{}", owner + 1), true);
        let node = coordinator.acquire(BUCKET).await.unwrap();
        assert_eq!(node.tier, Tier::Node, "the node tier needs no owner");
        match mode {
            OnUnavailable::Open => {
                for _ in 0..10 {
                    assert_eq!(
                        coordinator.acquire(BUCKET).await.unwrap().tier,
                        Tier::FailOpen
                    );
                }
                assert_eq!(
                    coordinator
                        .counters
                        .fail_open
                        .load(std::sync::atomic::Ordering::Relaxed),
                    10
                );
            }
            OnUnavailable::Closed => {
                let refused = coordinator.acquire(BUCKET).await.unwrap_err();
                assert_eq!(
                    refused.reason.to_string(),
                    "could not check its shared limit of 4"
                );
            }
            OnUnavailable::LocalShare => {
                // ceil(4 / 3) = 2 extra on this node (held), then refused.
                let first = coordinator.acquire(BUCKET).await.unwrap();
                let second = coordinator.acquire(BUCKET).await.unwrap();
                assert_eq!(
                    (first.tier, second.tier),
                    (Tier::LocalShare, Tier::LocalShare)
                );
                let refused = coordinator.acquire(BUCKET).await.unwrap_err();
                assert!(
                    refused
                        .reason
                        .to_string()
                        .contains("this node's share of it (2)"),
                    "{}",
                    refused.reason
                );
            }
        }
        // Healed: the shared pool is asked again.
        c.network.set_down(&format!("n{}", owner + 1), false);
        assert_eq!(
            coordinator.acquire(BUCKET).await.unwrap().tier,
            Tier::Shared
        );
    }
}

#[tokio::test]
async fn a_vanished_coordinators_leases_come_back_within_ttl_plus_a_sweep() {
    let c = cluster(2, config(0, 2, OnUnavailable::Closed));
    let owner = c.owner();
    let coordinator = &c.nodes[(owner + 1) % 2];
    // It takes the whole shared pool and is never heard from again.
    let lost = fill(coordinator).await;
    assert_eq!(lost.len(), 2);
    std::mem::forget(lost);
    let other = &c.nodes[owner];
    assert!(other.acquire(BUCKET).await.is_err());
    // One sweep after the TTL, the leases are gone.
    c.advance(Duration::from_secs(29));
    assert_eq!(c.pools[owner].sweep(weir::Clock::now(&c.clock)), 0);
    c.advance(Duration::from_secs(1));
    assert_eq!(c.pools[owner].sweep(weir::Clock::now(&c.clock)), 2);
    assert_eq!(other.acquire(BUCKET).await.unwrap().tier, Tier::Shared);
}

#[tokio::test]
async fn an_empty_ring_is_unavailable_too() {
    let c = cluster(2, config(0, 5, OnUnavailable::Open));
    c.ring.publish(Ring::default());
    assert_eq!(
        c.nodes[0].acquire(BUCKET).await.unwrap().tier,
        Tier::FailOpen
    );
}

/// Moves the bucket to another node by taking its owner out of the ring (its process lives on).
fn move_bucket(c: &Cluster) -> usize {
    let owner = c.owner();
    let survivors: Vec<String> = (0..c.nodes.len())
        .filter(|&i| i != owner)
        .map(|i| format!("n{}", i + 1))
        .collect();
    c.ring.publish(Ring::new(
        survivors.iter().map(|id| Member::owner(id.clone(), 1)),
        DEFAULT_VNODES,
        1,
    ));
    owner
}

/// Without a handoff and without the tenure fence (`open`), a bucket that changes owner starts
/// with an empty pool on its new owner, so the cluster may admit up to `shared_limit` more until
/// the old leases are released or expire.
#[tokio::test]
async fn unfenced_without_a_handoff_a_rebalance_over_admits_one_shared_limit() {
    let c = cluster(3, config(1, 4, OnUnavailable::Open));
    let mut held = Vec::new();
    for node in &c.nodes {
        held.extend(fill(node).await);
    }
    assert_eq!(held.len(), 3 + 4, "the ceiling before the change");
    let old_owner = move_bucket(&c);
    let mut extra = 0;
    for (i, node) in c.nodes.iter().enumerate() {
        if i != old_owner {
            let more = fill(node).await;
            extra += more.len();
            held.extend(more);
        }
    }
    assert_eq!(
        extra, 4,
        "over-admission after the rebalance: one shared limit"
    );
}

/// With the fence (`closed`), the new owner grants nothing for one lease TTL after the bucket
/// moved to it, saying when it will; by then every lease the old owner granted and nobody
/// handed over has expired, so the cluster never holds more than its ceiling.
#[tokio::test]
async fn fenced_without_a_handoff_a_rebalance_admits_nothing_until_the_old_leases_expired() {
    let c = cluster(3, config(1, 4, OnUnavailable::Closed));
    let mut held = Vec::new();
    for node in &c.nodes {
        held.extend(fill(node).await);
    }
    assert_eq!(held.len(), 3 + 4, "the ceiling before the change");
    let old_owner = move_bucket(&c);
    let asker = &c.nodes[(old_owner + 1) % 3];
    let refused = asker.acquire(BUCKET).await.unwrap_err();
    let new_owner = c.owner();
    assert_eq!(
        refused.reason.to_string(),
        format!(
            "could not check its shared limit of 4: its owner `n{}` took it over too recently: \
             leases granted before may still be live (it grants in 30000 ms)",
            new_owner + 1
        )
    );
    assert!(!refused.reason.is_full());
    assert_eq!(refused.retry_after, Some(Duration::from_secs(30)));
    assert_eq!(asker.counters.fenced.load(Ordering::Relaxed), 1);
    c.advance(Duration::from_secs(29));
    for (i, node) in c.nodes.iter().enumerate() {
        if i != old_owner {
            assert!(
                node.acquire(BUCKET).await.is_err(),
                "still settling at 29 s"
            );
        }
    }
    // At 30 s the leases granted before the change have expired everywhere.
    c.advance(Duration::from_secs(1));
    let live_before = c.pools[old_owner].in_use(BUCKET, weir::Clock::now(&c.clock));
    assert_eq!(live_before, 0);
    let mut extra = 0;
    for (i, node) in c.nodes.iter().enumerate() {
        if i != old_owner {
            extra += fill(node).await.len();
        }
    }
    assert_eq!(
        extra, 4,
        "the whole shared limit, now that nothing older is live"
    );
}

/// With the handoff, every coordinator re-registers its leases with the new owner: the ceiling
/// holds through the rebalance even unfenced, and releases go to where each lease now lives.
#[tokio::test]
async fn with_the_handoff_a_rebalance_keeps_the_ceiling() {
    let c = cluster(3, config(1, 4, OnUnavailable::Open));
    let mut held: Vec<(usize, ClusterAdmission)> = Vec::new();
    for (i, node) in c.nodes.iter().enumerate() {
        held.extend(fill(node).await.into_iter().map(|a| (i, a)));
    }
    let old_owner = move_bucket(&c);
    let mut moved = 0;
    for node in &c.nodes {
        moved += node.rehome().await;
    }
    assert_eq!(moved, 4, "every shared lease moved to the new owner");
    assert_eq!(
        c.pools[old_owner].in_use(BUCKET, 0),
        0,
        "released at the old owner"
    );
    let new_owner = c.owner();
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 4);
    for (i, node) in c.nodes.iter().enumerate() {
        if i != old_owner {
            assert!(
                node.acquire(BUCKET).await.unwrap_err().reason.is_full(),
                "the ceiling holds"
            );
        }
    }
    // Releasing a handed-over lease frees room on the new owner.
    let (i, shared) = held
        .into_iter()
        .find(|(_, a)| a.tier == Tier::Shared)
        .unwrap();
    c.nodes[i].release(shared).await;
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 3);
}

#[tokio::test]
async fn an_owner_whose_view_differs_answers_not_owner_and_nobody_double_grants() {
    // The coordinator still sees {n1, n2}; n2 itself already sees only {n1}.
    let both = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("n1", 1), Member::owner("n2", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let only_n1 = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("n1", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let bucket = (0..1000)
        .map(|i| format!("bucket-{i}"))
        .find(|b| both.owner_of(b).as_deref() == Some("n2"))
        .unwrap();
    let network = Arc::new(InMemory::new());
    let n2_pool = Arc::new(SharedPool::new(100));
    network.add(
        "n2",
        Arc::new(Owner::new("n2", only_n1, Arc::clone(&n2_pool))),
    );
    let coordinator = TwoTier::new(
        "n1",
        config(0, 3, OnUnavailable::Closed),
        Arc::clone(&both),
        Arc::clone(&network),
        Arc::new(Owner::new("n1", both, Arc::new(SharedPool::new(100)))),
        ManualClock::new(0),
    );
    let refused = coordinator.acquire(&bucket).await.unwrap_err();
    assert_eq!(
        refused.reason.to_string(),
        "could not check its shared limit of 3"
    );
    assert_eq!(
        n2_pool.in_use(&bucket, 0),
        0,
        "n2 granted nothing for a bucket it does not own"
    );
    assert_eq!(
        coordinator
            .counters
            .unavailable
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn renewing_a_shared_lease_extends_it_on_its_owner() {
    let c = cluster(2, config(0, 1, OnUnavailable::Closed));
    let owner = c.owner();
    let coordinator = &c.nodes[(owner + 1) % 2];
    let admission = coordinator.acquire(BUCKET).await.unwrap();
    let shared = admission.shared().expect("a shared lease");
    c.advance(Duration::from_secs(20));
    assert!(
        coordinator
            .renew(shared.clone(), std::time::Duration::from_secs(30))
            .await
    );
    // Past the original 30 s, the renewed lease is still live on the owner.
    c.advance(Duration::from_secs(15));
    assert_eq!(c.pools[owner].sweep(weir::Clock::now(&c.clock)), 0);
    assert!(coordinator.acquire(BUCKET).await.is_err(), "still held");
    // Once it has expired there, renewing says so.
    c.advance(Duration::from_secs(60));
    c.pools[owner].sweep(weir::Clock::now(&c.clock));
    assert!(
        !coordinator
            .renew(shared, std::time::Duration::from_secs(30))
            .await
    );
    assert_eq!(
        coordinator.acquire(BUCKET).await.unwrap().tier,
        Tier::Shared,
        "the expired lease's place is free again"
    );
}

/// A lease whose handoff failed (its new owner was unreachable when the ring moved) is handed
/// over when it is next renewed, and renewed on the owner that counts it now.
#[tokio::test]
async fn a_lease_whose_handoff_failed_is_handed_over_at_its_renewal() {
    let c = cluster(3, config(0, 4, OnUnavailable::Open));
    let old_owner = c.owner();
    // A lease held on each other node: one of them will hold it away from the new owner.
    let mut held = Vec::new();
    for i in (0..3).filter(|&i| i != old_owner) {
        held.push((i, c.nodes[i].acquire(BUCKET).await.unwrap()));
    }
    move_bucket(&c);
    let new_owner = c.owner();
    let (holder, admission) = held
        .into_iter()
        .find(|(i, _)| *i != new_owner)
        .expect("a holder that is not the new owner");
    let new_id = format!("n{}", new_owner + 1);
    c.network.set_down(&new_id, true);
    assert_eq!(c.nodes[holder].rehome().await, 0, "the new owner is down");
    c.network.set_down(&new_id, false);
    assert_eq!(c.nodes[new_owner].rehome().await, 1, "its own lease moves");
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 1);
    assert!(
        c.nodes[holder]
            .renew(
                admission.shared().expect("a shared lease"),
                Duration::from_secs(30)
            )
            .await
    );
    assert_eq!(
        c.pools[new_owner].in_use(BUCKET, 0),
        2,
        "counted where it lives now"
    );
    assert_eq!(
        c.pools[old_owner].in_use(BUCKET, 0),
        0,
        "and released where it was"
    );
}

/// A network on which the ring changes while a grant is on its way back: the owner grants
/// under the old ring, then the new ring is published before the coordinator sees the answer.
struct RingChangesInFlight {
    network: Arc<InMemory>,
    ring: Arc<SharedRing>,
    next: std::sync::Mutex<Option<Ring>>,
}

impl Transport for RingChangesInFlight {
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        let granting = matches!(message, Message::Acquire(_));
        let sent = self.network.send(owner, message);
        Box::pin(async move {
            let reply = sent.await;
            if granting && let Some(ring) = self.next.lock().unwrap().take() {
                self.ring.publish(ring);
            }
            reply
        })
    }
}

/// The grant that raced the ring change is given back to the old owner and the lease is taken
/// from the new one, so the new owner counts it and the old one holds nothing. (Unfenced: a
/// fenced request would find the new owner settling.)
#[tokio::test]
async fn a_grant_that_raced_a_ring_change_is_returned_and_asked_again() {
    let c = cluster(3, config(0, 4, OnUnavailable::Open));
    let old_owner = c.owner();
    let asker = (old_owner + 1) % 3;
    let survivors: Vec<String> = (0..3)
        .filter(|&i| i != old_owner)
        .map(|i| format!("n{}", i + 1))
        .collect();
    let racing = Arc::new(RingChangesInFlight {
        network: Arc::clone(&c.network),
        ring: Arc::clone(&c.ring),
        next: std::sync::Mutex::new(Some(Ring::new(
            survivors.iter().map(|id| Member::owner(id.clone(), 1)),
            DEFAULT_VNODES,
            1,
        ))),
    });
    let node = TwoTier::new(
        &format!("n{}", asker + 1),
        config(0, 4, OnUnavailable::Open),
        Arc::clone(&c.ring),
        racing,
        Arc::clone(&c.owners[asker]),
        c.clock.clone(),
    );
    let admission = node
        .acquire(BUCKET)
        .await
        .expect("admitted by the new owner");
    assert_eq!(admission.tier, Tier::Shared);
    assert_eq!(node.counters.raced.load(Ordering::Relaxed), 1);
    let new_owner = c.owner();
    assert_ne!(new_owner, old_owner);
    assert_eq!(c.pools[old_owner].in_use(BUCKET, 0), 0, "returned");
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 1, "counted");
    node.release(admission).await;
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 0);
}

/// Three coordinators keep taking shared leases (and giving the oldest back every third step)
/// while the bucket's owner leaves the ring at step 20; the handoff runs `lag` steps later, as
/// gossip takes a while to reach every node. Returns the most shared leases live at once.
async fn churn(mode: OnUnavailable, lag: usize) -> usize {
    churn_with(config(0, 4, mode), lag).await.0
}

/// `churn` on `config`: the most shared leases live at once, and the requests refused because
/// the new owner was in its learning period.
async fn churn_with(config: TwoTierConfig, lag: usize) -> (usize, u64) {
    let c = cluster(3, config);
    let mut held: Vec<(usize, ClusterAdmission)> = Vec::new();
    let mut most = 0;
    for step in 0..60 {
        if step == 20 {
            move_bucket(&c);
        }
        if step == 20 + lag {
            for node in &c.nodes {
                node.rehome().await;
            }
        }
        for (i, node) in c.nodes.iter().enumerate() {
            if let Ok(admission) = node.acquire(BUCKET).await {
                assert_eq!(
                    admission.tier,
                    Tier::Shared,
                    "the owner is always reachable"
                );
                held.push((i, admission));
            }
        }
        c.advance(Duration::from_secs(1));
        most = most.max(held.len());
        if step % 3 == 2 && !held.is_empty() {
            let (i, admission) = held.remove(0);
            c.nodes[i].release(admission).await;
        }
    }
    let learning = c
        .nodes
        .iter()
        .map(|node| node.counters.learning.load(Ordering::Relaxed))
        .sum();
    (most, learning)
}

/// Unfenced with a learning period: a new owner grants only once it has held the bucket that
/// long, so a handoff that lags less than it over-admits nothing; the price is the requests
/// refused meanwhile. The table in `docs/benchmarks.md` is this test's output
/// (`cargo test -p weir-cluster --test two_tier learning -- --nocapture`).
#[tokio::test]
async fn a_learning_period_longer_than_the_handoff_lag_keeps_the_ceiling() {
    println!("| learning period | handoff lag 1 s | lag 3 s | lag 10 s |");
    println!("|---|---|---|---|");
    for learning in [0, 2, 5, 12] {
        let mut cells = Vec::new();
        for lag in [1, 3, 10] {
            let config = TwoTierConfig {
                learning_period: Duration::from_secs(learning),
                ..config(0, 4, OnUnavailable::Open)
            };
            let (most, refused) = churn_with(config, lag).await;
            let over = most.saturating_sub(4);
            if learning > lag as u64 {
                assert_eq!(over, 0, "learning {learning} s, lag {lag}: {most} live");
                assert!(refused > 0, "the learning period refuses while it lasts");
            }
            if learning == 0 {
                assert!(over > 0 && refused == 0, "no learning: {most} live");
            }
            cells.push(format!("{over} over, {refused} refused"));
        }
        println!("| {learning} s | {} |", cells.join(" | "));
    }
}

/// Under load and unfenced (`open`), a membership change over-admits nothing when the handoff
/// follows it at once, and at most one `shared_limit` (4 here) while the handoff lags: the new
/// owner starts empty and grants up to its limit until the old leases are re-registered, after
/// which it counts them and grants nothing until the total is back under the limit.
#[tokio::test]
async fn unfenced_under_load_a_membership_change_over_admits_at_most_one_shared_limit() {
    assert_eq!(
        churn(OnUnavailable::Open, 0).await,
        4,
        "handoff at once: the ceiling holds"
    );
    for lag in [1, 3, 10] {
        let most = churn(OnUnavailable::Open, lag).await;
        assert!(
            most > 4 && most <= 8,
            "lag {lag}: {most} live at once (limit 4)"
        );
    }
}

/// Fenced (`closed`), the same churn never has more than the shared limit live, however long
/// the handoff lags (up to past the lease TTL).
#[tokio::test]
async fn fenced_under_load_a_membership_change_never_over_admits() {
    for lag in [0, 1, 3, 10, 35] {
        let most = churn(OnUnavailable::Closed, lag).await;
        assert_eq!(most, 4, "lag {lag}: {most} live at once (limit 4)");
    }
}

/// The churn of `churn` on a `closed` policy, with the census: the bucket's owner steps down at
/// step 20 (it stays a member), each node runs its handoff `lags[i]` steps later (`None`:
/// never, a live member that does not answer), and only then answers the new owner's census
/// — which the new owner starts once its own handoff has run, as a server does. With
/// `unclean`, the new owner has just seen a member depart without stepping down. Returns the
/// most shared leases live at once and the first step at which the new owner granted.
async fn churn_with_census(lags: [Option<usize>; 3], unclean: bool) -> (usize, Option<usize>) {
    use weir_cluster::census::Answer;
    let c = cluster(3, config(0, 4, OnUnavailable::Closed));
    let ids: Vec<String> = (1..=3).map(|i| format!("n{i}")).collect();
    let (mut held, mut most, mut first) = (Vec::new(), 0, None);
    let mut handed = [false; 3];
    let mut new_owner = None;
    for step in 0..60 {
        let now = weir::Clock::now(&c.clock);
        if step == 20 {
            move_bucket(&c);
            new_owner = Some(c.owner());
            if unclean {
                c.owners[c.owner()].departed(false, now);
            }
        }
        if let Some(n) = new_owner {
            for i in 0..3 {
                if !handed[i] && lags[i].is_some_and(|lag| step >= 20 + lag) {
                    c.nodes[i].rehome().await;
                    handed[i] = true;
                    if i == n {
                        c.owners[n].expect(ids.clone());
                    }
                }
            }
            let ring = c.ring.load();
            for i in (0..3).filter(|&i| i != n && handed[i]) {
                let answer = Answer {
                    fingerprint: ring.fingerprint(),
                    quiet: c.owners[i].quiet(now),
                    held: c.nodes[i].held_for(&ids[n], &ring),
                };
                c.owners[n].counted(&ids[i], &answer, now);
            }
        }
        let before = held.len();
        for (i, node) in c.nodes.iter().enumerate() {
            if let Ok(admission) = node.acquire(BUCKET).await {
                held.push((i, admission));
            }
        }
        if step >= 20 && held.len() > before && first.is_none() {
            first = Some(step);
        }
        c.advance(Duration::from_secs(1));
        most = most.max(held.len());
        if step % 3 == 2 && !held.is_empty() {
            let (i, admission) = held.remove(0);
            c.nodes[i].release(admission).await;
        }
    }
    (most, first)
}

/// A planned change of owner with the census: the new owner grants as soon as every member has
/// run its handoff and answered — not a lease TTL (30 s here) later — and never over the
/// ceiling, whatever order the handoffs run in. A member that stays silent, or a member seen
/// departing without stepping down, sends the new owner back to its tenure.
#[tokio::test]
async fn with_the_census_a_planned_change_of_owner_grants_once_everyone_answered() {
    for lags in [[0, 0, 0], [0, 3, 7], [7, 3, 0], [2, 9, 5]] {
        let (most, first) = churn_with_census(lags.map(Some), false).await;
        assert_eq!(most, 4, "lags {lags:?}: {most} live at once (limit 4)");
        let last = 20 + lags.iter().max().unwrap();
        let first = first.expect("granted after the change");
        assert!(
            first <= last + 1 && first < 20 + 30,
            "lags {lags:?}: first grant at step {first}, every handoff in by {last}"
        );
    }
    for (lags, unclean) in [
        ([Some(0), None, Some(0)], false),
        ([Some(0), Some(0), None], false),
        ([Some(0), Some(1), Some(2)], true),
    ] {
        let (most, first) = churn_with_census(lags, unclean).await;
        assert_eq!(most, 4, "lags {lags:?}: {most} live at once (limit 4)");
        assert!(
            first.is_none_or(|first| first >= 20 + 30),
            "lags {lags:?}, unclean {unclean}: granted at step {first:?}, before the tenure"
        );
    }
}

/// A shared lease that expires unreleased is dropped from the coordinator's list by the
/// periodic sweep (in a stable cluster no handoff would ever prune it), and not before.
#[tokio::test]
async fn expired_shared_leases_are_forgotten_by_the_sweep() {
    let c = cluster(2, config(0, 2, OnUnavailable::Closed));
    let coordinator = &c.nodes[(c.owner() + 1) % 2];
    let admission = coordinator.acquire(BUCKET).await.unwrap();
    assert_eq!(admission.tier, Tier::Shared);
    c.advance(Duration::from_secs(29));
    assert_eq!(coordinator.forget_expired(), 0, "still live");
    c.advance(Duration::from_secs(1));
    assert_eq!(
        coordinator.forget_expired(),
        1,
        "expired at 30 s, inclusive"
    );
    assert_eq!(coordinator.forget_expired(), 0);
    // Releasing the forgotten admission is a no-op.
    coordinator.release(admission).await;
}

/// `config` with loans of up to `max_loan` units.
fn lending(shared_limit: u64, max_loan: u64, on_unavailable: OnUnavailable) -> TwoTierConfig {
    TwoTierConfig {
        max_loan,
        ..config(0, shared_limit, on_unavailable)
    }
}

/// Releases every admission on `node`.
async fn release_all(node: &TwoTier<ManualClock, InMemory>, held: Vec<ClusterAdmission>) {
    for admission in held {
        node.release(admission).await;
    }
}

#[tokio::test]
async fn lent_units_keep_the_ceiling_and_a_busy_node_makes_no_call() {
    let c = cluster(3, lending(100, 16, OnUnavailable::Closed));
    let owner = c.owner();
    let node = &c.nodes[(owner + 1) % 3];
    // Four in flight at a time, over and over: the loan grows to cover them, then every
    // admission is a unit taken here.
    for _ in 0..50 {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(node.acquire(BUCKET).await.unwrap());
        }
        release_all(node, held).await;
    }
    let shared = node.counters.shared.load(Ordering::Relaxed);
    let from_loan = node.counters.from_loan.load(Ordering::Relaxed);
    assert_eq!(shared, 200);
    assert!(
        shared - from_loan <= 3,
        "{} calls to the owner for 200 admissions",
        shared - from_loan
    );
    let lent = node.lent();
    assert_eq!(lent.in_use, 0);
    assert!(
        (4..=16).contains(&lent.units),
        "the loan covers the four in flight: {lent:?}"
    );
    assert_eq!(
        c.pools[owner].in_use(BUCKET, 0) as u64,
        lent.units,
        "the owner counts every lent unit as used"
    );
}

#[tokio::test]
async fn with_loans_the_ceiling_is_exact_and_a_recall_frees_idle_units() {
    let c = cluster(3, lending(10, 16, OnUnavailable::Closed));
    let owner = c.owner();
    let (a, b) = (&c.nodes[(owner + 1) % 3], &c.nodes[(owner + 2) % 3]);
    // `a` fills the pool, then puts back most of what it took.
    let mut held = fill(a).await;
    assert_eq!(held.len(), 10, "the whole shared limit, lent");
    assert_eq!(c.pools[owner].in_use(BUCKET, 0), 10);
    release_all(a, held.split_off(2)).await;
    // Near full the owner let it keep nothing idle: the units went straight back.
    assert_eq!(a.lent().units, 2);
    let mut held_b = fill(b).await;
    assert_eq!(held_b.len(), 8, "what `a` gave back is `b`'s");
    assert!(b.acquire(BUCKET).await.unwrap_err().reason.is_full());
    for admission in held_b.drain(..) {
        b.release(admission).await;
    }
    // At every point: no more in flight than the limit, counted on the owner.
    assert!(c.pools[owner].in_use(BUCKET, 0) <= 10);
    release_all(a, held).await;
}

#[tokio::test]
async fn idle_units_elsewhere_are_recalled_at_the_next_renewal() {
    let c = cluster(3, lending(40, 16, OnUnavailable::Closed));
    let owner = c.owner();
    let (a, b) = (&c.nodes[(owner + 1) % 3], &c.nodes[(owner + 2) % 3]);
    // `a` grows a loan of 16, uses it, puts it back and may keep some idle.
    let held = (0..16).map(|_| a.acquire(BUCKET));
    let mut admissions = Vec::new();
    for admission in held {
        admissions.push(admission.await.unwrap());
    }
    release_all(a, admissions).await;
    let idle_at_a = a.lent().units;
    assert!(idle_at_a > 0, "kept idle units: {:?}", a.lent());
    // `b` takes all the rest and one more is refused while `a` holds idle units.
    let held_b = fill(b).await;
    assert_eq!(held_b.len() as u64, 40 - idle_at_a);
    assert_eq!(c.pools[owner].refused_while_lent(), 1);
    // Its loan is not due for renewal yet: an upkeep now changes nothing…
    a.upkeep().await;
    assert_eq!(a.lent().units, idle_at_a);
    // …but once half the loan's margin is spent, `a` renews, hears the recall (keep = 0), and
    // gives back.
    c.advance(weir_cluster::loan::LOAN_MARGIN / 2);
    a.upkeep().await;
    assert_eq!(a.lent().units, 0);
    assert_eq!(
        a.counters.given_back.load(Ordering::Relaxed),
        16,
        "every unit lent to `a` went back"
    );
    let more = fill(b).await;
    assert_eq!(more.len() as u64, idle_at_a, "`b` gets what `a` held idle");
    release_all(b, held_b).await;
    release_all(b, more).await;
}

#[tokio::test]
async fn an_idle_loan_goes_back_whole_and_a_busy_one_is_renewed() {
    let c = cluster(3, lending(100, 16, OnUnavailable::Closed));
    let owner = c.owner();
    let node = &c.nodes[(owner + 1) % 3];
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(node.acquire(BUCKET).await.unwrap());
    }
    let busy = held.pop().unwrap();
    release_all(node, held).await;
    assert!(c.pools[owner].in_use(BUCKET, 0) >= 6);
    // The loan outlives its lease TTL (30 s) as long as upkeep renews it.
    for _ in 0..160 {
        c.advance(weir_cluster::loan::UPKEEP_EVERY);
        node.upkeep().await;
    }
    let now = weir::Clock::now(&c.clock);
    assert!(
        c.pools[owner].in_use(BUCKET, now) >= 1,
        "renewed: still lent"
    );
    let later = node.acquire(BUCKET).await.expect("a lent unit, 40 s in");
    node.release(later).await;
    node.release(busy).await;
    // Put back and idle for a second: the whole loan goes back.
    let mut left = Duration::ZERO;
    while node.lent().loans > 0 {
        c.advance(weir_cluster::loan::UPKEEP_EVERY);
        node.upkeep().await;
        left += weir_cluster::loan::UPKEEP_EVERY;
        assert!(left <= Duration::from_secs(2), "never given back");
    }
    let now = weir::Clock::now(&c.clock);
    assert_eq!(c.pools[owner].in_use(BUCKET, now), 0);
}

#[tokio::test]
async fn a_loan_moves_to_the_new_owner_with_its_units_in_use() {
    let c = cluster(3, lending(10, 16, OnUnavailable::Open));
    let old_owner = c.owner();
    let i = (old_owner + 1) % 3;
    let node = &c.nodes[i];
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(node.acquire(BUCKET).await.unwrap());
    }
    release_all(node, held.split_off(3)).await;
    move_bucket(&c);
    let new_owner = c.owner();
    assert_eq!(node.rehome().await, 1, "one loan moved");
    assert_eq!(c.pools[old_owner].in_use(BUCKET, 0), 0, "given back there");
    assert_eq!(
        c.pools[new_owner].in_use(BUCKET, 0),
        3,
        "the new owner counts the three in use"
    );
    // The rest of the ceiling, and not one more, across the survivors.
    let mut more = 0;
    for (j, other) in c.nodes.iter().enumerate() {
        if j != old_owner {
            more += fill(other).await.len();
        }
    }
    assert_eq!(more, 7);
    release_all(node, held).await;
}

/// A loan whose renewals fell behind: with its idle units too short-lived to take, a request
/// renews it first; and once its owner has dropped it, a request starts another rather than be
/// refused.
#[tokio::test]
async fn a_loan_behind_on_its_renewals_is_renewed_or_replaced_by_the_request() {
    let c = cluster(3, lending(100, 16, OnUnavailable::Open));
    let owner = c.owner();
    let node = &c.nodes[(owner + 1) % 3];
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(node.acquire(BUCKET).await.unwrap());
    }
    release_all(node, held).await;
    assert!(node.lent().units > 0, "idle units kept");
    // No upkeep: past half the margin, the loan has less than a lease TTL left.
    c.advance(weir_cluster::loan::LOAN_MARGIN / 2 + Duration::from_millis(100));
    let renewed = node.acquire(BUCKET).await.expect("renewed, then taken");
    assert_eq!(renewed.tier, Tier::Shared);
    node.release(renewed).await;
    // No upkeep for longer than the loan lives: the owner drops it.
    c.advance(Duration::from_secs(30) + weir_cluster::loan::LOAN_MARGIN);
    c.pools[owner].sweep(weir::Clock::now(&c.clock));
    assert_eq!(c.pools[owner].in_use(BUCKET, weir::Clock::now(&c.clock)), 0);
    let again = node
        .acquire(BUCKET)
        .await
        .expect("a new loan, not a refusal");
    assert_eq!(again.tier, Tier::Shared);
    assert_eq!(c.pools[owner].in_use(BUCKET, weir::Clock::now(&c.clock)), 1);
    node.release(again).await;
}

/// A node's coordinator goes away with units in use (the process restarts, or the policy is
/// replaced) and a new one of the same node takes its place: the new one's loan is its own, so
/// its renewals do not keep the old loan's units counted once that loan expires.
#[tokio::test]
async fn a_new_book_of_a_node_does_not_keep_an_old_books_loan_alive() {
    let c = cluster(3, lending(100, 16, OnUnavailable::Open));
    let owner = c.owner();
    let i = (owner + 1) % 3;
    let gone = [
        c.nodes[i].acquire(BUCKET).await.unwrap(),
        c.nodes[i].acquire(BUCKET).await.unwrap(),
    ];
    let lent_before = c.nodes[i].lent().units;
    assert!(lent_before >= 2);
    // Its successor on the same node: renewed by its upkeep all along.
    let next = TwoTier::new(
        &format!("n{}", i + 1),
        lending(100, 16, OnUnavailable::Open),
        Arc::clone(&c.ring),
        Arc::clone(&c.network),
        Arc::clone(&c.owners[i]),
        c.clock.clone(),
    );
    let held = next.acquire(BUCKET).await.unwrap();
    for _ in 0..140 {
        c.advance(weir_cluster::loan::UPKEEP_EVERY);
        next.upkeep().await;
    }
    // 35 s on, past the old loan's life (30 s + 2 s): only the new book's unit is counted.
    let now = weir::Clock::now(&c.clock);
    assert_eq!(c.pools[owner].in_use(BUCKET, now), 1);
    next.release(held).await;
    drop(gone);
}

/// A `closed` policy's loan handed over to a bucket's new owner is renewed by its holder's
/// upkeep at once, though the new owner grants nothing new until its tenure: the units in use
/// stay counted past the loan's first expiry.
#[tokio::test]
async fn a_handed_over_loan_is_renewed_during_the_new_owners_tenure() {
    let c = cluster(3, lending(10, 16, OnUnavailable::Closed));
    let old_owner = c.owner();
    let node = &c.nodes[(old_owner + 1) % 3];
    let held = node.acquire(BUCKET).await.unwrap();
    move_bucket(&c);
    let new_owner = c.owner();
    assert_eq!(node.rehome().await, 1);
    assert_eq!(c.pools[new_owner].in_use(BUCKET, 0), 1);
    // Past the loan's first expiry (TTL 30 s + 2 s), renewed by each upkeep as it falls due.
    for _ in 0..140 {
        c.advance(weir_cluster::loan::UPKEEP_EVERY);
        node.upkeep().await;
    }
    let now = weir::Clock::now(&c.clock);
    assert_eq!(
        c.pools[new_owner].in_use(BUCKET, now),
        1,
        "still counted, 35 s on"
    );
    node.release(held).await;
}

/// The previous owner's ring can lag the holder's: a holder that has already handed its leases
/// to the new owner must not free them on an old owner that still grants, or both count
/// capacity the other has given out (seen in a rolling restart: the old owner granted the
/// ceiling again beside the leases the new one had taken over). What is in use stays counted
/// on the old owner until it expires or the old owner's ring moves on; a loan's idle units
/// come back at once.
#[tokio::test]
async fn a_handoff_does_not_free_what_is_in_use_on_an_old_owner_that_still_grants() {
    let before = Ring::new(
        [Member::owner("n1", 1), Member::owner("n2", 1)],
        DEFAULT_VNODES,
        1,
    );
    let after = Ring::new(
        ["n1", "n2", "n3"].map(|id| Member::owner(id, 1)),
        DEFAULT_VNODES,
        1,
    );
    let bucket = (0..10_000)
        .map(|i| format!("bucket-{i}"))
        .find(|b| before.owner_of(b) == Some("n2") && after.owner_of(b) == Some("n3"))
        .unwrap();
    for max_loan in [1, 4] {
        let config = match max_loan {
            1 => config(0, 4, OnUnavailable::Open),
            _ => lending(4, max_loan, OnUnavailable::Open),
        };
        let network = Arc::new(InMemory::new());
        let clock = ManualClock::new(0);
        // n2 still runs the ring before; n1 (the holder) and n3 run the one after.
        let n2_ring = Arc::new(SharedRing::new(before.clone()));
        let n1_ring = Arc::new(SharedRing::new(before.clone()));
        let n3_ring = Arc::new(SharedRing::new(after.clone()));
        let (n2_pool, n3_pool) = (
            Arc::new(SharedPool::new(100)),
            Arc::new(SharedPool::new(100)),
        );
        let n2_owner = Arc::new(Owner::new("n2", Arc::clone(&n2_ring), Arc::clone(&n2_pool)));
        network.add("n2", Arc::clone(&n2_owner));
        network.add(
            "n3",
            Arc::new(Owner::new("n3", n3_ring, Arc::clone(&n3_pool))),
        );
        let coordinator = |id: &str, ring: &Arc<SharedRing>, owner: Arc<Owner>| {
            TwoTier::new(
                id,
                config.clone(),
                Arc::clone(ring),
                Arc::clone(&network),
                owner,
                clock.clone(),
            )
        };
        let n1_owner = Arc::new(Owner::new(
            "n1",
            Arc::clone(&n1_ring),
            Arc::new(SharedPool::new(100)),
        ));
        let n1 = coordinator("n1", &n1_ring, n1_owner);
        let n2 = coordinator("n2", &n2_ring, n2_owner);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(n1.acquire(&bucket).await.unwrap());
        }
        n1_ring.publish(after.clone());
        assert_eq!(n1.rehome().await, if max_loan > 1 { 1 } else { 3 });
        assert_eq!(
            n3_pool.in_use(&bucket, 0),
            3,
            "the new owner counts the three in use"
        );
        assert_eq!(
            n2_pool.in_use(&bucket, 0),
            3,
            "the old owner, still owning in its view, keeps counting them (max_loan {max_loan})"
        );
        let granted = fill_bucket(&n2, &bucket).await;
        assert_eq!(
            granted.len(),
            1,
            "only the one unit nobody uses (max_loan {max_loan})"
        );
        // Released where they were handed: the new owner.
        release_all(&n1, held).await;
        assert_eq!(n3_pool.in_use(&bucket, 0), 0);
    }
}
