//! OpenTelemetry traces as a collector receives them: a stub OTLP/HTTP receiver on loopback
//! decodes what `weir serve --otlp-endpoint` sends (OTLP's own protobuf types) and counts the
//! spans — one per admission, with its policy, kind, tier and decision (over HTTP, the Redis
//! protocol's `CL.THROTTLE` and Envoy's `ShouldRateLimit` alike), and in cluster mode one per
//! call to the owner.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use support::Server;
use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use weir_api::envoy::service::ratelimit::v3::RateLimitRequest;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// The repository's root.
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A span as received: its name, its attributes as text, and its resource's.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    attributes: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

/// A stub collector: `POST /v1/traces` with OTLP protobuf, every span kept.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&spans);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut kept = kept.lock().unwrap();
                for resource_spans in request.resource_spans {
                    let resource = resource_spans
                        .resource
                        .map(|r| attributes(&r.attributes))
                        .unwrap_or_default();
                    for scope in resource_spans.scope_spans {
                        for span in scope.spans {
                            kept.push(Received {
                                name: span.name,
                                attributes: attributes(&span.attributes),
                                resource: resource.clone(),
                            });
                        }
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [(http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (address, spans)
}

/// Asks `server` for one admission of `policy` for `key`; the status.
async fn acquire(server: &Server, policy: &str, key: &str) -> u16 {
    reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&serde_json::json!({"policy": policy, "key": key, "kind": "search"}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Stops `server` with SIGTERM (the exporter sends what it holds on the way out) and checks
/// it stopped cleanly.
async fn stop(server: Server) {
    server.signal("TERM");
    let (status, stderr) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        !stderr.contains("not all sent"),
        "spans were lost: {stderr}"
    );
}

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }

[[policy]]
name = "shared"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }
"#;

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_acquires_are_ten_admission_spans_with_how_each_ended() {
    let (endpoint, spans) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_full(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_OTLP_ENDPOINT", &endpoint)],
        &[
            "--node-id",
            "traced",
            "--resp",
            "127.0.0.1:0",
            "--rls-config",
            &repo()
                .join("docs/envoy/ratelimit.yaml")
                .display()
                .to_string(),
        ],
    );
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(acquire(&server, "api", "tenant-a").await);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    // The other two ways in: redis-cell's command and Envoy's.
    let resp = format!("redis://{}/", server.resp.as_deref().unwrap());
    let mut redis = redis::Client::open(resp)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for limited in [0, 1] {
        let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg("cell-key")
            .arg(0)
            .arg(1)
            .arg(60)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(reply[0], limited);
    }
    let mut rls = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let answer = rls
        .should_rate_limit(RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: "alice".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK");
    stop(server).await;

    let spans = spans.lock().unwrap().clone();
    let cells = spans
        .iter()
        .filter(|s| s.attributes.get("policy").map(String::as_str) == Some("CL.THROTTLE"))
        .map(|s| s.attributes["decision"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(cells, ["admitted", "refused"], "{spans:#?}");
    let envoy = named(&spans, "rls_decision");
    assert_eq!(envoy.len(), 1, "{spans:#?}");
    assert_eq!(
        (
            envoy[0].attributes["domain"].as_str(),
            envoy[0].attributes["descriptors"].as_str(),
            envoy[0].attributes["decision"].as_str()
        ),
        ("edge", "1", "admitted")
    );
    let admissions: Vec<&Received> = named(&spans, "admission")
        .into_iter()
        .filter(|s| s.attributes["policy"] != "CL.THROTTLE")
        .collect();
    assert_eq!(admissions.len(), 10, "{spans:#?}");
    let mut decisions = BTreeMap::new();
    for span in &admissions {
        let a = &span.attributes;
        assert_eq!(
            (a["policy"].as_str(), a["kind"].as_str(), a["key"].as_str()),
            ("api", "search", "tenant-a")
        );
        assert_eq!(a["cost"], "1");
        *decisions.entry(a["decision"].clone()).or_insert(0) += 1;
        if a["decision"] == "admitted" {
            assert_eq!(a["tier"], "node");
        } else {
            assert!(!a.contains_key("tier"), "a refusal has no tier: {a:?}");
        }
        assert_eq!(span.resource["service.name"], "weir");
        assert_eq!(span.resource["service.instance.id"], "traced");
    }
    assert_eq!(
        decisions,
        BTreeMap::from([("admitted".to_owned(), 5), ("refused".to_owned(), 5)])
    );
    // Nothing else is exported: the log's own events and spans stay in the log.
    assert_eq!(spans.len(), 13, "{spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_decision_is_a_span_around_the_owner_call() {
    let (endpoint, spans) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let udp = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string()
    };
    let seed = udp();
    let node = |id: &str, gossip: &str, join: Option<&str>| {
        let mut args = vec!["--node-id", id, "--gossip", gossip];
        if let Some(seed) = join {
            args.extend(["--join", seed]);
        }
        Server::start_full(
            CONFIG,
            &dir.path().join(id),
            &[
                ("WEIR_OTLP_ENDPOINT", &endpoint),
                ("WEIR_CLUSTER_SECRET", "two nodes share this secret"),
            ],
            &args,
        )
    };
    let nodes = [node("n1", &seed, None), node("n2", &udp(), Some(&seed))];
    let started = Instant::now();
    loop {
        let mut seen = Vec::new();
        for node in &nodes {
            let view: serde_json::Value = reqwest::get(node.url("/v1/cluster"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            // Members seen, the ring rebuilt from them, and every member's handover in.
            let members = view["members"].as_array().map_or(0, Vec::len);
            let handed_over = view["ring"]["handed_over"] == true;
            seen.push(match handed_over {
                true => members.min(view["ring"]["members"].as_u64().unwrap_or(0) as usize),
                false => 0,
            });
        }
        if seen == [2, 2] {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut admitted = 0;
    for _ in 0..5 {
        for node in &nodes {
            admitted += usize::from(acquire(node, "shared", "tenant-a").await == 200);
        }
    }
    assert_eq!(admitted, 5);
    let [n1, n2] = nodes;
    stop(n1).await;
    stop(n2).await;

    let spans = spans.lock().unwrap().clone();
    let admissions = named(&spans, "admission");
    assert_eq!(admissions.len(), 10, "{spans:#?}");
    // The five asked of the node that does not own the bucket went to the owner: each in an
    // owner call that node made, reached; each it admitted says tier `owner`. The owner admits
    // its own on tier `node`.
    let calls = named(&spans, "owner_call");
    let instance = |span: &Received| span.resource["service.instance.id"].clone();
    let tier_of = |node: &str| {
        let tiers: std::collections::BTreeSet<String> = admissions
            .iter()
            .filter(|a| instance(a) == node && a.attributes["decision"] == "admitted")
            .map(|a| a.attributes["tier"].clone())
            .collect();
        tiers.into_iter().collect::<Vec<_>>()
    };
    let (caller, owner) = if tier_of("n2") == ["owner"] {
        ("n2", "n1")
    } else {
        ("n1", "n2")
    };
    assert_eq!(tier_of(caller), ["owner"], "{admissions:#?}");
    assert_eq!(tier_of(owner), ["node"], "{admissions:#?}");
    let mut decided = BTreeMap::new();
    let mut handed_over = BTreeMap::new();
    for call in &calls {
        assert_eq!(call.attributes["reached"], "true", "{call:?}");
        let kind = &call.attributes["call"];
        let count = match kind.as_str() {
            "decide" | "decide_batch" => &mut decided,
            "hand_over" => &mut handed_over,
            _ => panic!("an owner call of an unexpected kind: {call:?}"),
        };
        *count.entry(instance(call)).or_insert(0) +=
            call.attributes["requests"].parse::<usize>().unwrap();
    }
    assert_eq!(decided.get(caller), Some(&5), "{calls:#?}");
    assert_eq!(decided.get(owner), None, "{calls:#?}");
    // The owner calls the other only if it stopped first: to hand the bucket over as it left.
    assert_eq!(handed_over.get(caller), None, "{calls:#?}");
    assert!(handed_over.get(owner).is_none_or(|&n| n <= 1), "{calls:#?}");
}

/// A collector that refuses every export leaves a trace of its own: the failures are counted
/// in `/metrics` (batches and the spans they carried) and logged, at most once a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_collector_is_counted_and_logged() {
    let refusing = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|| async { http::StatusCode::SERVICE_UNAVAILABLE }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, refusing).await });
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_full(
        CONFIG,
        &dir.path().join("data"),
        &[
            ("WEIR_OTLP_ENDPOINT", &endpoint),
            // Batches sent every 100 ms, so the first failure comes at once.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
        &[],
    );
    for _ in 0..3 {
        acquire(&server, "api", "tenant-a").await;
    }
    let failures = |metrics: &str, unit: &str| -> u64 {
        let series = format!("weir_trace_export_failures_total{{unit=\"{unit}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let metrics = loop {
        let metrics = reqwest::get(server.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if failures(&metrics, "batches") > 0 || std::time::Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(failures(&metrics, "batches") >= 1, "{metrics}");
    assert!(failures(&metrics, "spans") >= 3, "{metrics}");
    server.signal("TERM");
    let (_, stderr) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(
        stderr.matches("trace spans not exported").count(),
        1,
        "logged once, not per batch: {stderr}"
    );
}
