//! Cluster mode with three real `weir serve` processes on loopback, joined by gossip.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Server;

const CONFIG: &str = r#"
[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1, shared_limit = 2, lease_ttl = "30s", on_unavailable = "closed" }
"#;

fn free_udp() -> String {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

fn node(dir: &std::path::Path, id: &str, gossip: &str, join: Option<&str>) -> Server {
    let mut args = vec!["--node-id", id, "--gossip", gossip];
    if let Some(seed) = join {
        args.extend(["--join", seed]);
    }
    Server::start_full(CONFIG, &dir.join(id), &[], &args)
}

async fn members(server: &Server) -> usize {
    let body: Value = reqwest::get(server.url("/v1/cluster"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["members"].as_array().map_or(0, Vec::len)
}

/// Polls (bounded) until every server sees `count` members.
async fn converge(servers: &[&Server], count: usize) {
    let start = Instant::now();
    loop {
        let mut all = true;
        for server in servers {
            all &= members(server).await == count;
        }
        if all {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gossip did not converge to {count}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let seed = free_udp();
    let n1 = node(dir.path(), "n1", &seed, None);
    let n2 = node(dir.path(), "n2", &free_udp(), Some(&seed));
    let n3 = node(dir.path(), "n3", &free_udp(), Some(&seed));
    converge(&[&n1, &n2, &n3], 3).await;

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
    // policy's lease_ttl (30 s) a renewal is cut to it.
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
    assert!((29_000..=30_000).contains(&left), "{body}");

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
