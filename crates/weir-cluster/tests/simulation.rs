//! Deterministic network simulation (turmoil): three owners and a coordinator on a simulated
//! network, speaking the real gRPC protocol through the batching transport, while the test
//! partitions, delays and drops what passes between them. Time is the simulation's.

mod sim_net;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use weir::policy::OnUnavailable;
use weir::{Clock, TokioClock};
use weir_cluster::admission::{ClusterAdmission, Tier, TwoTier, TwoTierConfig};
use weir_cluster::batch::Batching;
use weir_cluster::grpc::GrpcTransport;
use weir_cluster::in_memory::InMemory;
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};

const OWNERS: [&str; 3] = ["n1", "n2", "n3"];
const BUCKET: &str = "analytics:group:analytics";
const SHARED_LIMIT: u64 = 4;
const LEASE_TTL: Duration = Duration::from_secs(30);

fn ring() -> Ring {
    Ring::new(
        OWNERS.iter().map(|id| Member::owner(*id, 1)),
        DEFAULT_VNODES,
        1,
    )
}

/// A simulation whose links deliver within 10 ms, from a fixed seed. turmoil's defaults (a
/// random seed, up to 100 ms a message) let a first acquire — a TCP and HTTP/2 handshake, then
/// the request — now and then outlast the 200 ms acquire timeout, and a test that meant to hold
/// messages found its very first request failed open.
fn quick_links() -> turmoil::Builder {
    let mut builder = turmoil::Builder::new();
    builder
        .max_message_latency(Duration::from_millis(10))
        .rng_seed(0x5eed);
    builder
}

/// One owner host, as the test sees it from outside.
struct OwnerHost {
    pool: Arc<SharedPool>,
    owner: Arc<Owner>,
    /// Its own view of the ring.
    ring: Arc<SharedRing>,
    /// While set, its beats stop: the process is "stopped" (its links held by the test).
    stopped: Arc<AtomicBool>,
}

/// Registers the three owners, each beating every 100 ms as a server does; returns them, by
/// node id.
fn owners(sim: &mut turmoil::Sim<'_>) -> HashMap<&'static str, OwnerHost> {
    let mut hosts = HashMap::new();
    for id in OWNERS {
        let pool = Arc::new(SharedPool::new(1000));
        let ring = Arc::new(SharedRing::new(ring()));
        let owner = Arc::new(Owner::new(id, Arc::clone(&ring), Arc::clone(&pool)));
        let stopped = Arc::new(AtomicBool::new(false));
        hosts.insert(
            id,
            OwnerHost {
                pool,
                owner: Arc::clone(&owner),
                ring,
                stopped: Arc::clone(&stopped),
            },
        );
        sim.host(id, move || {
            let (owner, stopped) = (Arc::clone(&owner), Arc::clone(&stopped));
            async move {
                let beating = Arc::clone(&owner);
                tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(Duration::from_millis(100));
                    loop {
                        ticks.tick().await;
                        if !stopped.load(Ordering::Relaxed) {
                            beating.beat(TokioClock::new().now());
                        }
                    }
                });
                sim_net::serve(owner, None).await
            }
        });
    }
    hosts
}

/// A coordinator `holder` reaching the owners over the simulated network, batched per owner.
fn coordinator(
    holder: &str,
    on_unavailable: OnUnavailable,
) -> TwoTier<TokioClock, Batching<GrpcTransport<TokioClock>>> {
    viewing(holder, on_unavailable, Arc::new(SharedRing::new(ring())))
}

/// A coordinator `holder` with its own view of the ring, `view`.
fn viewing(
    holder: &str,
    on_unavailable: OnUnavailable,
    view: Arc<SharedRing>,
) -> TwoTier<TokioClock, Batching<GrpcTransport<TokioClock>>> {
    lending(holder, on_unavailable, view, 1)
}

/// A coordinator `holder` with its own view of the ring, `view`, whose owners lend it up to
/// `max_loan` units at once.
fn lending(
    holder: &str,
    on_unavailable: OnUnavailable,
    view: Arc<SharedRing>,
    max_loan: u64,
) -> TwoTier<TokioClock, Batching<GrpcTransport<TokioClock>>> {
    let grpc = sim_net::transport(OWNERS);
    TwoTier::new(
        holder,
        TwoTierConfig {
            node_limit: 0,
            shared_limit: SHARED_LIMIT,
            lease_ttl: LEASE_TTL,
            on_unavailable,
            acquire_timeout: Duration::from_millis(200),
            max_keys: 1000,
            max_loan,
            learning_period: Duration::ZERO,
        },
        Arc::clone(&view),
        Arc::new(Batching::new(Arc::new(grpc))),
        // A coordinator that owns nothing: its pool is never asked.
        Arc::new(Owner::new(holder, view, Arc::new(SharedPool::new(1)))),
        TokioClock::new(),
    )
}

fn owner_of_bucket() -> &'static str {
    let owner = ring().owner_of(BUCKET).unwrap().to_owned();
    OWNERS.into_iter().find(|id| *id == owner).unwrap()
}

/// Takes shared leases until refused.
async fn fill<T: weir_cluster::transport::Transport>(
    node: &TwoTier<TokioClock, T>,
) -> Vec<ClusterAdmission> {
    let mut held = Vec::new();
    while let Ok(admission) = node.acquire(BUCKET).await {
        assert_eq!(admission.tier, Tier::Shared);
        held.push(admission);
        assert!(held.len() <= SHARED_LIMIT as usize, "over the shared limit");
    }
    held
}

/// A partition between the coordinator and the owner: `open` admits and counts each one,
/// `closed` refuses naming the limit it could not check; after the repair the shared limit is
/// exact again and a release lets exactly one in.
#[test]
fn a_partition_fails_open_or_closed_and_the_ceiling_returns_after_the_repair() {
    let mut sim = quick_links()
        .simulation_duration(Duration::from_secs(60))
        .build();
    let hosts = owners(&mut sim);
    let owner = owner_of_bucket();
    let pool = Arc::clone(&hosts[owner].pool);
    sim.client("c1", async move {
        let open = coordinator("c1", OnUnavailable::Open);
        let closed = coordinator("c1", OnUnavailable::Closed);
        let mut held = fill(&open).await;
        assert_eq!(held.len(), SHARED_LIMIT as usize);
        let refused = open.acquire(BUCKET).await.unwrap_err();
        assert_eq!(refused.reason.to_string(), "reached its shared limit of 4");

        turmoil::partition("c1", owner);
        let failed_open = open.acquire(BUCKET).await.expect("fails open");
        assert_eq!(failed_open.tier, Tier::FailOpen);
        assert_eq!(open.counters.fail_open.load(Ordering::Relaxed), 1);
        let refused = closed.acquire(BUCKET).await.unwrap_err();
        assert_eq!(
            refused.reason.to_string(),
            "could not check its shared limit of 4"
        );

        turmoil::repair("c1", owner);
        // The partition broke the connection; until the channel has reconnected, calls still
        // fail open (and are counted). Then the owner answers again: full.
        let mut answered = None;
        for _ in 0..100 {
            match open.acquire(BUCKET).await {
                Ok(admission) if admission.tier == Tier::FailOpen => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(admission) => panic!("over the shared limit: {admission:?}"),
                Err(refused) => {
                    answered = Some(refused);
                    break;
                }
            }
        }
        let refused = answered.expect("the owner answers again after the repair");
        assert_eq!(refused.reason.to_string(), "reached its shared limit of 4");
        open.release(held.pop().unwrap()).await;
        // The release is on its way; the next acquire takes the freed lease once it landed.
        let mut again = open.acquire(BUCKET).await;
        for _ in 0..10 {
            if again.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            again = open.acquire(BUCKET).await;
        }
        assert_eq!(again.expect("the freed lease").tier, Tier::Shared);
        assert!(open.acquire(BUCKET).await.is_err(), "exactly one came back");
        let now = TokioClock::new().now();
        assert_eq!(pool.in_use(BUCKET, now), SHARED_LIMIT as usize);
        Ok(())
    });
    sim.run().unwrap();
}

/// Messages held past the acquire timeout: the coordinator gives up (and fails open), and the
/// grant that arrives after it stopped waiting is given back, so the owner does not count a
/// lease nobody holds.
#[test]
fn a_grant_delayed_past_the_timeout_is_given_back() {
    let mut sim = quick_links()
        .simulation_duration(Duration::from_secs(60))
        .build();
    let hosts = owners(&mut sim);
    let owner = owner_of_bucket();
    let pool = Arc::clone(&hosts[owner].pool);
    sim.client("c1", async move {
        let open = coordinator("c1", OnUnavailable::Open);
        // Connect first, so the held messages are the request itself.
        let first = open.acquire(BUCKET).await.unwrap();
        assert_eq!(first.tier, Tier::Shared);
        turmoil::hold("c1", owner);
        let late = open.acquire(BUCKET).await.unwrap();
        assert_eq!(late.tier, Tier::FailOpen, "gave up after 200 ms");
        turmoil::release("c1", owner);
        // Let the held request reach the owner and its grant come back to nobody.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = TokioClock::new().now();
        assert_eq!(
            pool.in_use(BUCKET, now),
            1,
            "only the first lease is counted"
        );
        open.release(first).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(pool.in_use(BUCKET, TokioClock::new().now()), 0);
        Ok(())
    });
    sim.run().unwrap();
}

/// Links that fail and repair at random (seeded): whatever the network does, the owner never
/// counts more than the shared limit nor the coordinator holds more, and the failures do reach
/// the coordinator (some asks find the owner unreachable) while admissions still happen. Odd
/// seeds run with loans (the owner lends up to 16 units at once).
#[test]
fn random_link_failures_never_break_the_limit() {
    let mut unavailable = 0;
    for seed in 0..4u64 {
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(120))
            .fail_rate(0.05)
            .repair_rate(0.5)
            .rng_seed(seed)
            .build();
        let hosts = owners(&mut sim);
        let owner = owner_of_bucket();
        let pool = Arc::clone(&hosts[owner].pool);
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen_here = Arc::clone(&seen);
        sim.client("c1", async move {
            let max_loan = if seed % 2 == 1 { 16 } else { 1 };
            let view = Arc::new(SharedRing::new(ring()));
            let node = lending("c1", OnUnavailable::Closed, view, max_loan);
            // Fenced: the owners grant once they have been up for one lease TTL (a loan's).
            tokio::time::sleep(LEASE_TTL + weir_cluster::loan::LOAN_MARGIN).await;
            let mut held: Vec<ClusterAdmission> = Vec::new();
            let mut admitted = 0;
            for step in 0..400u32 {
                if step % 3 == 2 && !held.is_empty() {
                    node.release(held.remove(0)).await;
                } else if let Ok(admission) = node.acquire(BUCKET).await {
                    held.push(admission);
                    admitted += 1;
                }
                let now = TokioClock::new().now();
                assert!(pool.in_use(BUCKET, now) <= SHARED_LIMIT as usize);
                assert!(held.len() <= SHARED_LIMIT as usize);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(admitted > 0, "seed {seed}: nothing was ever admitted");
            for admission in held.drain(..) {
                node.release(admission).await;
            }
            seen_here.store(
                node.counters.unavailable.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
            Ok(())
        });
        sim.run().unwrap();
        unavailable += seen.load(Ordering::Relaxed);
    }
    assert!(
        unavailable > 0,
        "the failures never reached the coordinator"
    );
}

/// The three owners without `left`.
fn ring_without(left: &str) -> Ring {
    Ring::new(
        OWNERS
            .iter()
            .filter(|id| **id != left)
            .map(|id| Member::owner(*id, 1)),
        DEFAULT_VNODES,
        1,
    )
}

/// The owner of the bucket is stopped (its links held, its clock running on without it) for
/// longer than the lease TTL, while it holds two shared permits itself. The others move the
/// bucket to a new owner, which learns the leases handed over but not the stopped owner's own:
/// it grants nothing until one TTL has passed. When the stopped owner resumes, its own view
/// still names it the owner, and the very first thing it does — before its ticker runs — is
/// to admit a request of its own: it notices the gap in its beats and refuses, instead of
/// granting from a pool whose leases all expired while another owner granted them again.
#[test]
fn a_stopped_owner_neither_has_its_permits_regranted_nor_grants_after_it_resumes() {
    let mut sim = quick_links()
        .simulation_duration(Duration::from_secs(200))
        .build();
    let hosts = owners(&mut sim);
    let stopped_id = owner_of_bucket();
    let (stopped_owner, stopped_ring, stopped) = {
        let host = &hosts[stopped_id];
        (
            Arc::clone(&host.owner),
            Arc::clone(&host.ring),
            Arc::clone(&host.stopped),
        )
    };
    let other_rings: Vec<Arc<SharedRing>> = OWNERS
        .iter()
        .filter(|id| **id != stopped_id)
        .map(|id| Arc::clone(&hosts[id].ring))
        .collect();
    sim.client("c1", async move {
        tokio::time::sleep(LEASE_TTL).await;
        let view = Arc::new(SharedRing::new(ring()));
        let c1 = viewing("c1", OnUnavailable::Closed, Arc::clone(&view));
        // The stopped owner's own admissions: its pool, no hop.
        let own = TwoTier::new(
            stopped_id,
            TwoTierConfig {
                node_limit: 0,
                shared_limit: SHARED_LIMIT,
                lease_ttl: LEASE_TTL,
                on_unavailable: OnUnavailable::Closed,
                acquire_timeout: Duration::from_millis(200),
                max_keys: 1000,
                max_loan: 1,
                learning_period: Duration::ZERO,
            },
            Arc::clone(&stopped_ring),
            Arc::new(InMemory::new()),
            Arc::clone(&stopped_owner),
            TokioClock::new(),
        );
        let mut own_held = vec![
            own.acquire(BUCKET).await.unwrap(),
            own.acquire(BUCKET).await.unwrap(),
        ];
        let mut c1_held = vec![
            c1.acquire(BUCKET).await.unwrap(),
            c1.acquire(BUCKET).await.unwrap(),
        ];
        assert!(c1.acquire(BUCKET).await.is_err(), "the shared limit is 4");

        // Stopped: no beats, no messages in or out.
        stopped.store(true, Ordering::Relaxed);
        turmoil::hold("c1", stopped_id);
        for ring in other_rings.iter().chain([&view]) {
            ring.publish(ring_without(stopped_id));
        }
        c1.rehome().await;
        let refused = c1.acquire(BUCKET).await.unwrap_err();
        assert!(
            refused
                .reason
                .to_string()
                .contains("took it over too recently"),
            "{}",
            refused.reason
        );
        // One TTL later every lease granted before the stop has expired (the stopped owner's
        // own two included): the new owner grants the whole shared limit.
        tokio::time::sleep(LEASE_TTL + Duration::from_secs(5)).await;
        c1_held.clear();
        while let Ok(admission) = c1.acquire(BUCKET).await {
            c1_held.push(admission);
            assert!(c1_held.len() <= SHARED_LIMIT as usize);
        }
        assert_eq!(c1_held.len(), SHARED_LIMIT as usize);

        // Resumed: before its ticker runs, it admits a request of its own.
        own_held.clear();
        stopped.store(false, Ordering::Relaxed);
        turmoil::release("c1", stopped_id);
        let refused = own.acquire(BUCKET).await.unwrap_err();
        assert!(
            refused
                .reason
                .to_string()
                .contains("took it over too recently"),
            "the resumed owner granted over the new owner's {} leases: {}",
            c1_held.len(),
            refused.reason
        );
        Ok(())
    });
    sim.run().unwrap();
}
