//! A partition of real links healed: three `weir serve` processes, each in a network namespace
//! of its own, and nine clients on the host holding leases of a `closed` policy through all
//! three while the owner of its bucket is cut away from the other two and let back.
//!
//! Every lease a client held counts from the moment its grant arrived until the moment its
//! release left (never past its TTL counted from the asking): the lease was surely live all
//! that time, so more of them at one instant than the ceiling is the ceiling exceeded, with no
//! allowance for timing. After the heal, once the clients stop, the whole ceiling must be
//! usable again: no unit stays lent to a node that holds nothing.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::netns::Network;
use support::{Server, eventually};
use weir_api::http::ClusterView;

const NODE_LIMIT: usize = 1;
const SHARED_LIMIT: usize = 3;
const LEASE_TTL: Duration = Duration::from_secs(3);
const CONFIG: &str = r#"
[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1, shared_limit = 3, lease_ttl = "3s", on_unavailable = "closed" }
"#;
const KEY: &str = "analytics:group:analytics";
const SECRET: &str = "the partitioned cluster's secret";
const CLIENTS: u64 = 9;
/// Long enough for the majority to find the owner gone and for its interim owner to wait out
/// a loan's TTL and the quorum's margin (`lease_ttl` + 6 s) and grant.
const CUT_FOR: Duration = Duration::from_secs(20);
/// The clients go on this long after the heal: the healed owner's own wait and more.
const AFTER_HEAL: Duration = Duration::from_secs(12);

/// How the owner is cut away.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Its link taken down: nobody reaches it, clients included.
    Link,
    /// Routes dropped between it and the other nodes: its clients still reach it.
    BetweenPeers,
}

/// A lease a client surely held from `from` to `until`, granted through node `node`.
#[derive(Debug, Clone, Copy)]
struct Held {
    node: usize,
    shared: bool,
    from: Instant,
    until: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_of_the_owner_s_link_heals_within_the_ceiling() {
    partition_heals(Cut::Link).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_between_the_owner_and_its_peers_heals_within_the_ceiling() {
    partition_heals(Cut::BetweenPeers).await;
}

async fn partition_heals(cut: Cut) {
    let Some(network) = Network::create(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Server> = (0..3)
        .map(|i| {
            let id = format!("n{}", i + 1);
            Server::start_in(
                &network,
                i,
                (CONFIG, &dir.path().join(&id)),
                (&id, (i > 0).then(|| network.address(0))),
                SECRET,
            )
        })
        .collect();
    converge(&nodes).await;
    settle(&nodes).await;

    let running = Arc::new(AtomicBool::new(true));
    let shared_granted = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|seed| {
            let urls: Vec<String> = nodes.iter().map(|n| n.http.clone()).collect();
            let counts = (Arc::clone(&running), Arc::clone(&shared_granted));
            tokio::spawn(client(urls, seed, counts))
        })
        .collect();
    let owner = owner_of_the_bucket(&nodes).await;
    // The cut comes once the shared tier has been in use: its owner has leases out.
    eventually(
        Duration::from_secs(30),
        "shared leases granted before the cut",
        || async { shared_granted.load(Ordering::Relaxed) >= CLIENTS },
    )
    .await;

    match cut {
        Cut::Link => network.cut_link(owner),
        Cut::BetweenPeers => network.cut_between(owner),
    }
    let cut_at = Instant::now();
    // The partition's length is the scenario, not a wait for a condition.
    tokio::time::sleep(CUT_FOR).await;
    match cut {
        Cut::Link => network.heal_link(owner),
        Cut::BetweenPeers => network.heal_between(owner),
    }
    let healed_at = Instant::now();
    // As long after the heal: the healed owner's own wait and more, the scenario's length.
    tokio::time::sleep(AFTER_HEAL).await;
    running.store(false, Ordering::Relaxed);
    let mut held = Vec::new();
    for client in clients {
        held.extend(client.await.unwrap());
    }

    let (most, at) = most_at_once(held.iter());
    let (most_shared, shared_at) = most_at_once(held.iter().filter(|h| h.shared));
    let ceiling = NODE_LIMIT * 3 + SHARED_LIMIT;
    let live_at = |instant: Instant| -> Vec<String> {
        let since_cut = |t: Instant| t.saturating_duration_since(cut_at).as_millis();
        held.iter()
            .filter(|h| h.from <= instant && instant < h.until)
            .map(|h| {
                let tier = if h.shared { "shared" } else { "node" };
                format!(
                    "n{} {tier} {}–{} ms",
                    h.node + 1,
                    since_cut(h.from),
                    since_cut(h.until)
                )
            })
            .collect()
    };
    assert!(
        most <= ceiling && most_shared <= SHARED_LIMIT,
        "{cut:?} (owner n{}, cut for {CUT_FOR:?}, times from the cut): {most} leases live at \
         once against a ceiling of {ceiling} ({:?}), {most_shared} shared against \
         {SHARED_LIMIT} ({:?})",
        owner + 1,
        live_at(at),
        live_at(shared_at),
    );
    // The run went through what it is about: the majority's interim owner granted during the
    // cut, and the shared tier granted again after the heal.
    let shared_from = |from: Instant, until: Instant, on_majority: bool| {
        held.iter()
            .filter(|h| h.shared && h.from > from && h.from < until)
            .filter(|h| (h.node != owner) == on_majority)
            .count()
    };
    assert!(
        shared_from(cut_at, healed_at, true) > 0,
        "{cut:?}: the majority never granted a shared lease while the owner was cut away"
    );
    assert!(
        shared_from(healed_at, Instant::now(), true)
            + shared_from(healed_at, Instant::now(), false)
            > 0,
        "{cut:?}: no shared lease after the heal"
    );
    eprintln!(
        "{cut:?}: {} leases held, at most {most} at once ({most_shared} shared)",
        held.len()
    );

    // Once the clients have stopped, every unit comes back: what a client could not release
    // runs out with its lease, an unused loan with its TTL.
    eventually(
        LEASE_TTL + Duration::from_secs(12),
        &format!("{cut:?}: the whole ceiling of {ceiling} usable after the heal"),
        || async { usable(&nodes).await == ceiling },
    )
    .await;
}

/// One client: asks a node at random for a lease, holds it 50–300 ms, releases it, again and
/// again while `running`; returns the leases it surely held.
/// Counts the shared leases granted in `shared_granted`. A refused or failed ask is asked again
/// after a short pause: the clients' pacing.
async fn client(
    urls: Vec<String>,
    seed: u64,
    (running, shared_granted): (Arc<AtomicBool>, Arc<AtomicU64>),
) -> Vec<Held> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut random = Random(seed * 7919 + 17);
    let mut held = Vec::new();
    while running.load(Ordering::Relaxed) {
        let node = random.below(urls.len() as u64) as usize;
        let asked = Instant::now();
        let answer = http
            .post(format!("{}/v1/acquire", urls[node]))
            .json(&json!({"policy": "search", "key": KEY}))
            .send()
            .await;
        let Ok(answer) = answer else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if answer.status() != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let from = Instant::now();
        let Ok(body) = answer.json::<Value>().await else {
            continue;
        };
        tokio::time::sleep(Duration::from_millis(50 + random.below(250))).await;
        let until = Instant::now().min(asked + LEASE_TTL);
        let _ = http
            .post(format!("{}/v1/release", urls[node]))
            .json(&json!({"lease": body["lease"]}))
            .send()
            .await;
        let shared = body["tier"] == "shared";
        if shared {
            shared_granted.fetch_add(1, Ordering::Relaxed);
        }
        held.push(Held {
            node,
            shared,
            from,
            until,
        });
    }
    held
}

/// A small generator of the clients' choices: a run is random enough, and no crate is needed.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % bound
    }
}

/// The most of `held` live at one instant, and the first instant they were.
fn most_at_once<'a>(held: impl Iterator<Item = &'a Held>) -> (usize, Instant) {
    let mut edges: Vec<(Instant, i32)> = held
        .filter(|h| h.until > h.from)
        .flat_map(|h| [(h.from, 1), (h.until, -1)])
        .collect();
    // An end before a start at the same instant: a lease released as another is granted is not
    // two at once.
    edges.sort();
    let (mut now, mut most, mut at) = (0i32, 0i32, Instant::now());
    for (instant, step) in edges {
        now += step;
        if now > most {
            (most, at) = (now, instant);
        }
    }
    (most as usize, at)
}

/// Leases granted at once over all three nodes, asked until each refuses; all released after.
async fn usable(nodes: &[Server]) -> usize {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut leases = Vec::new();
    for _ in 0..NODE_LIMIT + SHARED_LIMIT {
        for node in nodes {
            let Ok(answer) = http
                .post(node.url("/v1/acquire"))
                .json(&json!({"policy": "search", "key": KEY}))
                .send()
                .await
            else {
                continue;
            };
            if answer.status() == 200
                && let Ok(body) = answer.json::<Value>().await
            {
                leases.push((node.url("/v1/release"), body["lease"].clone()));
            }
        }
    }
    let granted = leases.len();
    for (url, lease) in leases {
        let _ = http.post(url).json(&json!({"lease": lease})).send().await;
    }
    granted
}

async fn view(server: &Server) -> Option<ClusterView> {
    reqwest::get(server.url("/v1/cluster"))
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Waits until every node sees all three alive in its ring, with what moved handed over.
async fn converge(nodes: &[Server]) {
    eventually(
        Duration::from_secs(60),
        "gossip converging to 3",
        || async {
            for node in nodes {
                let Some(view) = view(node).await else {
                    return false;
                };
                let alive = view.members.iter().filter(|m| m.state == "alive").count();
                if alive != 3 || view.ring.members != 3 || !view.ring.handed_over {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// Waits out the owners' tenure: a `closed` owner grants once it has held a bucket one loan's
/// TTL (`lease_ttl` and 2 s) plus the quorum's margin (4 s).
async fn settle(nodes: &[Server]) {
    let tenure = LEASE_TTL + Duration::from_secs(6);
    eventually(
        tenure + Duration::from_secs(60),
        "the owners' tenure",
        || async {
            for node in nodes {
                match view(node).await {
                    Some(view) if Duration::from_millis(view.ring.unchanged_for_ms) >= tenure => {}
                    _ => return false,
                }
            }
            true
        },
    )
    .await;
}

/// The node owning the bucket's leases, once the clients have made it known.
async fn owner_of_the_bucket(nodes: &[Server]) -> usize {
    let owner = std::sync::Mutex::new(None);
    eventually(
        Duration::from_secs(10),
        "a node owning the bucket",
        || async {
            for (i, node) in nodes.iter().enumerate() {
                if view(node)
                    .await
                    .is_some_and(|v| v.counters.buckets_owned > 0)
                {
                    *owner.lock().unwrap() = Some(i);
                    return true;
                }
            }
            false
        },
    )
    .await;
    owner.into_inner().unwrap().unwrap()
}
