//! Cluster mode with three real `weir serve` processes on loopback, joined by gossip.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_api::http::ClusterView;

use serde_json::{Value, json};
use support::{Server, counter, eventually, free_udp, holds_for, is_ready};

const CONFIG: &str = r#"
[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1, shared_limit = 2, lease_ttl = "10s", on_unavailable = "closed" }

[[policy]]
name = "reports"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 3, lease_ttl = "10s", on_unavailable = "closed" }
"#;

/// Waits until every node has seen its ring unchanged for `held`: each has then owned each of
/// its buckets at least that long (`ring.unchanged_for_ms`, the shortest tenure of any).
async fn held_for(servers: &[&Server], held: Duration, what: &str) {
    eventually(held + Duration::from_secs(60), what, || async {
        for server in servers {
            let unchanged = Duration::from_millis(view(server).await.ring.unchanged_for_ms);
            if unchanged < held {
                return false;
            }
        }
        true
    })
    .await;
}

/// Waits out the owners' tenure: a `closed` policy's owner grants once it has held a bucket for
/// one loan's TTL (`lease_ttl` and 2 s) plus the quorum's margin (4 s).
async fn settle(servers: &[&Server], lease_ttl: Duration) {
    let tenure = lease_ttl + Duration::from_secs(6);
    held_for(servers, tenure, "the owners' tenure reaching a loan's TTL").await;
}

/// The test cluster's secret.
const SECRET: &str = "three nodes share this secret";

/// Three nodes on `config`, n2 and n3 joining through n1, gossiping until each sees all three.
async fn three_nodes(dir: &std::path::Path, config: &str) -> [Server; 3] {
    three_nodes_on(dir, [config, config, config]).await
}

/// Three nodes, each on its own config (a config change rolling through).
async fn three_nodes_on(dir: &std::path::Path, configs: [&str; 3]) -> [Server; 3] {
    three_nodes_through(dir, configs, &free_udp()).await
}

/// Three nodes, each on its own config, n1 gossiping on `seed`.
async fn three_nodes_through(dir: &std::path::Path, configs: [&str; 3], seed: &str) -> [Server; 3] {
    let node = |id: &str, config: &str, gossip: &str, join: Option<&str>| {
        start_node(dir, id, config, gossip, join)
    };
    let nodes = [
        node("n1", configs[0], seed, None),
        node("n2", configs[1], &free_udp(), Some(seed)),
        node("n3", configs[2], &free_udp(), Some(seed)),
    ];
    converge(&[&nodes[0], &nodes[1], &nodes[2]], 3).await;
    nodes
}

/// Node `id` on `config`, gossiping on `gossip` and joining through `join`.
fn start_node(
    dir: &std::path::Path,
    id: &str,
    config: &str,
    gossip: &str,
    join: Option<&str>,
) -> Server {
    // Every node proves it knows the secret and its calls carry the token derived from it:
    // these tests run the whole cluster through that check.
    support::cluster_member(config, &dir.join(id), (id, gossip, join), SECRET)
}

/// `/v1/cluster`, read with the API's own type: the shape is the one documented.
async fn view(server: &Server) -> ClusterView {
    reqwest::get(server.url("/v1/cluster"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The members `server` sees answer (a voter it no longer sees is listed too, as suspect).
async fn members(server: &Server) -> usize {
    let view = view(server).await;
    assert_eq!(view.mode, "cluster");
    live(&view)
}

/// The members `view` lists that answer: alive, or leaving.
fn live(view: &ClusterView) -> usize {
    view.members
        .iter()
        .filter(|m| m.state == "alive" || m.state == "leaving")
        .count()
}

/// Waits until every server sees `count` members, has rebuilt its ring from them and has had
/// every member's answer on it (each has handed over what the ring moved).
async fn converge(servers: &[&Server], count: usize) {
    eventually(
        Duration::from_secs(60),
        &format!("gossip converging to {count}"),
        || async {
            for server in servers {
                let view = view(server).await;
                assert_eq!(view.mode, "cluster");
                if live(&view) != count || view.ring.members != count {
                    return false;
                }
                if !view.ring.handed_over {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

async fn acquire(server: &Server) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": "search", "key": "analytics:group:analytics"}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_hold_the_cluster_wide_ceiling_and_survive_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let [n1, n2, n3] = three_nodes(dir.path(), CONFIG).await;
    settle(&[&n1, &n2, &n3], Duration::from_secs(10)).await;

    // Another policy's shared pool for the same key is counted apart: filled first, it takes
    // nothing from `search`'s below.
    for (i, server) in [&n1, &n2, &n3, &n1].into_iter().enumerate() {
        let response = reqwest::Client::new()
            .post(server.url("/v1/acquire"))
            .json(&json!({"policy": "reports", "key": "analytics:group:analytics"}))
            .send()
            .await
            .unwrap();
        let expected = if i < 3 { 200 } else { 429 };
        assert_eq!(
            response.status().as_u16(),
            expected,
            "{}",
            response.text().await.unwrap()
        );
    }

    // node_limit × 3 + shared_limit = 1 × 3 + 2 = 5, whichever nodes the requests enter.
    let mut tiers = Vec::new();
    let mut refusals = 0;
    let mut shared_lease = None;
    for round in 0..4 {
        for server in [&n1, &n2, &n3] {
            let (status, body) = acquire(server).await;
            match status {
                200 => {
                    let tier = body["tier"].as_str().unwrap().to_owned();
                    if tier == "shared" && shared_lease.is_none() {
                        shared_lease = Some((server.url("/v1/renew"), body["lease"].clone()));
                    }
                    tiers.push(tier);
                }
                429 => {
                    refusals += 1;
                    assert!(
                        body["reason"]
                            .as_str()
                            .unwrap()
                            .ends_with("reached its per-node limit of 1 and its shared limit of 2"),
                        "round {round}: {body}"
                    );
                }
                other => panic!("unexpected {other}: {body}"),
            }
        }
    }
    tiers.sort();
    assert_eq!(tiers, ["node", "node", "node", "shared", "shared"]);
    assert_eq!(refusals, 12 - 5);

    // A shared lease is renewed on its owner, through the node that holds it; past the
    // policy's lease_ttl (10 s) a renewal is cut to it.
    let (renew_url, lease) = shared_lease.unwrap();
    let renewed = reqwest::Client::new()
        .post(renew_url)
        .json(&json!({"lease": lease, "ttl_ms": 60_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), 200);
    let body: Value = renewed.json().await.unwrap();
    let left = body["expires_in_ms"].as_u64().unwrap();
    assert!((9_000..=10_000).contains(&left), "{body}");

    // "Who is throttled" gathered from every node, through any of them.
    let body: Value = reqwest::get(n1.url("/v1/throttles?scope=cluster&sort=key"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut nodes: Vec<&str> = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node_id"].as_str().unwrap())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes, ["n1", "n2", "n3"], "{body}");
    let metrics = reqwest::get(n1.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("weir_cluster_members 3"), "{metrics}");
    assert!(metrics.contains("weir_cluster_admissions_total{tier=\"fail_open\"} 0"));

    // kill -9 one node: the others keep answering (200 or 429, never an error) and see the
    // ring rebuilt without it.
    n3.signal("KILL");
    let _ = n3.wait();
    converge(&[&n1, &n2], 2).await;
    for server in [&n1, &n2] {
        let (status, body) = acquire(server).await;
        assert!(status == 200 || status == 429, "{status}: {body}");
    }
}

const PAUSE_CONFIG: &str = r#"
[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1, shared_limit = 2, lease_ttl = "30s", on_unavailable = "closed" }
"#;
/// `PAUSE_CONFIG`'s `lease_ttl`: longer than a pause lasts in these tests.
const PAUSE_TTL: Duration = Duration::from_secs(30);

/// `buckets_owned` in `/v1/cluster`: how many buckets `server` owns leases of.
async fn buckets_owned(server: &Server) -> u64 {
    view(server).await.counters.buckets_owned
}

/// A holder stopped with SIGSTOP is declared departed by the others' failure detectors, but it
/// may come back and go on using its permits: its shared lease stays counted on the owner until
/// it expires. (Before, the owner purged it, another node took the permit, and when the holder
/// resumed the cluster had more in flight than its ceiling.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_shared_lease_is_not_given_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let [n1, n2, n3] = three_nodes(dir.path(), PAUSE_CONFIG).await;
    settle(&[&n1, &n2, &n3], PAUSE_TTL).await;
    let nodes = [&n1, &n2, &n3];
    // One node-tier permit on each, then the two shared ones: the ceiling, 1 × 3 + 2 = 5.
    let mut shared_holders = Vec::new();
    for round in 0..2 {
        for (i, server) in nodes.iter().enumerate() {
            let (status, body) = acquire(server).await;
            if status == 200 && body["tier"] == "shared" {
                shared_holders.push(i);
            }
            if round == 0 {
                assert_eq!(body["tier"], "node", "{body}");
            }
        }
    }
    assert_eq!(shared_holders.len(), 2, "the shared limit is 2");
    let mut owner = None;
    for (i, server) in nodes.iter().enumerate() {
        if buckets_owned(server).await > 0 {
            owner = Some(i);
        }
    }
    let owner = owner.expect("one node owns the bucket");
    let holder = *shared_holders
        .iter()
        .find(|&&i| i != owner)
        .expect("a shared lease held away from its owner");
    let others: Vec<&Server> = (0..3).filter(|&i| i != holder).map(|i| nodes[i]).collect();

    nodes[holder].signal("STOP");
    // The others' failure detectors declare the holder departed (bounded: 60 s).
    converge(&others, 2).await;
    for server in &others {
        let (status, body) = acquire(server).await;
        assert_eq!(
            status, 429,
            "the paused holder's permit went to another: {body}"
        );
    }
    nodes[holder].signal("CONT");
    converge(&nodes, 3).await;
    for server in nodes {
        let (status, body) = acquire(server).await;
        assert_eq!(status, 429, "over the ceiling after the resume: {body}");
    }
}

/// The owner stopped with SIGSTOP while it holds a shared lease itself: the others move the
/// bucket to a new owner, which learns the leases the live holders hand over but not the paused
/// owner's own. Without the tenure fence it granted that permit again at once. With it, the new
/// owner grants nothing for one `lease_ttl` (and says so), and after SIGCONT the resumed owner,
/// having noticed its own pause, does not grant either: the ceiling holds throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owners_own_shared_lease_is_not_given_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let [n1, n2, n3] = three_nodes(dir.path(), PAUSE_CONFIG).await;
    settle(&[&n1, &n2, &n3], PAUSE_TTL).await;
    let nodes = [&n1, &n2, &n3];
    for server in nodes {
        assert_eq!(acquire(server).await.1["tier"], "node");
    }
    // A first shared permit (on n1) makes the owner known; then the owner takes one itself.
    let (_, body) = acquire(&n1).await;
    assert_eq!(body["tier"], "shared", "{body}");
    let mut owner = None;
    for (i, server) in nodes.iter().enumerate() {
        if buckets_owned(server).await > 0 {
            owner = Some(i);
        }
    }
    let owner = owner.expect("one node owns the bucket");
    let others: Vec<&Server> = (0..3).filter(|&i| i != owner).map(|i| nodes[i]).collect();
    let second = if owner == 0 { others[0] } else { nodes[owner] };
    let (status, body) = acquire(second).await;
    assert_eq!((status, &body["tier"]), (200, &json!("shared")), "{body}");

    nodes[owner].signal("STOP");
    let stopped = Instant::now();
    converge(&others, 2).await;
    for server in &others {
        let (status, body) = acquire(server).await;
        assert_eq!(
            status, 429,
            "the paused owner's permit went to another: {body}"
        );
        assert!(
            body["reason"]
                .as_str()
                .unwrap()
                .contains("took it over too recently"),
            "{body}"
        );
        let retry = body["retry_after_ms"].as_u64().expect("says when to retry");
        // One loan's TTL (the lease TTL, 30 s, and its margin, 2 s) plus the quorum's
        // margin (4 s) at most.
        assert!(retry > 0 && retry <= 36_000, "{body}");
    }
    nodes[owner].signal("CONT");
    converge(&nodes, 3).await;
    // Both shared permits are still live (their TTL has not passed): nobody admits.
    assert!(
        stopped.elapsed() < PAUSE_TTL,
        "the test outlived its leases"
    );
    for server in nodes {
        let (status, body) = acquire(server).await;
        assert_eq!(status, 429, "over the ceiling after the resume: {body}");
    }
}

const RATES: &str = r#"
[[policy]]
name = "per-tenant"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }

[[policy]]
name = "per-node"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }

[[policy]]
name = "queued"
scope = "cluster"
on_exhausted = "wait"
max_wait = "5s"
token_bucket = { rate = 5, burst = 1 }
"#;

async fn ask(server: &Server, policy: &str, key: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": policy, "key": key}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_scoped_rate_is_one_bucket_per_key_whichever_node_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), RATES).await;

    // A burst of 5 per tenant: asked 5 times on each of the three nodes, the cluster-scoped
    // policy admits 5 in all; the per-node one 5 on each.
    let mut admitted = [0, 0];
    let mut tiers = std::collections::BTreeSet::new();
    for _ in 0..5 {
        for node in &nodes {
            for (i, policy) in ["per-tenant", "per-node"].into_iter().enumerate() {
                let (status, body) = ask(node, policy, "tenant-a").await;
                if status == 200 {
                    admitted[i] += 1;
                    tiers.insert(body["tier"].as_str().unwrap().to_owned());
                } else {
                    assert_eq!(status, 429, "{body}");
                }
            }
        }
    }
    assert_eq!(admitted, [5, 15]);
    // Two of the three nodes asked the owner; the owner decided for them.
    assert!(
        tiers.contains("owner") && tiers.contains("node"),
        "{tiers:?}"
    );
    let mut forwarded = 0;
    let mut decided = 0;
    for node in &nodes {
        let counters = view(node).await.counters;
        assert_eq!(counters.forward_failed, 0, "{counters:?}");
        forwarded += counters.forwarded;
        decided += counters.decided_for_others;
    }
    assert_eq!((forwarded, decided), (10, 10));
    let mut timed = 0;
    for node in &nodes {
        let text = reqwest::get(node.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        timed += text
            .lines()
            .find_map(|l| l.strip_prefix("weir_cluster_forward_duration_seconds_count "))
            .map_or(0, |n| n.parse::<u64>().unwrap());
        assert!(text.contains("weir_cluster_rate_decisions_total{outcome=\"forwarded\"}"));
    }
    assert_eq!(timed, 10, "every forwarded decision is timed");

    // A waiting policy waits on the owner, in the bucket's one line: three requests at once
    // through three nodes, one token now and one every 200 ms, are all admitted, in turn.
    let started = Instant::now();
    let (a, b, c) = tokio::join!(
        ask(&nodes[0], "queued", "tenant-b"),
        ask(&nodes[1], "queued", "tenant-b"),
        ask(&nodes[2], "queued", "tenant-b"),
    );
    let answers = [a, b, c];
    let mut waits: Vec<u64> = answers
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 200, "{body}");
            body["waited_ms"].as_u64().unwrap()
        })
        .collect();
    waits.sort_unstable();
    assert_eq!(waits[0], 0);
    assert!(waits[1] >= 150 && waits[2] >= 350, "{waits:?}");
    assert!(started.elapsed() >= Duration::from_millis(350));
}

const MOVING: &str = r#"
[[policy]]
name = "open"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 3 }

[[policy]]
name = "careful"
scope = "cluster"
learning_period = "20s"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 3 }
"#;

/// The `careful` policy's learning period.
const LEARNING: Duration = Duration::from_secs(20);

/// Keys in the tests of moving buckets: enough that every node owns some.
const MOVING_KEYS: usize = 24;

/// How many of the `MOVING_KEYS` keys named `{prefix}{n}` of `policy` `server` admits one
/// more request of.
async fn admitted_again(server: &Server, policy: &str, prefix: &str) -> usize {
    let mut admitted = 0;
    for key in 0..MOVING_KEYS {
        let (status, body) = ask(server, policy, &format!("{prefix}{key}")).await;
        assert!(status == 200 || status == 429, "{status}: {body}");
        admitted += usize::from(status == 200);
    }
    admitted
}

async fn counters_of(servers: &[&Server]) -> weir_api::http::ClusterCounters {
    let mut sum = weir_api::http::ClusterCounters::default();
    for server in servers {
        let c = view(server).await.counters;
        sum.rate_buckets_handed_over += c.rate_buckets_handed_over;
        sum.rate_buckets_taken_on += c.rate_buckets_taken_on;
        sum.rate_learning += c.rate_learning;
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_bucket_keeps_what_was_spent_when_the_ring_moves_it() {
    // Buckets of 3 that refill one token in 100 s: spent on two nodes, they stay spent when a
    // third joins and takes some of them, when it leaves again, and — with a learning period —
    // when the node that owns some of them is killed.
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let n1 = start_node(dir.path(), "n1", MOVING, &seed, None);
    let n2 = start_node(dir.path(), "n2", MOVING, &free_udp(), Some(&seed));
    converge(&[&n1, &n2], 2).await;
    // The `careful` policy's buckets are held while their owners' tenure is under its
    // learning period: spent only once the two nodes have owned them for longer.
    held_for(
        &[&n1, &n2],
        LEARNING,
        "the owners' tenure passing the learning period",
    )
    .await;
    spend(&n1, "k").await;

    // A join: the newcomer takes on the buckets it now owns as they were.
    let n3 = start_node(dir.path(), "n3", MOVING, &free_udp(), Some(&seed));
    converge(&[&n1, &n2, &n3], 3).await;
    // A giver counts what it handed over once the whole handover has been answered, the
    // taker each bucket as it comes: equal once the handovers are done.
    eventually(
        Duration::from_secs(20),
        "every bucket handed over taken on",
        || async {
            let joined = counters_of(&[&n1, &n2, &n3]).await;
            joined.rate_buckets_taken_on > 0
                && joined.rate_buckets_taken_on == joined.rate_buckets_handed_over
        },
    )
    .await;
    for policy in ["open", "careful"] {
        assert_eq!(
            admitted_again(&n3, policy, "k").await,
            0,
            "{policy} after the join"
        );
    }

    // A graceful leave: n3 hands its buckets to the owners the ring has without it.
    let before = counters_of(&[&n1, &n2]).await;
    n3.signal("TERM");
    let (status, _) = n3.wait();
    assert!(status.success());
    converge(&[&n1, &n2], 2).await;
    let left = counters_of(&[&n1, &n2]).await;
    assert!(
        left.rate_buckets_taken_on > before.rate_buckets_taken_on,
        "{left:?}"
    );
    for policy in ["open", "careful"] {
        assert_eq!(
            admitted_again(&n1, policy, "k").await,
            0,
            "{policy} after the leave"
        );
    }

    // A crash hands nothing over: n4 joins, owns some fresh keys long enough to spend them
    // (past the learning period), and is killed. The `open` policy's buckets n4 owned start
    // full on their next owner; the `careful` one's are held to the share of their capacity
    // the new owner's tenure is of the learning period (about 3 s of 20: 0.45 of 3 tokens).
    let n4 = start_node(dir.path(), "n4", MOVING, &free_udp(), Some(&seed));
    converge(&[&n1, &n2, &n4], 3).await;
    held_for(
        &[&n1, &n2, &n4],
        LEARNING,
        "n4's tenure passing the learning period",
    )
    .await;
    spend(&n1, "c").await;
    n4.signal("KILL");
    let _ = n4.wait();
    converge(&[&n1, &n2], 2).await;
    let reopened = admitted_again(&n1, "open", "c").await;
    assert!(
        reopened > 0 && reopened < MOVING_KEYS,
        "only the buckets n4 owned start again: {reopened}"
    );
    assert_eq!(admitted_again(&n2, "careful", "c").await, 0);
    assert!(counters_of(&[&n1, &n2]).await.rate_learning > 0);
}

/// A cluster-scoped policy made over the API, as `MOVING`'s `open` is in the file.
async fn put_moving_policy(server: &Server, name: &str) {
    let response = reqwest::Client::new()
        .put(server.url(&format!("/v1/policies/{name}")))
        .json(&json!({
            "scope": "cluster",
            "on_exhausted": "reject",
            "token_bucket": {"rate": 0.01, "burst": 3},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        201,
        "{:?}",
        response.text().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_keeps_what_was_spent_of_policies_made_over_the_api() {
    // A node that joins owns buckets in the others' rings before its policy log has caught up:
    // the buckets of a policy made over the API are handed to it before it runs the policy.
    // What they had spent must not be lost on the way — whatever made the policy.
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [MOVING; 3], &seed).await;
    put_moving_policy(&n1, "api").await;
    eventually(
        Duration::from_secs(20),
        "every member running `api`",
        || async {
            for server in [&n1, &n2, &n3] {
                if policy_on(server, "api").await.is_none() {
                    return false;
                }
            }
            true
        },
    )
    .await;
    for policy in ["api", "open"] {
        for key in 0..MOVING_KEYS {
            for _ in 0..3 {
                let (status, body) = ask(&n1, policy, &format!("k{key}")).await;
                assert_eq!(status, 200, "{policy} k{key}: {body}");
            }
        }
        assert_eq!(admitted_again(&n1, policy, "k").await, 0);
    }

    let n4 = start_node(dir.path(), "n4", MOVING, &free_udp(), Some(&seed));
    converge(&[&n1, &n2, &n3, &n4], 4).await;
    eventually(
        Duration::from_secs(20),
        "every bucket handed over taken on",
        || async {
            let joined = counters_of(&[&n1, &n2, &n3, &n4]).await;
            joined.rate_buckets_taken_on > 0
                && joined.rate_buckets_taken_on == joined.rate_buckets_handed_over
        },
    )
    .await;
    for server in [&n4, &n1] {
        for policy in ["api", "open"] {
            let admitted = admitted_again(server, policy, "k").await;
            assert_eq!(
                admitted,
                0,
                "{policy} after the join, asked of {}",
                server.url("")
            );
        }
    }
}

const KEPT: &str = r#"
[[policy]]
name = "day"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 0.0001, burst = 3 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_quota_stays_spent_when_every_node_is_killed_and_restarted() {
    // Buckets of 3 that refill one token in 10 000 s, spent 2 of 3 through every node: after a
    // `kill -9` of the whole cluster each has its 1 left, on the same owner, and no more.
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [KEPT; 3], &seed).await;
    let nodes = [&n1, &n2, &n3];
    for key in 0..MOVING_KEYS {
        for _ in 0..2 {
            let (status, body) = ask(nodes[key % 3], "day", &format!("k{key}")).await;
            assert_eq!(status, 200, "k{key}: {body}");
        }
    }
    for node in nodes {
        let walks = counter(node, "weir_kept_bucket_walks_total").await;
        eventually(
            Duration::from_secs(10),
            "two walks after the last decision",
            || async { counter(node, "weir_kept_bucket_walks_total").await >= walks + 2 },
        )
        .await;
    }
    for node in [n1, n2, n3] {
        node.signal("KILL");
        let _ = node.wait();
    }

    let n1 = start_node(dir.path(), "n1", KEPT, &seed, None);
    let n2 = start_node(dir.path(), "n2", KEPT, &free_udp(), Some(&seed));
    let n3 = start_node(dir.path(), "n3", KEPT, &free_udp(), Some(&seed));
    let nodes = [&n1, &n2, &n3];
    converge(&nodes, 3).await;
    // A new owner may hold a bucket for a moment while a handover could still be on its way:
    // asked until every key has given its one token, never more.
    let admitted = &std::sync::atomic::AtomicUsize::new(0);
    eventually(
        Duration::from_secs(20),
        "each key's last token",
        move || async move {
            for key in 0..MOVING_KEYS {
                let (status, body) = ask(nodes[(key + 1) % 3], "day", &format!("k{key}")).await;
                assert!(status == 200 || status == 429, "{status}: {body}");
                admitted.fetch_add(usize::from(status == 200), Ordering::Relaxed);
            }
            let admitted = admitted.load(Ordering::Relaxed);
            assert!(admitted <= MOVING_KEYS, "{admitted} admitted");
            admitted == MOVING_KEYS
        },
    )
    .await;
    holds_for(Duration::from_secs(2), "every key is spent", || async {
        for key in 0..MOVING_KEYS {
            let (status, body) = ask(nodes[key % 3], "day", &format!("k{key}")).await;
            assert_eq!(status, 429, "k{key}: {body}");
        }
        true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_owner_s_long_quotas_stay_spent_on_the_nodes_that_asked_it() {
    // Buckets of 3 that refill one token in 10 000 s, spent through every node: each node
    // that forwarded to a bucket's owner keeps a copy as spent as the owner's answers. The
    // owner of some is killed (it hands nothing over): their next owners already hold them
    // spent, where before a crash gave them afresh.
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [KEPT; 3], &seed).await;
    let nodes = [&n1, &n2, &n3];
    let mut owned_by_n3 = 0;
    for key in 0..MOVING_KEYS {
        let key = format!("m{key}");
        // Three admitted, then one refusal through each node: every node's last answer
        // says the bucket is empty.
        for (i, node) in nodes.iter().cycle().take(6).enumerate() {
            let (status, body) = ask(node, "day", &key).await;
            assert_eq!(status, if i < 3 { 200 } else { 429 }, "{key}: {body}");
            // Decided on n3 itself: n3 owns the bucket.
            owned_by_n3 += usize::from(i == 2 && body["tier"] == "node");
        }
    }
    assert!(owned_by_n3 > 0, "n3 owns none of the keys");
    n3.signal("KILL");
    let _ = n3.wait();
    converge(&[&n1, &n2], 2).await;
    // Past the new owners' wait for a handover (a second): what holds them now is the copy.
    holds_for(Duration::from_secs(4), "every key stays spent", || async {
        for key in 0..MOVING_KEYS {
            for node in [&n1, &n2] {
                let (status, body) = ask(node, "day", &format!("m{key}")).await;
                assert_eq!(status, 429, "m{key}: {body}");
            }
        }
        true
    })
    .await;
}

/// Spends the whole burst of the `MOVING_KEYS` keys `{prefix}{n}` of both policies through
/// `server`, and checks that they are spent.
async fn spend(server: &Server, prefix: &str) {
    for policy in ["open", "careful"] {
        for key in 0..MOVING_KEYS {
            for _ in 0..3 {
                let (status, body) = ask(server, policy, &format!("{prefix}{key}")).await;
                assert_eq!(status, 200, "{policy} {prefix}{key}: {body}");
            }
        }
        assert_eq!(admitted_again(server, policy, prefix).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rls_rule_and_a_limit_sent_with_a_request_count_once_for_the_cluster() {
    use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use weir_api::envoy::service::ratelimit::v3::RateLimitRequest;
    use weir_api::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use weir_api::envoy::r#type::v3::RateLimitUnit;

    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: day, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let config = format!("[rls]\nconfig = {:?}\n", rules.display().to_string());
    let nodes = three_nodes(dir.path(), &config).await;
    let request = || RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: "alice".to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    let mut oks = 0;
    let mut remaining = Vec::new();
    for _ in 0..3 {
        for node in &nodes {
            let mut client = RateLimitServiceClient::connect(node.grpc.clone())
                .await
                .unwrap();
            let answer = client
                .should_rate_limit(request())
                .await
                .unwrap()
                .into_inner();
            if answer.overall_code == Code::Ok as i32 {
                oks += 1;
                remaining.push(answer.statuses[0].limit_remaining);
            }
        }
    }
    // Five a day for alice in the whole cluster, counted down wherever she was asked about.
    assert_eq!(oks, 5);
    assert_eq!(remaining, [4, 3, 2, 1, 0]);
    let mut forwarded = 0;
    for node in &nodes {
        let counters = view(node).await.counters;
        assert_eq!(counters.forward_failed, 0, "{counters:?}");
        forwarded += counters.forwarded;
    }
    assert_eq!(
        forwarded, 6,
        "two of the three nodes asked the owner, three times each"
    );

    // A limit sent with a descriptor no rule holds counts on the key's owner too: four an
    // hour for the cluster, not for each node.
    let sent = || RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "team".to_owned(),
                value: "x".to_owned(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 4,
                unit: RateLimitUnit::Hour as i32,
            }),
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    let mut codes = Vec::new();
    for _ in 0..2 {
        for node in &nodes {
            let mut client = RateLimitServiceClient::connect(node.grpc.clone())
                .await
                .unwrap();
            let answer = client.should_rate_limit(sent()).await.unwrap().into_inner();
            codes.push((answer.overall_code, answer.statuses[0].limit_remaining));
        }
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        codes,
        [(ok, 3), (ok, 2), (ok, 1), (ok, 0), (over, 0), (over, 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_disagree_on_a_policy_never_share_a_bucket_wrongly() {
    // A change rolling through: n1 and n3 have the policy cluster-scoped (at two rates), n2
    // still per node.
    let cluster = |rate: u32| {
        format!(
            "[[policy]]\nname = \"p\"\nscope = \"cluster\"\non_exhausted = \"reject\"\ntoken_bucket = {{ rate = 0.01, burst = {rate} }}\n"
        )
    };
    let per_node = "[[policy]]\nname = \"p\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 0.01, burst = 2 }\n";
    let dir = tempfile::tempdir().unwrap();
    let (c1, c3) = (cluster(3), cluster(4));
    let nodes = three_nodes_on(dir.path(), [&c1, per_node, &c3]).await;
    let counters = |node: &Server| {
        let node = node.url("/v1/cluster");
        async move {
            let view: ClusterView = reqwest::get(node).await.unwrap().json().await.unwrap();
            (view.counters.forwarded, view.counters.forward_failed)
        }
    };
    // Find, through n1, a key n2 owns (n1 cannot have it decided there: n2's policy is not
    // cluster-scoped, so n1 decides alone and counts it) and a key n3 owns (forwarded).
    let (mut owned_by_n2, mut owned_by_n3) = (None, None);
    for i in 0..200 {
        let key = format!("k{i}");
        let before = counters(&nodes[0]).await;
        let (status, _) = ask(&nodes[0], "p", &key).await;
        assert_eq!(status, 200);
        let after = counters(&nodes[0]).await;
        if after.1 > before.1 && owned_by_n2.is_none() {
            owned_by_n2 = Some(key);
        } else if after.0 > before.0 && owned_by_n3.is_none() {
            owned_by_n3 = Some(key);
        }
        if owned_by_n2.is_some() && owned_by_n3.is_some() {
            break;
        }
    }
    let (k2, k3) = (owned_by_n2.unwrap(), owned_by_n3.unwrap());
    // n3's key: one bucket on n3, by n3's config (a burst of 4), whoever asks; n1 already
    // took one. n2 decides its own requests on its per-node bucket (a burst of 2).
    let mut admitted_cluster = 0;
    for _ in 0..3 {
        for node in [&nodes[0], &nodes[2]] {
            admitted_cluster += u32::from(ask(node, "p", &k3).await.0 == 200);
        }
    }
    assert_eq!(
        admitted_cluster, 3,
        "4 in n3's bucket, one taken while finding the key"
    );
    let mut admitted_n2 = 0;
    for _ in 0..4 {
        admitted_n2 += u32::from(ask(&nodes[1], "p", &k3).await.0 == 200);
    }
    assert_eq!(admitted_n2, 2, "n2 decides alone, on its own bucket");
    // n2's key, asked through n1: decided alone on n1 (its own bucket, by its config: 3), and
    // counted as such; n2's per-node bucket is untouched by it.
    let mut admitted_n1 = 0;
    for _ in 0..4 {
        admitted_n1 += u32::from(ask(&nodes[0], "p", &k2).await.0 == 200);
    }
    assert_eq!(
        admitted_n1, 2,
        "3 in n1's own bucket, one taken while finding the key"
    );
    assert!(
        counters(&nodes[0]).await.1 >= 5,
        "every such decision counted as failed over"
    );
    assert_eq!(ask(&nodes[1], "p", &k2).await.0, 200);
}

const LOAN_CONFIG: &str = r#"
[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 100, lease_ttl = "10s", on_unavailable = "closed" }
"#;

/// With loans (the default `max_loan`), a node that admits and releases over and over asks the
/// bucket's owner once or twice: every later shared admission takes a unit lent to it. The
/// owner shows what it lent to whom, and it is what the nodes say they borrowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_takes_lent_units_without_asking_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let servers = three_nodes(dir.path(), LOAN_CONFIG).await;
    settle(
        &[&servers[0], &servers[1], &servers[2]],
        Duration::from_secs(10),
    )
    .await;
    let client = reqwest::Client::new();
    for server in &servers {
        for i in 0..20 {
            let (status, body) = acquire(server).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["tier"], "shared", "{body}");
            // The last one stays held: a loan in use is not given back for being idle.
            if i < 19 {
                let released = client
                    .post(server.url("/v1/release"))
                    .json(&json!({"lease": body["lease"]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(released.status(), 200);
            }
        }
    }
    let mut borrowed = 0;
    let mut lent = 0;
    for server in &servers {
        let view = view(server).await;
        assert_eq!(view.counters.shared, 20, "{view:?}");
        assert!(
            view.counters.from_loan >= 15,
            "at most a few calls to the owner: {view:?}"
        );
        assert!(view.counters.borrowed >= 1, "{view:?}");
        borrowed += view.counters.borrowed;
        lent += view.lent.values().sum::<u64>();
    }
    assert_eq!(lent, borrowed, "the owner counts what the nodes hold");
    let metrics = client
        .get(servers[0].url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weir_cluster_admissions_from_loan_total"),
        "{metrics}"
    );
}

const HOT: &str = r#"
[[policy]]
name = "hot"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 50, burst = 10 }
"#;

/// A hot cluster-scoped bucket asked through the two nodes that do not own it: its owner
/// assigns each a share of its rate, and they decide within it without a call, while the
/// cluster admits no more than one bucket would over the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_bucket_is_decided_where_it_is_asked_within_its_one_rate() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), HOT).await;
    let mut tiers = Vec::new();
    for node in &nodes {
        let (status, body) = ask(node, "hot", "tenant").await;
        assert_eq!(status, 200, "{body}");
        tiers.push(body["tier"].as_str().unwrap().to_owned());
    }
    let owner = tiers
        .iter()
        .position(|tier| tier == "node")
        .expect("one owner");
    let askers: Vec<&Server> = (0..3).filter(|&i| i != owner).map(|i| &nodes[i]).collect();
    let admitted = std::sync::atomic::AtomicU64::new(0);
    let asked = std::sync::atomic::AtomicU64::new(0);
    let started = Instant::now();
    let run = Duration::from_secs(3);
    // Four clients on each asking node, each asking again as soon as it is answered.
    let clients = askers.iter().flat_map(|&node| (0..4).map(move |_| node));
    futures_util::future::join_all(
        clients.map(|node| ask_until(node, started + run, &admitted, &asked)),
    )
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let (admitted, asked) = (admitted.into_inner(), asked.into_inner());
    // The three asks that found the owner came first: its burst of 10, then 50 a second.
    let bound = 10 + (50.0 * elapsed).ceil() as u64 - 3;
    assert!(
        admitted <= bound,
        "{admitted} admitted in {elapsed:.2} s, bound {bound}"
    );
    let mut forwarded = 0;
    for node in &askers {
        let counters = view(node).await.counters;
        assert_eq!(counters.forward_failed, 0, "{counters:?}");
        assert!(counters.assigned_admitted > 0, "{counters:?}");
        forwarded += counters.forwarded;
    }
    assert!(
        forwarded * 2 < asked,
        "{forwarded} of {asked} requests were forwarded"
    );
    let owner_view = view(&nodes[owner]).await.counters;
    assert!(owner_view.decided_for_others < asked / 2, "{owner_view:?}");
    // Every decision is counted once, on the node that made it — within a share, for another
    // node, or its own — in the policy's own series: the nodes' sums are what the clients saw
    // (the three first asks included).
    // Where each was decided is said: within a share on the askers, for another node on the
    // owner (here: the owner's own asks, none).
    let mut counted = [0, 0];
    let mut by_place = std::collections::BTreeMap::new();
    for node in &nodes {
        for (i, outcome) in ["admitted", "rejected"].into_iter().enumerate() {
            for decided in ["here", "owner", "assigned"] {
                let series = format!(
                    "weir_decisions_total{{policy=\"hot\",outcome=\"{outcome}\",decided=\"{decided}\"}}"
                );
                let n = counter(node, &series).await;
                counted[i] += n;
                *by_place.entry(decided).or_insert(0) += n;
            }
        }
    }
    assert_eq!(
        counted,
        [admitted + 3, asked - admitted],
        "the nodes' weir_decisions_total (admitted, rejected) against the clients' count"
    );
    assert!(
        by_place["assigned"] > 0 && by_place["owner"] > 0,
        "{by_place:?}"
    );
    // `weir top --cluster` shows the key once for the cluster, what it was offered, admitted
    // and held back summed over the nodes that decided it, then each of them: the clients'
    // own rates over the run, within what a table measuring since each node's first refusal
    // (and until it is asked) can be off by.
    let top = support::weir()
        .args(["top", "--cluster", "--policy", "hot", "--server"])
        .arg(&nodes[0].http)
        .output()
        .unwrap();
    assert!(top.status.success(), "{top:?}");
    let table = String::from_utf8(top.stdout).unwrap();
    let rates = |line: &str| -> Vec<f64> {
        let cells: Vec<&str> = line.split_whitespace().collect();
        cells[cells.len() - 5..cells.len() - 2]
            .iter()
            .map(|cell| cell.parse().unwrap())
            .collect()
    };
    let cluster = table
        .lines()
        .find(|line| line.starts_with("cluster "))
        .unwrap_or_else(|| panic!("no cluster row:\n{table}"));
    let nodes_deciding = table.lines().filter(|l| l.starts_with("  n")).count();
    assert!(nodes_deciding >= 2, "{table}");
    let [offered, admitted_rate, held] = rates(cluster)[..] else {
        unreachable!()
    };
    let near = |shown: f64, seen: u64| {
        let seen = seen as f64 / elapsed;
        (shown - seen).abs() <= 0.25 * seen
    };
    assert!(
        near(offered, asked),
        "offered {offered}, {asked} asked:\n{table}"
    );
    assert!(
        near(admitted_rate, admitted),
        "admitted {admitted_rate}, {admitted} admitted:\n{table}"
    );
    assert!(near(held, asked - admitted), "held {held}:\n{table}");
}

/// `docs/envoy/rlqs.toml`'s tenants, cluster-scoped.
const RLQS_TENANTS: &str = r#"
[[policy]]
name = "tenants"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 60, burst = 6 }

[[rlqs.bucket]]
domain = "edge"
match = { name = "per-tenant" }
policy = "tenants"
key = "{tenant}"
"#;

/// Three real Envoys (`docs/envoy/rlqs.yaml`), each on a different node of a three-node
/// cluster, asking for one tenant of a cluster-scoped policy (60 a second, burst 6) as fast as
/// they answer: each stream's reports go through its node to the bucket's one owner, whose book
/// shares the one rate among the three, so the cluster holds it as one bucket would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_every_node_share_a_cluster_scoped_rate_over_rlqs() {
    let Some(binary) = support::envoy::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), RLQS_TENANTS).await;
    let (upstream_port, _) = support::envoy::upstream().await;
    let mut envoys = Vec::new();
    let mut urls = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let port: u16 = node.grpc.rsplit(':').next().unwrap().parse().unwrap();
        let at = dir.path().join(format!("envoy{i}"));
        let (envoy, url) = support::envoy::start_rlqs(&binary, &at, port, upstream_port).await;
        envoys.push(envoy);
        urls.push(url);
    }
    let load = support::envoy::Load::start(&urls, "acme");
    load.holds_one_bucket(60, 6, "RLQS on three nodes, one tenant at 60/s")
        .await;
    // One node lends, its own bucket's shares, to the three streams on the three nodes.
    let mut lending = 0;
    for node in &nodes {
        let counters = view(node).await.counters;
        assert_eq!(counters.forward_failed, 0, "{counters:?}");
        lending += usize::from(counters.shares_lent > 0);
        let asks = "weir_rlqs_asks_total{outcome=\"assigned\"}";
        assert!(counter(node, asks).await > 0);
        let unanswered = "weir_rlqs_asks_total{outcome=\"unanswered\"}";
        assert_eq!(counter(node, unanswered).await, 0);
    }
    assert_eq!(lending, 1, "the bucket's owner alone lends its shares");
    // What the Envoys decided within their shares, as they report it, is counted in the
    // policy's own series, on the node each reports to.
    let mut envoys_decided = 0;
    for node in &nodes {
        let series = "weir_decisions_total{policy=\"tenants\",outcome=\"admitted\",decided=\"envoy_assigned\"}";
        envoys_decided += counter(node, series).await;
    }
    assert!(envoys_decided > 0, "no Envoy decision counted");
    load.stop().await;
    drop(envoys);
}

/// Asks `server` for `hot`'s bucket `tenant` until `until`, again as soon as it is answered;
/// counts what it asked and what was admitted.
async fn ask_until(
    server: &Server,
    until: Instant,
    admitted: &std::sync::atomic::AtomicU64,
    asked: &std::sync::atomic::AtomicU64,
) {
    while Instant::now() < until {
        let (status, body) = ask(server, "hot", "tenant").await;
        assert!(status == 200 || status == 429, "{status}: {body}");
        asked.fetch_add(1, Ordering::Relaxed);
        admitted.fetch_add(u64::from(status == 200), Ordering::Relaxed);
    }
}

/// A node started with seeds is ready — `/readyz` 200, gRPC health SERVING — only once it has
/// joined: before its seed is up it is NOT_SERVING and 503, and it stays ready after.
#[tokio::test]
async fn a_joining_node_is_ready_once_it_has_joined() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let joiner = start_node(dir.path(), "n2", CONFIG, &free_udp(), Some(&seed));
    let health = |server: &Server| {
        let url = server.grpc.clone();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = HealthClient::new(channel);
            let answer = client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .unwrap();
            answer.into_inner().status
        }
    };
    let readyz = |server: &Server| {
        let url = server.url("/readyz");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    // Alone, with a seed nobody answers on: not joined, and not ready, for as long as it is
    // watched — 2 s, ten gossip rounds of 200 ms, each of which asks the seed again.
    holds_for(
        Duration::from_secs(2),
        "a node whose seed never answers is not ready",
        || async { readyz(&joiner).await == 503 },
    )
    .await;
    assert_eq!(health(&joiner).await, ServingStatus::NotServing as i32);
    let first = start_node(dir.path(), "n1", CONFIG, &seed, None);
    // The first node has no seeds: ready as soon as it has started the cluster's policy log
    // (after listening a second for one already running).
    eventually(Duration::from_secs(10), "the first node ready", || async {
        readyz(&first).await == 200
    })
    .await;
    converge(&[&first, &joiner], 2).await;
    eventually(Duration::from_secs(10), "SERVING once joined", || async {
        health(&joiner).await == ServingStatus::Serving as i32
    })
    .await;
    assert_eq!(readyz(&joiner).await, 200);
    // Joined for good: the seed leaving does not make it unready — watched until the joiner's
    // failure detector has dropped the seed, and ready at every look meanwhile.
    drop(first);
    eventually(Duration::from_secs(60), "the seed dropped", || async {
        assert_eq!(readyz(&joiner).await, 200, "unready once its seed left");
        members(&joiner).await == 1
    })
    .await;
    assert_eq!(readyz(&joiner).await, 200);
}

/// Each node's `config_differs`, in node order.
async fn differing(servers: &[&Server]) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for server in servers {
        all.push(view(server).await.config_differs);
    }
    all
}

/// A policy in one member's config file only.
const EXTRA: &str = "\n[[policy]]\nname = \"extra\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 5, burst = 5 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_on_one_member_shows_as_drift_and_the_cluster_is_seen_whole() {
    let dir = tempfile::tempdir().unwrap();
    // n1's config file has a policy the others' do not (a ConfigMap change rolling through).
    let with_extra = format!("{CONFIG}{EXTRA}");
    let nodes = three_nodes_on(dir.path(), [&with_extra, CONFIG, CONFIG]).await;
    let all = [&nodes[0], &nodes[1], &nodes[2]];
    let agreed = || async {
        for server in all {
            let view = view(server).await;
            let versions: Vec<Option<String>> = view
                .members
                .iter()
                .map(|m| m.config_version.clone())
                .collect();
            if versions.len() != 3
                || versions.iter().any(Option::is_none)
                || versions.iter().any(|v| *v != versions[0])
                || !view.config_differs.is_empty()
            {
                return false;
            }
        }
        true
    };
    let unchanged_before = view(&nodes[0]).await.ring.unchanged_for_ms;
    let expected = vec![
        vec!["n2".to_owned(), "n3".to_owned()],
        vec!["n1".to_owned()],
        vec!["n1".to_owned()],
    ];
    eventually(
        Duration::from_secs(20),
        "the drift seen on every member",
        || async { differing(&all).await == expected },
    )
    .await;
    let metrics = reqwest::get(nodes[0].url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("weir_cluster_config_drift 2"), "{metrics}");
    // And the release each member runs, as a rolling upgrade would show it member by member.
    eventually(
        Duration::from_secs(20),
        "every member's release seen on every member",
        || async {
            let mut builds = Vec::new();
            for server in all {
                builds.extend(view(server).await.members.into_iter().map(|m| m.build));
            }
            builds.len() == 9
                && builds
                    .iter()
                    .all(|b| b.as_deref() == Some(env!("CARGO_PKG_VERSION")))
        },
    )
    .await;
    // What differs, named: asked of the members that differ, on every read. Held long enough
    // for the drift to be logged (5 s).
    let drift_of = |server: &Server| {
        let url = server.url("/v1/cluster");
        async move {
            let view: ClusterView = reqwest::get(url).await.unwrap().json().await.unwrap();
            view.config_drift
                .into_iter()
                .map(|d| format!("{} {} {}", d.member, d.policy, d.how))
                .collect::<Vec<_>>()
        }
    };
    holds_for(Duration::from_secs(6), "the drift named", || async {
        assert_eq!(
            drift_of(all[0]).await,
            ["n2 extra missing there", "n3 extra missing there"]
        );
        assert_eq!(drift_of(all[1]).await, ["n1 extra missing here"]);
        true
    })
    .await;
    // A config version is no membership: the ring did not change.
    assert!(view(&nodes[0]).await.ring.unchanged_for_ms > unchanged_before);

    // The cluster's numbers at once, from any member: each member's, and their sums.
    for (i, server) in all.iter().enumerate() {
        for _ in 0..=i {
            reqwest::Client::new()
                .post(server.url("/v1/acquire"))
                .json(&json!({"policy": "extra", "key": "k"}))
                .send()
                .await
                .unwrap();
        }
    }
    let stats: Value = reqwest::get(nodes[1].url("/v1/stats?scope=cluster"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = stats["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["n2", "n1", "n3"], "{stats}");
    assert_eq!(stats["config_differs"], json!(["n1"]), "{stats}");
    let extra = stats["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "extra")
        .unwrap_or_else(|| panic!("{stats}"));
    // Only n1 runs `extra`: its one acquire; the others answered 404 and count nothing.
    assert_eq!(extra["started"], 1, "{stats}");
    let search = stats["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "search")
        .unwrap();
    assert_eq!(search["started"], 0, "{stats}");
    let bad = reqwest::get(nodes[0].url("/v1/stats?scope=everywhere"))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // The same policy made through the API, on any member: the cluster's policy log takes it
    // to all three, and they agree again.
    let extra = json!({"on_exhausted": "reject", "token_bucket": {"rate": 5, "burst": 5}});
    let status = reqwest::Client::new()
        .put(nodes[1].url("/v1/policies/extra"))
        .json(&extra)
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");
    eventually(
        Duration::from_secs(20),
        "the members agreeing again",
        agreed,
    )
    .await;
    // n1 logged the drift, naming the policy, and its end.
    let [n1, _n2, _n3] = nodes;
    let drift_ended = || async { view(&n1).await.config_differs.is_empty() };
    eventually(Duration::from_secs(20), "no drift on n1", drift_ended).await;
    n1.signal("TERM");
    let (_, log) = n1.wait();
    assert!(
        log.contains("config drift:") && log.contains("extra on n2: missing there"),
        "{log}"
    );
    assert!(log.contains("config drift ended"), "{log}");
}

/// 40 a second with a burst of 10, one bucket per key for the whole cluster.
const STEADY: &str = "[[policy]]\nname = \"steady\"\nscope = \"cluster\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 40, burst = 10 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_leave_hands_over_first_and_keeps_a_cluster_rate() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), STEADY).await;
    // The owner of key `k`'s bucket: the node that decides it when another is asked.
    let decided = |server: &Server| {
        let url = server.url("/v1/cluster");
        async move {
            let view: ClusterView = reqwest::get(url).await.unwrap().json().await.unwrap();
            view.counters.decided_for_others
        }
    };
    let mut before = Vec::new();
    for server in &nodes {
        before.push(decided(server).await);
    }
    ask(&nodes[0], "steady", "k").await;
    let mut owner = 0;
    for (i, server) in nodes.iter().enumerate() {
        if decided(server).await > before[i] {
            owner = i;
        }
    }
    let asked: Vec<String> = (0..3)
        .filter(|i| *i != owner)
        .map(|i| nodes[i].url("/v1/acquire"))
        .collect();

    // The key asked through the two other nodes, as fast as they answer, throughout; the
    // refusals counted and the latest answer's time kept, for the waits below.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let latest = Arc::new(std::sync::Mutex::new(Instant::now()));
    let mut load = tokio::task::JoinSet::new();
    for url in asked {
        let (stop, refused, latest) =
            (Arc::clone(&stop), Arc::clone(&refused), Arc::clone(&latest));
        load.spawn(async move {
            let client = reqwest::Client::new();
            let mut admitted = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let response = client
                    .post(&url)
                    .json(&json!({"policy": "steady", "key": "k"}))
                    .send()
                    .await
                    .unwrap();
                let at = Instant::now();
                if response.status() == 200 {
                    admitted.push(at);
                } else {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                *latest.lock().unwrap() = at;
            }
            admitted
        });
    }
    // The burst spent and the bucket at its rate (refusing); then the owner is stopped
    // gracefully.
    eventually(Duration::from_secs(10), "the burst spent", || async {
        refused.load(Ordering::Relaxed) >= 10
    })
    .await;
    let stopped = Instant::now();
    let [n1, n2, n3] = nodes;
    let mut nodes = [Some(n1), Some(n2), Some(n3)];
    let leaving = nodes[owner].take().unwrap();
    leaving.signal("TERM");
    let watched = Duration::from_secs(4);
    eventually(
        watched + Duration::from_secs(10),
        "the load answered past the watched span",
        || async { *latest.lock().unwrap() >= stopped + watched },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut admitted = 0;
    while let Some(times) = load.join_next().await {
        admitted += times
            .unwrap()
            .iter()
            .filter(|at| **at >= stopped && at.duration_since(stopped) < watched)
            .count();
    }
    let (status, _) = leaving.wait();
    assert!(status.success());
    // Rate × time + burst, and 1 %: what one bucket admits, whoever owns it.
    let bound = (40.0 * watched.as_secs_f64() + 10.0) * 1.01;
    assert!(
        admitted as f64 <= bound,
        "{admitted} admitted in the {watched:?} after the owner was stopped (bound {bound})"
    );
    // And the bucket was decided throughout: not refused for want of an owner.
    assert!(
        admitted as f64 >= 40.0 * watched.as_secs_f64() * 0.8,
        "{admitted}"
    );
}

/// `PUT /v1/policies/{name}` on `server`, with `If-Match` if given: the status, the
/// `Retry-After` header and the body.
async fn put_policy(
    server: &Server,
    name: &str,
    rate: u32,
    if_match: Option<&str>,
) -> (u16, Option<String>, Value) {
    let mut request = reqwest::Client::new()
        .put(server.url(&format!("/v1/policies/{name}")))
        .json(&json!({"on_exhausted": "reject", "token_bucket": {"rate": rate, "burst": 5}}));
    if let Some(tag) = if_match {
        request = request.header("if-match", tag);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        status,
        retry_after,
        response.json().await.unwrap_or(Value::Null),
    )
}

/// The policy `name` on `server`: its rate and entity tag, or `None` if it does not run there.
async fn policy_on(server: &Server, name: &str) -> Option<(f64, String)> {
    let response = reqwest::get(server.url(&format!("/v1/policies/{name}")))
        .await
        .unwrap();
    if response.status() == 404 {
        return None;
    }
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let body: Value = response.json().await.unwrap();
    Some((body["token_bucket"]["rate"].as_f64().unwrap(), etag))
}

/// A change made through any member is committed by the cluster's policy log and runs on every
/// member; of conditional writes against one version made at once on every member, exactly
/// one wins, round after round; a member cut off from the majority refuses changes (503 with
/// `Retry-After`) and keeps deciding; a member that was away runs what changed meanwhile by the
/// time it says it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_through_any_member_reaches_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [CONFIG; 3], &seed).await;
    eventually(Duration::from_secs(30), "every member ready", || async {
        is_ready(&n1).await && is_ready(&n2).await && is_ready(&n3).await
    })
    .await;

    // One leader, three voters, seen alike from every member. A member is made a voter by a
    // change of the log's own, which may still be on its way when the member says it is ready.
    eventually(
        Duration::from_secs(10),
        "three voters and one leader, seen alike from every member",
        || async {
            let mut leaders = Vec::new();
            for server in [&n1, &n2, &n3] {
                let log = view(server)
                    .await
                    .policy_log
                    .expect("a policy log in cluster mode");
                if log.voters != 3 {
                    return false;
                }
                leaders.push((log.leader.clone(), log.is_leader));
            }
            leaders.iter().filter(|(_, leads)| *leads).count() == 1
                && leaders
                    .iter()
                    .all(|(l, _)| l.is_some() && *l == leaders[0].0)
        },
    )
    .await;

    // Made on n1, it runs on all three.
    let (status, _, _) = put_policy(&n1, "made", 5, None).await;
    assert_eq!(status, 201);
    for server in [&n2, &n3] {
        eventually(
            Duration::from_secs(5),
            "the new policy on every member",
            || async {
                policy_on(server, "made")
                    .await
                    .is_some_and(|(rate, _)| rate == 5.0)
            },
        )
        .await;
    }

    // Three writers at once, on three members, each against the version it read.
    for round in 0..5u32 {
        let (_, tag) = policy_on(&n2, "made").await.unwrap();
        let rates = [10 + round * 3, 11 + round * 3, 12 + round * 3];
        let (a, b, c) = tokio::join!(
            put_policy(&n1, "made", rates[0], Some(&tag)),
            put_policy(&n2, "made", rates[1], Some(&tag)),
            put_policy(&n3, "made", rates[2], Some(&tag)),
        );
        let statuses = [a.0, b.0, c.0];
        let winners: Vec<usize> = (0..3).filter(|i| statuses[*i] == 200).collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {statuses:?} ({a:?} {b:?} {c:?})"
        );
        assert_eq!(
            statuses.iter().filter(|s| **s == 412).count(),
            2,
            "round {round}: {statuses:?}"
        );
        let won = f64::from(rates[winners[0]]);
        for server in [&n1, &n2, &n3] {
            eventually(
                Duration::from_secs(5),
                "the winner on every member",
                || async {
                    policy_on(server, "made")
                        .await
                        .is_some_and(|(rate, _)| rate == won)
                },
            )
            .await;
        }
    }

    // n1 cut off from the others (they are stopped): it refuses a change and keeps deciding.
    n2.signal("STOP");
    n3.signal("STOP");
    let (status, retry_after, body) = put_policy(&n1, "made", 99, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(body["error"], "no_quorum", "{body}");
    assert_eq!(acquire(&n1).await.0, 200, "the node tier still admits");
    let metrics = reqwest::get(n1.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weir_policy_log_changes_total{outcome=\"no_quorum\"} 1"),
        "{metrics}"
    );
    n2.signal("CONT");
    n3.signal("CONT");
    eventually(
        Duration::from_secs(20),
        "a change committed again",
        || async { put_policy(&n1, "made", 40, None).await.0 == 200 },
    )
    .await;

    // n3 leaves; a change is made while it is away; back on its data dir, it runs that
    // change by the time it says it is ready.
    n3.signal("TERM");
    let (status, _) = n3.wait();
    assert!(status.success());
    let (status, _, body) = put_policy(&n2, "made", 77, None).await;
    assert_eq!(status, 200, "{body}");
    let n3 = start_node(dir.path(), "n3", CONFIG, &free_udp(), Some(&seed));
    eventually(Duration::from_secs(30), "n3 ready again", || async {
        if !is_ready(&n3).await {
            return false;
        }
        let rate = policy_on(&n3, "made").await.map(|(rate, _)| rate);
        assert_eq!(rate, Some(77.0), "ready before it caught up");
        true
    })
    .await;

    // Deleted through the member that came back, it is gone from all three.
    let deleted = reqwest::Client::new()
        .delete(n3.url("/v1/policies/made"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    for server in [&n1, &n2, &n3] {
        eventually(
            Duration::from_secs(5),
            "the policy gone everywhere",
            || async { policy_on(server, "made").await.is_none() },
        )
        .await;
    }
}

/// Which of `servers` leads the policy log, once one does in every member's view.
async fn policy_log_leader(servers: &[&Server]) -> usize {
    let leader = std::sync::Mutex::new(None);
    eventually(
        Duration::from_secs(20),
        "one leader of the policy log, with every member a voter",
        || async {
            let mut leads = Vec::new();
            for (i, server) in servers.iter().enumerate() {
                let log = view(server).await.policy_log.expect("a policy log");
                if log.voters != servers.len() {
                    return false;
                }
                if log.is_leader {
                    leads.push(i);
                }
            }
            *leader.lock().unwrap() = leads.first().copied();
            leads.len() == 1
        },
    )
    .await;
    leader.into_inner().unwrap().expect("a leader")
}

/// A change the leader could not get a majority for is refused, and stays refused: killed
/// (kill -9) or paused, the other voters come back, and the change is on none of the members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_refused_for_want_of_a_majority_never_applies() {
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let nodes = three_nodes_through(dir.path(), [CONFIG; 3], &seed).await;
    let [n1, n2, n3] = &nodes;
    let leader = policy_log_leader(&[n1, n2, n3]).await;
    let ids = ["n1", "n2", "n3"];
    let mut others = Vec::new();
    for (i, node) in nodes.into_iter().enumerate() {
        if i == leader {
            others.insert(0, node);
        } else {
            others.push(node);
        }
    }
    let [leading, a, b]: [Server; 3] = others.try_into().ok().unwrap();
    let (a_id, b_id) = {
        let rest: Vec<&str> = (0..3).filter(|i| *i != leader).map(|i| ids[i]).collect();
        (rest[0], rest[1])
    };

    // Paused: the leader refuses, and the change is not there once they go on.
    a.signal("STOP");
    b.signal("STOP");
    let (status, _, body) = put_policy(&leading, "paused", 5, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "no_quorum", "{body}");
    a.signal("CONT");
    b.signal("CONT");
    eventually(
        Duration::from_secs(20),
        "a change committed again",
        || async { put_policy(&leading, "after_pause", 5, None).await.0 == 201 },
    )
    .await;

    // Killed: the same, once they are back on their data dirs.
    let rejoin = |id: &str| {
        if id == "n1" {
            start_node(dir.path(), id, CONFIG, &seed, None)
        } else {
            start_node(dir.path(), id, CONFIG, &free_udp(), Some(&seed))
        }
    };
    a.signal("KILL");
    b.signal("KILL");
    let _ = a.wait();
    let _ = b.wait();
    let (status, _, body) = put_policy(&leading, "killed", 5, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "no_quorum", "{body}");
    let a = rejoin(a_id);
    let b = rejoin(b_id);
    eventually(
        Duration::from_secs(30),
        "a change committed again",
        || async { put_policy(&leading, "after_kill", 5, None).await.0 == 201 },
    )
    .await;
    for server in [&leading, &a, &b] {
        eventually(
            Duration::from_secs(10),
            "the later change everywhere",
            || async { policy_on(server, "after_kill").await.is_some() },
        )
        .await;
        // The log applies in order: what was committed before the later change is here too.
        for refused in ["paused", "killed"] {
            assert!(
                policy_on(server, refused).await.is_none(),
                "`{refused}` was refused, yet it runs on {}",
                server.url("")
            );
        }
    }
}

/// The voters of the policy log as `server` sees them: (node id, state).
async fn voters_seen(server: &Server) -> Vec<(String, String)> {
    view(server)
        .await
        .policy_log
        .expect("a policy log")
        .voter_states
        .into_iter()
        .map(|voter| (voter.id, voter.state))
        .collect()
}

/// A paused member (SIGSTOP) is still part of the cluster — it counts in every majority — so
/// the others list it as suspect, with its vote and how long it has gone unseen, in
/// `/v1/cluster` and `weir top --cluster`, rather than dropping it; resumed, it is alive again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_is_shown_suspect_with_its_vote_and_alive_again_once_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let [n1, n2, n3] = three_nodes(dir.path(), CONFIG).await;
    policy_log_leader(&[&n1, &n2, &n3]).await;
    let states = |view: &ClusterView| {
        let mut states: Vec<(String, String, bool)> = view
            .members
            .iter()
            .map(|m| (m.id.clone(), m.state.clone(), m.votes))
            .collect();
        states.sort();
        states
    };
    let all_alive = [
        ("n1", "alive", true),
        ("n2", "alive", true),
        ("n3", "alive", true),
    ]
    .map(|(id, state, votes)| (id.to_owned(), state.to_owned(), votes));
    assert_eq!(states(&view(&n1).await), all_alive);

    n3.signal("STOP");
    eventually(Duration::from_secs(30), "n3 suspect on n1", || async {
        let view = view(&n1).await;
        view.members.iter().any(|m| {
            m.id == "n3"
                && m.state == "suspect"
                && m.votes
                && m.unseen_for_ms.is_some()
                && m.grpc == n3.grpc
        }) && members(&n1).await == 2
    })
    .await;
    let top = support::weir()
        .args(["top", "--cluster", "--server", &n1.http])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    let first = top.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("members: ")
            && first.contains("n1 alive")
            && first.contains("n3 suspect (unseen"),
        "{top}"
    );

    n3.signal("CONT");
    eventually(Duration::from_secs(30), "n3 alive again on n1", || async {
        states(&view(&n1).await) == all_alive
    })
    .await;
}

/// A member killed with its data dir lost is forgotten as a voter once unseen for
/// `forget_after`: a fourth member takes its place, and the cluster keeps taking changes when a
/// second of the first three dies — where the dead one, still voting, left two of four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_for_good_is_forgotten_and_the_cluster_keeps_changing() {
    let config = format!("{CONFIG}\n[server]\nforget_after = \"3s\"\n");
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [config.as_str(); 3], &seed).await;
    policy_log_leader(&[&n1, &n2, &n3]).await;
    n3.signal("KILL");
    let _ = n3.wait();
    std::fs::remove_dir_all(dir.path().join("n3")).unwrap();
    let n4 = start_node(dir.path(), "n4", &config, &free_udp(), Some(&seed));
    eventually(
        Duration::from_secs(30),
        "n3 forgotten, n4 a voter",
        || async {
            let mut ids: Vec<String> = voters_seen(&n1)
                .await
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            ids.sort();
            ids == ["n1", "n2", "n4"]
        },
    )
    .await;
    n2.signal("KILL");
    let _ = n2.wait();
    eventually(
        Duration::from_secs(30),
        "a change committed by n1 and n4",
        || async { put_policy(&n1, "after_n2", 5, None).await.0 == 201 },
    )
    .await;
    // n2 goes the same way once unseen for as long: the two left are the voters.
    eventually(Duration::from_secs(30), "n2 forgotten too", || async {
        let mut ids: Vec<String> = voters_seen(&n4)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids == ["n1", "n4"]
    })
    .await;
    assert_eq!(put_policy(&n4, "after_n2", 6, None).await.0, 200);
}

/// `weir cluster forget` removes a voter gone for good at once, and refuses a member alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_forgotten_at_once_by_command_and_never_while_alive() {
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [CONFIG; 3], &seed).await;
    policy_log_leader(&[&n1, &n2, &n3]).await;
    n3.signal("KILL");
    let _ = n3.wait();
    let forget = |node: &str, through: &Server| {
        support::weir()
            .args(["cluster", "forget", node, "--server", &through.url("")])
            .output()
            .unwrap()
    };
    let refused = forget("n1", &n2);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("is alive"), "{said}");
    eventually(Duration::from_secs(10), "n3 seen as unseen", || async {
        voters_seen(&n1)
            .await
            .contains(&("n3".to_owned(), "suspect".to_owned()))
    })
    .await;
    // Through the member that does not lead, as through any.
    let forgot = forget("n3", &n2);
    assert!(
        forgot.status.success(),
        "{}",
        String::from_utf8_lossy(&forgot.stderr)
    );
    let answer: Value = serde_json::from_slice(&forgot.stdout).unwrap();
    assert_eq!(answer["forgotten"], "n3");
    assert_eq!(answer["voters"].as_array().unwrap().len(), 2, "{answer}");
    for server in [&n1, &n2] {
        eventually(Duration::from_secs(10), "two voters everywhere", || async {
            voters_seen(server).await.len() == 2
        })
        .await;
    }
    let again = forget("n3", &n1);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not a voter"));
}

const CENSUS_CONFIG: &str = r#"
[[policy]]
name = "reports"
on_exhausted = "reject"
concurrency = { node_limit = 0, shared_limit = 3, lease_ttl = "10s", on_unavailable = "closed" }
"#;

/// `CENSUS_CONFIG`'s tenure: a loan's TTL (`lease_ttl` and 2 s) plus the quorum's margin (4 s).
const CENSUS_TENURE: Duration = Duration::from_secs(16);

/// Asks `server` for a shared permit of `reports` on keys `k0`..`k39` (a few buckets of every
/// owner's), releasing each; the first refusal, if any.
async fn refusal_of_any_key(server: &Server) -> Option<Value> {
    let client = reqwest::Client::new();
    for i in 0..40 {
        let response = client
            .post(server.url("/v1/acquire"))
            .json(&json!({"policy": "reports", "key": format!("k{i}")}))
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap();
        if body["lease"].is_null() {
            return Some(body);
        }
        client
            .post(server.url("/v1/release"))
            .json(&json!({"lease": body["lease"]}))
            .send()
            .await
            .unwrap();
    }
    None
}

/// Waits until `server` grants every key, and checks that it did so by asking: before a
/// tenure had passed since the ring change at `changed`, when the tenure alone would still
/// refuse.
async fn granted_by_asking(server: &Server, changed: Instant, what: &str) {
    eventually(CENSUS_TENURE, what, || async {
        refusal_of_any_key(server).await.is_none()
    })
    .await;
    assert!(
        changed.elapsed() < CENSUS_TENURE,
        "{what}: granted only after the whole tenure ({:?})",
        changed.elapsed()
    );
}

/// A planned ring change keeps a `closed` shared tier available: the new owners ask every
/// member what it holds instead of waiting out a lease TTL. A join: the new node grants its
/// buckets once every member has answered; a graceful leave: the members that take the leaver's
/// buckets grant once it has answered on the ring without it. Each well before the tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_asks_instead_of_waiting_through_a_join_and_a_graceful_leave() {
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [CENSUS_CONFIG; 3], &seed).await;
    // The cluster's first tenure: nobody has watched a whole window yet.
    settle(&[&n1, &n2, &n3], Duration::from_secs(10)).await;
    assert_eq!(refusal_of_any_key(&n1).await, None);

    let joined = Instant::now();
    let n4 = start_node(dir.path(), "n4", CENSUS_CONFIG, &free_udp(), Some(&seed));
    converge(&[&n1, &n2, &n3, &n4], 4).await;
    granted_by_asking(&n4, joined, "n4's buckets granted after it joined").await;

    let left = Instant::now();
    n4.signal("TERM");
    granted_by_asking(&n1, left, "n4's buckets granted as it leaves").await;
    let (status, _) = tokio::task::spawn_blocking(move || n4.wait())
        .await
        .unwrap();
    assert!(status.success());
    converge(&[&n1, &n2, &n3], 3).await;
    assert_eq!(refusal_of_any_key(&n2).await, None, "after it left");
}

/// A file policy changed over the API in a cluster, then reverted through another member:
/// the revert goes through the policy log, and every member runs the file's version again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_through_any_member_brings_the_files_policy_back_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let [n1, n2, n3] = three_nodes(dir.path(), CONFIG).await;
    policy_log_leader(&[&n1, &n2, &n3]).await;
    let source_and_limit = |server: &Server| {
        let url = server.url("/v1/policies/search");
        async move {
            let response = reqwest::get(url).await.unwrap();
            let source = response
                .headers()
                .get("weir-policy-source")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (source, body["concurrency"]["shared_limit"].clone())
        }
    };
    let changed = json!({"on_exhausted": "reject", "concurrency": {"node_limit": 1, "shared_limit": 7, "lease_ttl": "10s", "on_unavailable": "closed"}});
    let put = reqwest::Client::new()
        .put(n1.url("/v1/policies/search"))
        .json(&changed)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    eventually(
        Duration::from_secs(20),
        "the change on every member",
        || async {
            for node in [&n1, &n2, &n3] {
                let (source, limit) = source_and_limit(node).await;
                if source.as_deref() != Some("api; overrides=file") || limit != json!(7) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let reverted = reqwest::Client::new()
        .delete(n2.url("/v1/policies/search/override"))
        .send()
        .await
        .unwrap();
    assert_eq!(reverted.status(), 200, "{}", reverted.text().await.unwrap());
    eventually(
        Duration::from_secs(20),
        "the file's on every member",
        || async {
            for node in [&n1, &n2, &n3] {
                let (source, limit) = source_and_limit(node).await;
                if source.as_deref() != Some("file") || limit != json!(2) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    // Nothing left to revert, through any member.
    let again = reqwest::Client::new()
        .delete(n3.url("/v1/policies/search/override"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
}

/// A rolling restart of the three nodes, one after another (SIGTERM, wait for the exit, start
/// again on the same data dir, wait until the cluster has it back): every line a node wrote
/// while it lived through the others' restarts and its own stop is INFO — a restart is normal
/// operation, and nothing in it should page anyone or read like a fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_logs_at_info_only() {
    let dir = tempfile::tempdir().unwrap();
    let seed = free_udp();
    let [n1, n2, n3] = three_nodes_through(dir.path(), [CONFIG; 3], &seed).await;
    policy_log_leader(&[&n1, &n2, &n3]).await;
    let mut logs = Vec::new();
    let mut up = vec![(n1, "n1"), (n2, "n2"), (n3, "n3")];
    for id in ["n3", "n2", "n1"] {
        let at = up.iter().position(|(_, up_id)| *up_id == id).unwrap();
        let (node, _) = up.remove(at);
        node.signal("TERM");
        let (status, log) = tokio::task::spawn_blocking(move || node.wait())
            .await
            .unwrap();
        assert!(status.success(), "{id}: {log}");
        logs.push((id, log));
        let join = (id != "n1").then_some(seed.as_str());
        let gossip = if id == "n1" { seed.clone() } else { free_udp() };
        up.push((start_node(dir.path(), id, CONFIG, &gossip, join), id));
        let servers: Vec<&Server> = up.iter().map(|(server, _)| server).collect();
        converge(&servers, 3).await;
        policy_log_leader(&servers).await;
    }
    for (id, log) in logs {
        let loud: Vec<&str> = log
            .lines()
            .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
            .collect();
        assert!(
            loud.is_empty(),
            "{id} logged above INFO:\n{}",
            loud.join("\n")
        );
    }
}
