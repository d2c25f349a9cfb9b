//! A member started on another cluster's data dir: its policy log carries the identity of the
//! cluster that made it, the members advertise theirs in gossip, and a member whose log no
//! other member shares stops at start, naming its data dir — instead of keeping the other
//! cluster's policies for good while it says it is ready.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::{Server, cluster_member, eventually, free_udp, has_policy, is_ready};

const CONFIG: &str = r#"
[[policy]]
name = "seed"
on_exhausted = "reject"
token_bucket = { rate = 10, burst = 10 }
"#;

const SECRET: &str = "both clusters share this secret";

fn node(data: &Path, id: &str, gossip: &str, join: Option<&str>) -> Server {
    cluster_member(CONFIG, data, (id, gossip, join), SECRET)
}

async fn put(server: &Server, name: &str) -> u16 {
    reqwest::Client::new()
        .put(server.url(&format!("/v1/policies/{name}")))
        .json(&json!({"on_exhausted": "reject", "token_bucket": {"rate": 5, "burst": 5}}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_another_clusters_data_dir_stops_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();

    // Cluster B: one node, one policy of its own.
    let b_data = dir.path().join("b");
    let b = node(&b_data, "n3", &free_udp(), None);
    eventually(Duration::from_secs(30), "B ready", || is_ready(&b)).await;
    eventually(Duration::from_secs(30), "B takes a change", || async {
        put(&b, "foreign").await == 201
    })
    .await;
    b.signal("TERM");
    assert!(b.wait().0.success());

    // Cluster A: three nodes.
    let seed = free_udp();
    let n1 = node(&dir.path().join("n1"), "n1", &seed, None);
    let n2 = node(&dir.path().join("n2"), "n2", &free_udp(), Some(&seed));
    let n3_data = dir.path().join("n3");
    let n3 = node(&n3_data, "n3", &free_udp(), Some(&seed));
    eventually(
        Duration::from_secs(60),
        "A's three members ready",
        || async { is_ready(&n1).await && is_ready(&n2).await && is_ready(&n3).await },
    )
    .await;
    assert_eq!(put(&n1, "home").await, 201);
    eventually(Duration::from_secs(10), "n3 has A's change", || {
        has_policy(&n3, "home")
    })
    .await;

    // n3 stopped, its data dir replaced by B's, started again in A.
    n3.signal("TERM");
    assert!(n3.wait().0.success());
    std::fs::remove_dir_all(&n3_data).unwrap();
    copy_dir(&b_data, &n3_data);
    let n3 = node(&n3_data, "n3", &free_udp(), Some(&seed));
    let stopped = tokio::task::spawn_blocking(move || n3.wait());
    let (status, stderr) = tokio::time::timeout(Duration::from_secs(60), stopped)
        .await
        .expect("the member on B's data dir stops within a minute")
        .unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("holds the policy log of another cluster")
            && stderr.contains(&n3_data.display().to_string()),
        "{stderr}"
    );

    // A is untouched: its change stands, B's never came in.
    assert!(has_policy(&n1, "home").await && has_policy(&n2, "home").await);
    assert!(!has_policy(&n1, "foreign").await && !has_policy(&n2, "foreign").await);
}
