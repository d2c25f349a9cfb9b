//! The cluster at scale on turmoil's simulated network: N nodes, from 3 to 50, each an owner
//! and a coordinator speaking the real gRPC protocol (batched per owner), under a load of many
//! keys (20 buckets, each visited by every node every 100 ms: cold keys, spread thin). Midway a
//! member leaves gracefully and a new one joins (each node hands its leases and loans over when
//! its ring changes), and links fail now and then. The policy is `closed`. Every admission
//! checks its bucket's ceiling; each run, with loans and without, reports the calls one node
//! makes to another per admission, the over-admission, the refusals, and the admission latency
//! in simulated time.
//!
//! `cargo test -p weir-cluster --test scale -- --nocapture` prints the table that
//! `docs/benchmarks.md` shows.

mod sim_net;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use weir::policy::OnUnavailable;
use weir::{Clock, Nanos, TokioClock};
use weir_cluster::admission::{TwoTier, TwoTierConfig};
use weir_cluster::batch::Batching;
use weir_cluster::loan::{LOAN_MARGIN, UPKEEP_EVERY};
use weir_cluster::owner::Owner;
use weir_cluster::pool::{Grant, SharedPool};
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::transport::{BoxFuture, LeaseRequest, Transport, TransportError};

/// Buckets the load spreads over, and each one's shared limit.
const BUCKETS: usize = 20;
const SHARED_LIMIT: u64 = 16;
const LEASE_TTL: Duration = Duration::from_secs(2);
/// Each node asks once every this long, and an admitted request holds its unit this long.
const EVERY: Duration = Duration::from_millis(5);
const HOLD: Duration = Duration::from_millis(20);
/// The load runs from `START` (the owners have settled into their buckets: a `closed` policy's
/// owner grants once it has held a bucket for a loan's lifetime) to `END`; a member leaves at
/// `LEAVE` and another joins at `JOIN`.
const START: Duration = LEASE_TTL
    .saturating_add(LOAN_MARGIN)
    .saturating_add(Duration::from_millis(100));
const LEAVE: Duration = START.saturating_add(Duration::from_millis(1_500));
const JOIN: Duration = LEAVE.saturating_add(Duration::from_millis(1_500));
const END: Duration = JOIN.saturating_add(Duration::from_millis(1_500));

/// Counts the calls a node's transport makes to other nodes.
struct Counting<T> {
    inner: T,
    calls: Arc<AtomicU64>,
}

impl<T: Transport> Counting<T> {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl<T: Transport> Transport for Counting<T> {
    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        self.count();
        self.inner.acquire(owner, request)
    }
    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.count();
        self.inner.release(owner, bucket, lease)
    }
    fn adopt(
        &self,
        owner: &str,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> BoxFuture<'_, Result<u64, TransportError>> {
        self.count();
        self.inner
            .adopt(owner, bucket, holder, expires_at, units, lent)
    }
    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.count();
        self.inner.give_back(owner, bucket, lease, units)
    }
    fn renew(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: Nanos,
        fenced: bool,
    ) -> BoxFuture<'_, Result<bool, TransportError>> {
        self.count();
        self.inner.renew(owner, bucket, lease, ttl, now, fenced)
    }
    fn acquire_batch(
        &self,
        owner: &str,
        requests: Vec<LeaseRequest>,
    ) -> BoxFuture<'_, Vec<Result<Grant, TransportError>>> {
        self.count();
        self.inner.acquire_batch(owner, requests)
    }
    fn release_batch(
        &self,
        owner: &str,
        leases: Vec<(String, u64)>,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.count();
        self.inner.release_batch(owner, leases)
    }
}

type Node = TwoTier<TokioClock, Batching<Counting<weir_cluster::grpc::GrpcTransport<TokioClock>>>>;

/// What every node saw, added up.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    refused: AtomicU64,
    calls: Arc<AtomicU64>,
    /// `admitted` and `calls` when the membership first changed: the stable part of the run.
    stable: std::sync::Mutex<(u64, u64)>,
    /// Admitted requests in flight per bucket, and the most ever over the limit.
    in_flight: Vec<AtomicU64>,
    over: AtomicU64,
    /// Admission latencies while the membership is stable, in simulated microseconds.
    latencies: std::sync::Mutex<Vec<u64>>,
    changed: std::sync::atomic::AtomicBool,
}

/// One run's row.
#[derive(Debug)]
struct Row {
    nodes: usize,
    max_loan: u64,
    admitted: u64,
    refused: u64,
    /// While the membership is stable.
    calls_per_admission: f64,
    over: u64,
    p50_us: u64,
    p99_us: u64,
}

fn ring_of(ids: &[String]) -> Ring {
    Ring::new(
        ids.iter().map(|id| Member::owner(id.clone(), 1)),
        DEFAULT_VNODES,
        1,
    )
}

fn bucket(i: usize) -> String {
    format!("tenant-{i:02}")
}

/// Runs `n` nodes (and one more that joins) with loans of up to `max_loan`.
fn run(n: usize, max_loan: u64) -> Row {
    let ids: Vec<String> = (1..=n + 1).map(|i| format!("n{i}")).collect();
    let first: Vec<String> = ids[..n].to_vec();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(END + Duration::from_secs(2))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(2))
        .fail_rate(0.000_5)
        .repair_rate(0.5)
        .rng_seed(0x5ca1e + n as u64)
        .build();
    let tally = Arc::new(Tally {
        in_flight: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        ..Tally::default()
    });
    let views: Vec<Arc<SharedRing>> = ids
        .iter()
        .map(|_| Arc::new(SharedRing::new(ring_of(&first))))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let (id, ids, view, tally) = (
            id.clone(),
            ids.clone(),
            Arc::clone(&views[i]),
            Arc::clone(&tally),
        );
        // n2 leaves at LEAVE; the last node joins at JOIN.
        let (from, until) = match i {
            1 => (START, LEAVE),
            i if i == n => (JOIN, END),
            _ => (START, END),
        };
        sim.host(id.clone(), move || {
            let (id, ids, view, tally) = (
                id.clone(),
                ids.clone(),
                Arc::clone(&view),
                Arc::clone(&tally),
            );
            async move {
                let owner = Arc::new(Owner::new(
                    &id,
                    Arc::clone(&view),
                    Arc::new(SharedPool::new(10_000)),
                ));
                let node: Arc<Node> = Arc::new(TwoTier::new(
                    &id,
                    TwoTierConfig {
                        node_limit: 0,
                        shared_limit: SHARED_LIMIT,
                        lease_ttl: LEASE_TTL,
                        on_unavailable: OnUnavailable::Closed,
                        acquire_timeout: Duration::from_millis(200),
                        max_keys: 1000,
                        max_loan,
                        learning_period: Duration::ZERO,
                    },
                    Arc::clone(&view),
                    Arc::new(Batching::new(Arc::new(Counting {
                        inner: sim_net::transport(ids.iter().map(String::as_str)),
                        calls: Arc::clone(&tally.calls),
                    }))),
                    Arc::clone(&owner),
                    TokioClock::new(),
                ));
                let serving = Arc::clone(&owner);
                tokio::spawn(async move {
                    let _ = sim_net::serve(serving).await;
                });
                // The server's tickers: the owner's beat, and the loans' upkeep.
                let (beating, upkeeping) = (Arc::clone(&owner), Arc::clone(&node));
                tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(Duration::from_millis(100));
                    loop {
                        ticks.tick().await;
                        beating.beat(TokioClock::new().now());
                    }
                });
                tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(UPKEEP_EVERY);
                    loop {
                        ticks.tick().await;
                        upkeeping.upkeep().await;
                    }
                });
                load(&id, node, view, tally, from, until).await;
                // Stay up as an owner (and to hand over) until the simulation ends.
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let mut left = false;
    let mut joined = false;
    // Every host runs forever: the run ends once the last held requests are back.
    while sim.elapsed() < END + HOLD * 10 {
        sim.step().unwrap();
        let now = sim.elapsed();
        if !left && now >= LEAVE {
            left = true;
            tally.changed.store(true, Ordering::SeqCst);
            *tally.stable.lock().unwrap() = (
                tally.admitted.load(Ordering::SeqCst),
                tally.calls.load(Ordering::SeqCst),
            );
            let rest: Vec<String> = first.iter().filter(|id| *id != "n2").cloned().collect();
            for view in &views {
                view.publish(ring_of(&rest));
            }
        }
        if !joined && now >= JOIN {
            joined = true;
            let rest: Vec<String> = ids.iter().filter(|id| *id != "n2").cloned().collect();
            for view in &views {
                view.publish(ring_of(&rest));
            }
        }
    }
    let mut latencies = tally.latencies.lock().unwrap().clone();
    latencies.sort_unstable();
    assert!(!latencies.is_empty(), "nothing admitted while stable");
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let (stable_admitted, stable_calls) = *tally.stable.lock().unwrap();
    Row {
        nodes: n,
        max_loan,
        admitted: tally.admitted.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        calls_per_admission: stable_calls as f64 / stable_admitted.max(1) as f64,
        over: tally.over.load(Ordering::Relaxed),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

/// One node's load: a request every `EVERY` from `from` to `until`, each for one of the
/// buckets in turn (offset per node), held `HOLD`; rehomes when its view of the ring changes.
async fn load(
    id: &str,
    node: Arc<Node>,
    view: Arc<SharedRing>,
    tally: Arc<Tally>,
    from: Duration,
    until: Duration,
) {
    let origin = Instant::now();
    tokio::time::sleep(from).await;
    let mut generation = view.load_versioned().0;
    let offset: usize = id[1..].parse().unwrap();
    let mut ticks = tokio::time::interval(EVERY);
    let mut k = offset * 7;
    while origin.elapsed() < until {
        ticks.tick().await;
        let seen = view.load_versioned().0;
        if seen != generation {
            generation = seen;
            let node = Arc::clone(&node);
            tokio::spawn(async move { node.rehome().await });
        }
        k += 1;
        let b = k % BUCKETS;
        let node = Arc::clone(&node);
        let tally = Arc::clone(&tally);
        tokio::spawn(async move {
            let asked = Instant::now();
            match node.acquire(&bucket(b)).await {
                Ok(admission) => {
                    if !tally.changed.load(Ordering::SeqCst) {
                        let took = asked.elapsed().as_micros() as u64;
                        tally.latencies.lock().unwrap().push(took);
                    }
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                    let now = tally.in_flight[b].fetch_add(1, Ordering::SeqCst) + 1;
                    tally
                        .over
                        .fetch_max(now.saturating_sub(SHARED_LIMIT), Ordering::SeqCst);
                    tokio::time::sleep(HOLD).await;
                    tally.in_flight[b].fetch_sub(1, Ordering::SeqCst);
                    node.release(admission).await;
                }
                Err(_) => {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

#[test]
fn from_3_to_50_nodes_the_ceiling_holds_and_the_calls_per_admission_stay_bounded() {
    println!(
        "| nodes | max_loan | admitted | refused | calls per admission (stable) | over the limit | p50 (stable) | p99 (stable) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    // `WEIR_SCALE_NODES=3,10` runs fewer sizes while working on it.
    let sizes: Vec<usize> = std::env::var("WEIR_SCALE_NODES")
        .unwrap_or_else(|_| "3,10,25,50".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("a number of nodes"))
        .collect();
    for n in sizes {
        for max_loan in [1, 16] {
            let row = run(n, max_loan);
            println!(
                "| {} | {} | {} | {} | {:.3} | {} | {} µs | {} µs |",
                row.nodes,
                row.max_loan,
                row.admitted,
                row.refused,
                row.calls_per_admission,
                row.over,
                row.p50_us,
                row.p99_us
            );
            assert_eq!(row.over, 0, "{row:?}");
            assert!(row.admitted > 0, "{row:?}");
            // A lease costs two calls at most (taken, given back), whatever the cluster's size;
            // loans cost no more, with their renewals.
            assert!(row.calls_per_admission <= 2.2, "{row:?}");
            rows.push(row);
        }
    }
}
