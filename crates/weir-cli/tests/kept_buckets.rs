//! Quotas that outlive the process: a real `weir serve` spends most of a long quota, is
//! killed (`kill -9`) or stopped, and starts again on the same data dir.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Server, counter, eventually};

/// Two long quotas of 100: a week's fixed window (the calendar's week, so a test never spans
/// two of them in practice) and a token bucket refilling 100 a day. A third policy refills in
/// a second: below `durable_after`, never kept.
const CONFIG: &str = r#"
[[policy]]
name = "week"
on_exhausted = "reject"
fixed_window = { limit = 100, window = "7d" }

[[policy]]
name = "day"
on_exhausted = "reject"
token_bucket = { rate = 0.00115740740740, burst = 100 }

[[policy]]
name = "second"
on_exhausted = "reject"
token_bucket = { rate = 100, burst = 100 }
"#;

const POLICIES: [&str; 3] = ["week", "day", "second"];

/// Asks `policy` for `key` until it refuses, at most `most` times: how many it admitted.
async fn admitted(server: &Server, policy: &str, key: &str, most: usize) -> usize {
    let client = reqwest::Client::new();
    for n in 0..most {
        let status = client
            .post(server.url("/v1/acquire"))
            .json(&json!({"policy": policy, "key": key}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        match status {
            200 => {}
            429 => return n,
            other => panic!("{policy}: unexpected {other}"),
        }
    }
    most
}

/// Spends 70 of each policy's 100 for `tenant`.
async fn spend_70(server: &Server) {
    for policy in POLICIES {
        assert_eq!(admitted(server, policy, "tenant", 70).await, 70, "{policy}");
    }
}

/// What is left of each policy for `tenant` (100: whole; the fast bucket refills as it is
/// asked, so it is asked no more than that).
async fn left(server: &Server) -> Vec<(&'static str, usize)> {
    let mut left = Vec::new();
    for policy in POLICIES {
        left.push((policy, admitted(server, policy, "tenant", 100).await));
    }
    left
}

/// Waits until every decision made so far is written: two walks after now, since one under way
/// now may have looked before the last decision.
async fn written(server: &Server) {
    let walks = counter(server, "weir_kept_bucket_walks_total").await;
    eventually(
        Duration::from_secs(10),
        "two walks of the kept buckets",
        || async { counter(server, "weir_kept_bucket_walks_total").await >= walks + 2 },
    )
    .await;
}

#[tokio::test]
async fn a_long_quota_is_as_spent_after_kill_9_as_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(CONFIG, &data);
    spend_70(&server).await;
    written(&server).await;
    server.signal("KILL");
    let (status, _) = server.wait();
    assert!(!status.success(), "it was killed");

    let server = Server::start(CONFIG, &data);
    assert_eq!(
        counter(&server, "weir_kept_buckets_restored_total").await,
        2
    );
    // The long quotas have their 30 left; the fast bucket, not kept, is whole again.
    assert_eq!(
        left(&server).await,
        [("week", 30), ("day", 30), ("second", 100)]
    );
}

#[tokio::test]
async fn a_graceful_stop_keeps_every_decision_up_to_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Written once a minute: only the stop itself can have written the last decisions.
    let config = format!("[server]\ndurable_flush = \"1m\"\n{CONFIG}");
    let server = Server::start(&config, &data);
    spend_70(&server).await;
    server.signal("TERM");
    let (status, _) = server.wait();
    assert!(status.success(), "{status}");

    let server = Server::start(&config, &data);
    assert_eq!(
        left(&server).await,
        [("week", 30), ("day", 30), ("second", 100)]
    );
}

#[tokio::test]
async fn a_durable_after_longer_than_a_day_keeps_only_the_week() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = format!("[server]\ndurable_after = \"2d\"\n{CONFIG}");
    let server = Server::start(&config, &data);
    spend_70(&server).await;
    server.signal("TERM");
    assert!(server.wait().0.success());

    let server = Server::start(&config, &data);
    assert_eq!(
        left(&server).await,
        [("week", 30), ("day", 100), ("second", 100)]
    );
}

/// `CL.THROTTLE key 9 10 3600` through redis-rs: 10 an hour, a burst of 10; the reply's
/// `remaining`.
async fn hourly_remaining(resp: &str) -> i64 {
    let client = redis::Client::open(format!("redis://{resp}")).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let verdict: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg("tenant")
        .arg(9)
        .arg(10)
        .arg(3600)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(verdict[0], 0, "admitted: {verdict:?}");
    verdict[2]
}

#[tokio::test]
async fn a_cl_throttle_key_of_an_hour_is_as_spent_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--resp", "127.0.0.1:0"];
    let server = Server::start_full(CONFIG, &data, &[], &args);
    let resp = server.resp.clone().unwrap();
    for spent in 1..=7 {
        assert_eq!(hourly_remaining(&resp).await, 10 - spent);
    }
    written(&server).await;
    server.signal("KILL");
    let _ = server.wait();

    let server = Server::start_full(CONFIG, &data, &[], &args);
    // The eighth call of the hour, as if there had been no restart.
    assert_eq!(hourly_remaining(server.resp.as_ref().unwrap()).await, 2);
}
