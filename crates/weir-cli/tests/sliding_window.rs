//! The sliding window counter through every front door of a real `weir serve`, added with no
//! change to any of them: a policy from the config file and one put over HTTP, acquires over
//! HTTP and over the Redis protocol (`redis-cli`), an Envoy rate limit rule with
//! `weir_algorithm: sliding_window` over gRPC, and a limit too large refused by name.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::{Server, weir};
use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use weir_api::envoy::service::ratelimit::v3::RateLimitRequest;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::Code as RlsCode;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
sliding_window = { limit = 3, window = "1h" }
"#;

const RULES: &str = r#"
domain: edge
weir_algorithm: sliding_window
descriptors:
  - key: client
    rate_limit: { unit: hour, requests_per_unit: 2 }
"#;

fn start(dir: &tempfile::TempDir) -> Server {
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let config = format!(
        "{CONFIG}\n[rls]\nconfig = {:?}\n",
        rules.display().to_string()
    );
    Server::start_full(
        &config,
        &dir.path().join("data"),
        &[],
        &["--resp", "127.0.0.1:0"],
    )
}

async fn acquire(server: &Server, key: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": "api", "key": key}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// `redis-cli` on the server's Redis port, if it is installed (required where CI says so).
fn redis_cli(resp: &str, args: &[&str]) -> Option<String> {
    let (host, port) = resp.rsplit_once(':').unwrap();
    match Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
    {
        Ok(output) if output.status.success() => Some(String::from_utf8(output.stdout).unwrap()),
        _ => {
            assert!(
                std::env::var_os("WEIR_REQUIRE_REDIS").is_none(),
                "redis-cli is required here"
            );
            eprintln!("skipping the Redis protocol: redis-cli is not installed");
            None
        }
    }
}

#[tokio::test]
async fn a_sliding_window_policy_limits_over_http_and_the_redis_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir);
    for _ in 0..3 {
        let (status, body) = acquire(&server, "tenant-a").await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = acquire(&server, "tenant-a").await;
    assert_eq!(status, 429, "{body}");
    // Refused hits are not counted: the wait is until an hour's weight leaves room.
    let retry = body["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 0 && retry <= 2 * 3_600_000, "{retry}");

    // The policy reads back as written, and a new limit keeps what was counted.
    let policy: Value = reqwest::get(server.url("/v1/policies/api"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        policy["sliding_window"],
        json!({"limit": 3, "window": "1h"})
    );
    let put = reqwest::Client::new()
        .put(server.url("/v1/policies/api"))
        .json(&json!({"on_exhausted": "reject", "sliding_window": {"limit": 4, "window": "1h"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200, "{}", put.text().await.unwrap());
    assert_eq!(acquire(&server, "tenant-a").await.0, 200);
    assert_eq!(acquire(&server, "tenant-a").await.0, 429);

    // The Redis protocol's acquire, on a key of its own.
    let resp = server.resp.clone().unwrap();
    if let Some(first) = redis_cli(&resp, &["WEIR.ACQUIRE", "api", "tenant-b"]) {
        assert!(first.starts_with("admitted\n1\n"), "{first}");
        for _ in 0..3 {
            redis_cli(&resp, &["WEIR.ACQUIRE", "api", "tenant-b"]);
        }
        let refused = redis_cli(&resp, &["WEIR.ACQUIRE", "api", "tenant-b"]).unwrap();
        assert!(refused.starts_with("admitted\n0\n"), "{refused}");
    }
}

#[tokio::test]
async fn an_envoy_rule_counts_through_a_sliding_window_when_it_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir);
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "client".to_owned(),
                value: "c1".to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    let mut codes = Vec::new();
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let answer = client
            .should_rate_limit(request.clone())
            .await
            .unwrap()
            .into_inner();
        codes.push(answer.overall_code);
        remaining.push(answer.statuses[0].limit_remaining);
    }
    let (ok, over) = (RlsCode::Ok as i32, RlsCode::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over, over]);
    assert_eq!(remaining, [1, 0, 0, 0]);
    let policy: Value = reqwest::get(server.url("/v1/policies/rls:edge.client"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(policy["sliding_window"]["limit"], 2, "{policy}");
}

#[test]
fn a_limit_the_window_cannot_count_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        "[[policy]]\nname = \"big\"\non_exhausted = \"reject\"\nsliding_window = { limit = 5000000, window = \"1s\" }\n",
    )
    .unwrap();
    let output = weir().arg("check-config").arg(&config).output().unwrap();
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("sliding_window.limit") && text.contains("4194303"),
        "{text}"
    );
}
