//! A data dir that fills up, on a real disk that fills: a 4 MiB tmpfs mounted for the test (as
//! root; CI runs as root and sets `WEIR_REQUIRE_TMPFS`, so there it fails rather than skips).
//! A member's part of the cluster's policy log stops on "no space left on device": it must say
//! so (`/readyz`, `/metrics`), never acknowledge a change it has not applied, and run again on
//! its own once the disk has room. A node's kept buckets fail to be written: it says so, and
//! writes them again once there is room, without a restart, so a graceful stop keeps them.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::disk::{KEPT_DAY, fill, small_disk};
use support::{Server, cluster_member, eventually, free_udp, has_policy, is_ready};

const CONFIG: &str = r#"
[[policy]]
name = "seed"
on_exhausted = "reject"
token_bucket = { rate = 10, burst = 10 }
"#;

const SECRET: &str = "these nodes share this secret";

fn node(data: &Path, id: &str, gossip: &str, join: Option<&str>) -> Server {
    cluster_member(CONFIG, data, (id, gossip, join), SECRET)
}

/// `PUT /v1/policies/{name}` with a large description-like key set: its status.
async fn put(server: &Server, name: &str) -> u16 {
    // Kinds make the entry large: the log grows quickly on the small disk.
    let kinds: Vec<String> = (0..200).map(|i| format!("kind-{name}-{i:04}")).collect();
    reqwest::Client::new()
        .put(server.url(&format!("/v1/policies/{name}")))
        .json(&json!({"on_exhausted": "reject", "kinds": kinds, "token_bucket": {"rate": 5, "burst": 5}}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_disk_fills_says_so_acknowledges_nothing_and_runs_again_with_room() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("n3");
    let Some(tmpfs) = small_disk(&small) else {
        return;
    };
    let seed = free_udp();
    let n1 = node(&dir.path().join("n1"), "n1", &seed, None);
    let n2 = node(&dir.path().join("n2"), "n2", &free_udp(), Some(&seed));
    let n3 = node(&small.join("data"), "n3", &free_udp(), Some(&seed));
    eventually(Duration::from_secs(60), "three members ready", || async {
        is_ready(&n1).await && is_ready(&n2).await && is_ready(&n3).await
    })
    .await;
    assert_eq!(put(&n1, "before").await, 201);
    eventually(
        Duration::from_secs(10),
        "n3 has the first change",
        || async { has_policy(&n3, "before").await },
    )
    .await;

    fill(&small);
    // Changes through n1 until n3's log cannot keep them.
    let mut made = 0;
    eventually(Duration::from_secs(60), "n3 says it is not ready", || {
        made += 1;
        let name = format!("p{made}");
        let (n1, n3) = (&n1, &n3);
        async move {
            assert_eq!(put(n1, &name).await, 201, "the majority still commits");
            !is_ready(n3).await
        }
    })
    .await;
    let readyz = reqwest::get(n3.url("/readyz")).await.unwrap();
    assert_eq!(readyz.status(), 503);
    let why = readyz.text().await.unwrap();
    assert!(why.contains("policy log has stopped"), "{why}");
    assert_eq!(
        support::counter(&n3, "weir_policy_log_running").await,
        0,
        "the metric says it too"
    );
    // A change sent to it is not acknowledged: it has not applied it, and cannot.
    let status = put(&n3, "through-n3").await;
    assert!(
        status >= 500,
        "answered {status} by a member whose log stopped"
    );

    // Room again: it starts its log again on its own and catches up.
    std::fs::remove_file(small.join("filler")).unwrap();
    let last = format!("p{made}");
    eventually(
        Duration::from_secs(60),
        "n3 ready again, with every change",
        || async { is_ready(&n3).await && has_policy(&n3, &last).await },
    )
    .await;
    assert!(support::counter(&n3, "weir_policy_log_restarts_total").await >= 1);
    assert_eq!(support::counter(&n3, "weir_policy_log_running").await, 1);
    assert_eq!(put(&n3, "after").await, 201);
    eventually(
        Duration::from_secs(10),
        "n1 has the change made through n3",
        || async { has_policy(&n1, "after").await },
    )
    .await;
    drop((n1, n2, n3));
    drop(tmpfs);
}

/// Asks for `key` of `day` `times` times: how many were admitted.
async fn spend(server: &Server, key: &str, times: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..times {
        let status = reqwest::Client::new()
            .post(server.url("/v1/acquire"))
            .json(&json!({"policy": "day", "key": key}))
            .send()
            .await
            .unwrap()
            .status();
        admitted += usize::from(status == 200);
    }
    admitted
}

async fn readyz(server: &Server) -> serde_json::Value {
    reqwest::get(server.url("/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn kept_buckets_not_written_on_a_full_disk_are_said_and_written_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("disk");
    let Some(tmpfs) = small_disk(&small) else {
        return;
    };
    let data = small.join("data");
    let server = Server::start(KEPT_DAY, &data);
    assert_eq!(spend(&server, "tenant", 4).await, 4);
    fill(&small);
    assert_eq!(spend(&server, "tenant", 2).await, 2);
    let failed = "weir_kept_bucket_writes_total{outcome=\"failed\"}";
    eventually(
        Duration::from_secs(20),
        "a write fails on the full disk",
        || async { support::counter(&server, failed).await > 0 },
    )
    .await;
    let ready = readyz(&server).await;
    assert_eq!(ready["status"], "ready", "it still decides: {ready}");
    assert!(
        ready["warnings"][0]
            .as_str()
            .unwrap()
            .contains("kept buckets"),
        "{ready}"
    );

    // Room again: the next write goes through, without a restart.
    std::fs::remove_file(small.join("filler")).unwrap();
    eventually(
        Duration::from_secs(20),
        "the warning gone once written",
        || async { readyz(&server).await.get("warnings").is_none() },
    )
    .await;
    server.signal("TERM");
    let (status, stderr) = server.wait();
    assert!(status.success(), "{stderr}");
    let written = stderr
        .lines()
        .filter(|l| l.contains("the kept buckets were not written"))
        .count();
    assert_eq!(written, 1, "one line however many walks failed:\n{stderr}");

    // Six of ten spent before the stop: four left after it.
    let server = Server::start(KEPT_DAY, &data);
    assert_eq!(spend(&server, "tenant", 10).await, 4);
    drop(server);
    drop(tmpfs);
}
