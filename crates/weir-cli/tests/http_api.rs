//! The HTTP API of a real `weir serve`: every endpoint and every error path.

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::Server;

const CONFIG: &str = r#"
[server]
lease_sweep = "50ms"
max_cost = 100

[[policy]]
name = "tokens"
on_exhausted = "reject"
token_bucket = { rate = 1, burst = 2 }

[[policy]]
name = "inflight"
on_exhausted = "reject"
concurrency = { node_limit = 1, lease_ttl = "300ms" }

[[policy]]
name = "adaptive"
on_exhausted = "reject"
adaptive = { control = "stepwise", top_k = 1, ratio = 0.5 }

[[policy]]
name = "queue"
on_exhausted = "wait"
max_wait = "60s"
concurrency = { node_limit = 1, lease_ttl = "60s" }
"#;

fn start() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    (server, dir)
}

async fn post(
    server: &Server,
    path: &str,
    body: Value,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let response = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

async fn get(server: &Server, path: &str) -> (StatusCode, Value) {
    let response = reqwest::get(server.url(path)).await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn acquire_admits_then_refuses_with_retry_after_and_ratelimit_fields() {
    let (server, _dir) = start();
    let request = json!({"policy": "tokens", "key": "tenant-a"});
    for _ in 0..2 {
        let (status, headers, body) = post(&server, "/v1/acquire", request.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["admitted"], true);
        assert_eq!(body["tier"], "node");
        assert_eq!(headers["ratelimit-policy"], "\"tokens\";q=1;w=1");
    }
    let (status, headers, body) = post(&server, "/v1/acquire", request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["admitted"], false);
    let retry = body["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 500 && retry <= 1000, "{retry}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["ratelimit"], "\"tokens\";r=0;t=1");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .starts_with("policy `tokens`: rate limited")
    );
    // Another tenant has its own bucket.
    let (status, _, _) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "tokens", "key": "tenant-b"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn concurrency_leases_are_released_renewed_and_reclaimed() {
    let (server, _dir) = start();
    let request = json!({"policy": "inflight", "key": "search-group"});
    let (status, _, body) = post(&server, "/v1/acquire", request.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let lease = body["lease"].as_str().unwrap().to_owned();
    assert_eq!(body["lease_ttl_ms"], 300);
    let (status, headers, body) = post(&server, "/v1/acquire", request.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        headers.get("retry-after").is_none(),
        "no time can be promised"
    );
    assert_eq!(body["retry_after_ms"], Value::Null);

    // A renewal is cut to the policy's lease_ttl: nobody pins a permit for 584 years.
    let (status, _, body) = post(
        &server,
        "/v1/renew",
        json!({"lease": lease, "ttl_ms": u64::MAX}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let left = body["expires_in_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 300, "{body}");
    let (_, _, body) = post(&server, "/v1/renew", json!({"lease": lease, "ttl_ms": 100})).await;
    assert!(body["expires_in_ms"].as_u64().unwrap() <= 100, "{body}");
    // Ids are 128 random bits: another lease shares no prefix or serial with this one.
    let (_, _, other) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "inflight", "key": "another-group"}),
    )
    .await;
    let other = other["lease"].as_str().unwrap();
    assert_eq!((lease.len(), other.len()), (32, 32));
    assert_ne!(
        lease[..16],
        other[..16],
        "{lease} and {other} share a prefix"
    );
    assert_ne!(
        lease[16..],
        other[16..],
        "{lease} and {other} share a suffix"
    );
    post(&server, "/v1/release", json!({"lease": other})).await;
    let (status, _, _) = post(&server, "/v1/release", json!({"lease": lease})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = post(&server, "/v1/release", json!({"lease": lease})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "unknown_lease");
    let (status, _, body) = post(&server, "/v1/renew", json!({"lease": "nonsense"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("lease"));

    // A lease nobody releases comes back within its TTL plus one sweep.
    let (status, _, _) = post(&server, "/v1/acquire", request.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let start = Instant::now();
    loop {
        let (status, _, _) = post(&server, "/v1/acquire", request.clone()).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the lease was never reclaimed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("weir_leases_expired_total 1"), "{metrics}");
}

#[tokio::test]
async fn busy_signals_reach_adaptive_policies_only() {
    let (server, _dir) = start();
    for _ in 0..30 {
        let (status, _, _) = post(
            &server,
            "/v1/acquire",
            json!({"policy": "adaptive", "key": "table-1", "kind": "PREPARE_ROWSET"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _, body) = post(&server, "/v1/busy", json!({"policy": "adaptive"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tightened"], true);
    let (status, rows) = get(&server, "/v1/throttles?policy=adaptive").await;
    assert_eq!(status, StatusCode::OK);
    let row = &rows["rows"][0];
    assert_eq!(
        (row["key"].as_str(), row["kind"].as_str()),
        (Some("table-1"), Some("PREPARE_ROWSET"))
    );
    assert_eq!(row["qps_limit"], 5.0);
    assert_eq!(row["node_id"], "local");

    let (status, _, body) = post(&server, "/v1/busy", json!({"policy": "tokens"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "conflict");
    let (status, _, _) = post(&server, "/v1/busy", json!({"policy": "nope"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The default control: a busy POST (no call attached) cuts the hot key by `ratio`, and the
/// server's once-a-second tick releases it after two quiet intervals with its limit unused.
#[tokio::test]
async fn a_busy_post_limits_the_hot_key_and_the_ticks_relax_it_converging() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        r#"
[[policy]]
name = "converging"
on_exhausted = "reject"
adaptive = { top_k = 1, ratio = 0.5, upgrade_interval = "1s", downgrade_interval = "2s" }
"#,
        &dir.path().join("data"),
    );
    for _ in 0..30 {
        let (status, _, _) = post(
            &server,
            "/v1/acquire",
            json!({"policy": "converging", "key": "table-1", "kind": "PREPARE_ROWSET"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _, body) = post(&server, "/v1/busy", json!({"policy": "converging"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tightened"], true);
    let (_, rows) = get(&server, "/v1/throttles?policy=converging").await;
    let row = &rows["rows"][0];
    assert_eq!(row["key"].as_str(), Some("table-1"));
    let limit = row["qps_limit"].as_f64().unwrap();
    assert!(limit.is_finite() && limit >= 1.0, "limit {limit}");
    // Released on the server's ticks: two quiet intervals of 2 s, a tick a second. Bounded
    // well past that, so a slow machine does not fail it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, rows) = get(&server, "/v1/throttles?policy=converging").await;
        if rows["rows"].as_array().is_some_and(|r| r.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "still limited: {rows}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _, _) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "converging", "key": "table-1", "kind": "PREPARE_ROWSET"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn throttles_sort_filter_and_reject_unknown_columns() {
    let (server, _dir) = start();
    for key in ["a", "a", "a", "b", "b", "b", "b"] {
        post(
            &server,
            "/v1/acquire",
            json!({"policy": "tokens", "key": key}),
        )
        .await;
    }
    let (status, body) = get(&server, "/v1/throttles?sort=key&order=asc").await;
    assert_eq!(status, StatusCode::OK);
    let keys: Vec<&str> = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "b"]);
    let (_, body) = get(&server, "/v1/throttles?node=elsewhere").await;
    assert_eq!(body["rows"], json!([]));
    let (status, body) = get(&server, "/v1/throttles?sort=colour").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("`sort` must be one of")
    );
    let (status, _) = get(&server, "/v1/throttles?policy=nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn policies_are_read_created_replaced_and_deleted_with_etags() {
    let (server, _dir) = start();
    let client = reqwest::Client::new();
    let (status, list) = get(&server, "/v1/policies").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["policies"].as_array().unwrap().len(), 4);

    let created = client
        .put(server.url("/v1/policies/new"))
        .json(&json!({"strict": {"qps": 5}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let etag = created.headers()["etag"].to_str().unwrap().to_owned();
    let body: Value = created.json().await.unwrap();
    assert_eq!(body["name"], "new");

    let fetched = client
        .get(server.url("/v1/policies/new"))
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.headers()["etag"].to_str().unwrap(), etag);

    let stale = client
        .put(server.url("/v1/policies/new"))
        .header("if-match", "\"0000000000000000\"")
        .json(&json!({"strict": {"qps": 6}}))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
    let replaced = client
        .put(server.url("/v1/policies/new"))
        .header("if-match", &etag)
        .json(&json!({"strict": {"qps": 6}}))
        .send()
        .await
        .unwrap();
    assert_eq!(replaced.status(), StatusCode::OK);
    assert_ne!(replaced.headers()["etag"].to_str().unwrap(), etag);

    let invalid = client
        .put(server.url("/v1/policies/new"))
        .json(&json!({"strict": {"qps": -6}}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    let body: Value = invalid.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "policy `new`: `strict.qps` must be a finite number greater than zero, got -6"
    );
    let (_, current) = get(&server, "/v1/policies/new").await;
    assert_eq!(
        current["strict"]["qps"], 6.0,
        "a rejected change leaves the old one running"
    );

    let mismatch = client
        .put(server.url("/v1/policies/new"))
        .json(&json!({"name": "other", "strict": {"qps": 6}}))
        .send()
        .await
        .unwrap();
    assert_eq!(mismatch.status(), StatusCode::BAD_REQUEST);

    let deleted = client
        .delete(server.url("/v1/policies/new"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    assert!(
        deleted.headers().contains_key("etag"),
        "a delete answers the policy it deleted, with its ETag"
    );
    let gone: Value = deleted.json().await.unwrap();
    assert_eq!(gone["name"], "new", "{gone}");
    let (status, _) = get(&server, "/v1/policies/new").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let again = client
        .delete(server.url("/v1/policies/new"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_input_gets_a_4xx_that_names_the_problem() {
    let (server, _dir) = start();
    let client = reqwest::Client::new();
    let raw = |body: &'static str| {
        client
            .post(server.url("/v1/acquire"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: [(&str, StatusCode, &str); 4] = [
        ("{not json", StatusCode::BAD_REQUEST, "invalid_request"),
        (
            r#"{"policy":"tokens","key":"a","colour":1}"#,
            StatusCode::BAD_REQUEST,
            "colour",
        ),
        (r#"{"policy":"tokens"}"#, StatusCode::BAD_REQUEST, "key"),
        (
            r#"{"policy":"tokens","key":""}"#,
            StatusCode::BAD_REQUEST,
            "`key` must not be empty",
        ),
    ];
    for (body, status, mention) in cases {
        let response = raw(body).await.unwrap();
        assert_eq!(response.status(), status, "{body}");
        let answer: Value = response.json().await.unwrap();
        let text = answer.to_string();
        assert!(text.contains(mention), "{body} → {text}");
        assert!(answer["error"].is_string() && answer["detail"].is_string());
    }
    let long_key = "k".repeat(257);
    let (status, _, body) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "tokens", "key": long_key}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("257 bytes"));
    for cost in [0, 101] {
        let (status, _, body) = post(
            &server,
            "/v1/acquire",
            json!({"policy": "tokens", "key": "a", "cost": cost}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("between 1 and 100"),
            "{body}"
        );
    }
    let (status, _, body) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "nope", "key": "a"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "unknown_policy");

    let huge = format!(r#"{{"policy":"tokens","key":"{}"}}"#, "k".repeat(70_000));
    let response = client
        .post(server.url("/v1/acquire"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (status, body) = get(&server, "/v1/nothing-here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found");
    // After all that, the server still answers.
    let (status, _) = get(&server, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn health_readiness_cluster_and_metrics() {
    let (server, _dir) = start();
    assert_eq!(get(&server, "/healthz").await.0, StatusCode::OK);
    assert_eq!(get(&server, "/readyz").await.0, StatusCode::OK);
    let (status, cluster) = get(&server, "/v1/cluster").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cluster["members"][0]["id"], "local");
    // One shape alone and in a cluster (the cluster test reads the same fields).
    assert_eq!(cluster["mode"], "single node", "{cluster}");
    assert_eq!(cluster["counters"]["buckets_owned"], 0, "{cluster}");
    assert_eq!(cluster["ring"]["members"], 1, "{cluster}");
    post(
        &server,
        "/v1/acquire",
        json!({"policy": "tokens", "key": "a"}),
    )
    .await;
    let response = reqwest::get(server.url("/metrics")).await.unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = response.text().await.unwrap();
    for series in [
        "weir_requests_total{policy=\"tokens\"} 1",
        "weir_decisions_total{policy=\"tokens\",outcome=\"admitted\",decided=\"here\"} 1",
        "weir_wait_seconds_bucket{policy=\"tokens\",le=\"+Inf\"} 0",
        "weir_keys{policy=\"tokens\"} 1",
        "weir_api_requests_total{api=\"http\",endpoint=\"/v1/acquire\",code=\"200\"} 1",
        "weir_leases_active 0",
    ] {
        assert!(text.contains(series), "missing {series}");
    }
    assert!(!text.contains("key=\""), "no series is labelled by key");
}

#[tokio::test]
async fn admin_calls_need_the_token_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", "s3cret")],
    );
    let client = reqwest::Client::new();
    let put = |token: Option<&str>| {
        let request = client
            .put(server.url("/v1/policies/guarded"))
            .json(&json!({"strict": {"qps": 1}}));
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
        .send()
    };
    assert_eq!(put(None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        put(Some("wrong")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        put(Some("s3cret")).await.unwrap().status(),
        StatusCode::CREATED
    );
    let delete = client
        .delete(server.url("/v1/policies/guarded"))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), StatusCode::UNAUTHORIZED);
    // Reads and decisions need no token.
    assert_eq!(get(&server, "/v1/policies/guarded").await.0, StatusCode::OK);

    // The token is checked before the body is read: bad JSON without it learns nothing.
    let blind = client
        .put(server.url("/v1/policies/guarded"))
        .header("content-type", "application/json")
        .body("{ \"strict\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(blind.status(), StatusCode::UNAUTHORIZED);
    let body: Value = blind.json().await.unwrap();
    assert_eq!(body["error"], "unauthenticated", "{body}");
    assert!(!body.to_string().contains("EOF"), "{body}");
    // RFC 9110: the scheme is case-insensitive.
    for scheme in ["bearer", "BEARER", "Bearer  "] {
        let put = client
            .put(server.url("/v1/policies/guarded"))
            .header("authorization", format!("{scheme} s3cret"))
            .json(&json!({"strict": {"qps": 2}}))
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), StatusCode::OK, "scheme {scheme:?}");
    }
}

/// A wrong method gets the same `{error, detail}` shape as every other error.
#[tokio::test]
async fn a_wrong_method_is_405_in_the_error_shape() {
    let (server, _dir) = start();
    let response = reqwest::get(server.url("/v1/acquire")).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        response.headers().contains_key("allow"),
        "{:?}",
        response.headers()
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "method_not_allowed");
    assert!(body["detail"].as_str().unwrap().contains("GET"), "{body}");
}

/// A client that hangs up while its acquire waits takes the waiter with it: the permit that
/// comes free later is not handed to a caller that has gone.
#[tokio::test]
async fn a_waiting_request_whose_client_hangs_up_stops_waiting() {
    use tokio::io::AsyncWriteExt;
    let (server, _dir) = start();
    let (status, _, held) = post(
        &server,
        "/v1/acquire",
        json!({"policy": "queue", "key": "q"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let address = server.http.trim_start_matches("http://").to_owned();
    let body = r#"{"policy":"queue","key":"q"}"#;
    let mut clients = Vec::new();
    for _ in 0..5 {
        let mut tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
        let request = format!(
            "POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        clients.push(tcp);
    }
    let waiters = |n: u64| format!("weir_waiters{{policy=\"queue\"}} {n}\n");
    let metrics = || async {
        reqwest::get(server.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let started = Instant::now();
    while !metrics().await.contains(&waiters(5)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never 5 waiters"
        );
        tokio::task::yield_now().await;
    }
    drop(clients);
    while !metrics().await.contains(&waiters(0)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiters outlived their clients"
        );
        tokio::task::yield_now().await;
    }
    let (status, _, _) = post(&server, "/v1/release", json!({"lease": held["lease"]})).await;
    assert_eq!(status, StatusCode::OK);
    let text = metrics().await;
    assert!(text.contains("weir_leases_active 0\n"), "{text}");
}
