//! Buckets kept in Redis (`scope = "redis"`): real `weir serve` processes sharing real
//! `redis-server` processes (Debian's) — a standalone Redis, and a three-master Redis Cluster
//! created here — through the HTTP API and Envoy's rate limit service; Redis stopped and
//! started again under them.
//!
//! CI installs redis-server and sets `WEIR_REQUIRE_REDIS`, so there a missing server fails the
//! test rather than skipping it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::redis::{Redis, redis_available};
use support::{Server, cluster_member, counter, eventually, free_port, free_udp, is_ready};

/// A port for a Redis Cluster node, which also listens on it + 10 000 (the cluster bus): both
/// free, and below the kernel's ephemeral ports so no connection takes the bus's meanwhile.
fn cluster_port(taken: &[u16]) -> u16 {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let mut port = 10_000 + (std::process::id() % 5_000) as u16 * 2;
    loop {
        port = 10_000 + (port - 10_000 + 7) % 10_000;
        if !taken.contains(&port) && free(port) && free(port + 10_000) {
            return port;
        }
    }
}

/// Ten a day per key, and five a week's window: both in Redis.
fn config(redis: &str, on_unavailable: &str) -> String {
    format!(
        r#"
[redis]
{redis}
on_unavailable = "{on_unavailable}"
timeout = "200ms"

[[policy]]
name = "day"
scope = "redis"
on_exhausted = "reject"
token_bucket = {{ rate = 0.000115740740, burst = 10 }}

[[policy]]
name = "week"
scope = "redis"
on_exhausted = "reject"
fixed_window = {{ limit = 5, window = "7d" }}
"#
    )
}

async fn ask(server: &Server, policy: &str, key: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": policy, "key": key}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Asks `policy` for `key` `times` times, in turn through each of `servers`: how many were
/// admitted, and the tiers that admitted them.
async fn admitted(
    servers: &[&Server],
    policy: &str,
    key: &str,
    times: usize,
) -> (usize, Vec<String>) {
    let mut admitted = 0;
    let mut tiers = Vec::new();
    for i in 0..times {
        let (status, body) = ask(servers[i % servers.len()], policy, key).await;
        match status {
            200 => {
                admitted += 1;
                tiers.push(body["tier"].as_str().unwrap().to_owned());
            }
            429 => {}
            other => panic!("{policy} {key}: unexpected {other}: {body}"),
        }
    }
    tiers.dedup();
    (admitted, tiers)
}

#[tokio::test]
async fn two_nodes_sharing_one_redis_share_every_bucket_and_fail_as_told() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut redis = Redis::start(dir.path(), port, false).await;
    let url = format!("url = {:?}", redis.url());
    let a = Server::start(&config(&url, "open"), &dir.path().join("a"));
    let b = Server::start(&config(&url, "closed"), &dir.path().join("b"));

    // One bucket per key whichever node is asked: 10 of 30, 5 of 15.
    assert_eq!(
        admitted(&[&a, &b], "day", "tenant", 30).await,
        (10, vec!["redis".to_owned()])
    );
    assert_eq!(admitted(&[&a, &b], "week", "tenant", 15).await.0, 5);
    // A refusal says when to come back, from Redis's own clock.
    let (status, body) = ask(&a, "day", "tenant").await;
    assert_eq!(status, 429, "{body}");
    let retry = body["retry_after_ms"].as_u64().unwrap();
    assert!((8_000_000..=8_640_000).contains(&retry), "{body}");

    // Redis gone: `open` admits (tier `fail_open`), `closed` refuses; both answer in time.
    redis.kill();
    assert_eq!(
        admitted(&[&a], "day", "other", 3).await,
        (3, vec!["fail_open".to_owned()])
    );
    let (status, body) = ask(&b, "day", "other").await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("could not decide"),
        "{body}"
    );

    // Back on the same port (empty: it kept nothing): decided in Redis again.
    let _redis = Redis::start(dir.path(), port, false).await;
    eventually(
        Duration::from_secs(20),
        "decisions in Redis again",
        || async { ask(&a, "day", "again").await.1["tier"] == "redis" },
    )
    .await;
    // The three above, and those asked while the connection came back.
    let failed_open = counter(&a, "weir_redis_decisions_total{outcome=\"fail_open\"}").await;
    assert!(failed_open >= 3, "{failed_open}");
    assert_eq!(
        counter(&b, "weir_redis_decisions_total{outcome=\"fail_closed\"}").await,
        1
    );
}

/// Redis there and saying no is not Redis away: a key of another type and `maxmemory` with
/// `noeviction` refuse by name (an exhausted quota is not failed open while Redis refuses the
/// write); Redis gone fails open as told. Each kind is counted, logged once however often it
/// comes, and an unreachable Redis is named in `/readyz`'s warnings.
#[tokio::test]
async fn redis_answers_are_refused_by_name_and_outages_follow_on_unavailable() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut redis = Redis::start(dir.path(), port, false).await;
    let url = format!("url = {:?}", redis.url());
    let weir = Server::start(&config(&url, "open"), &dir.path().join("weir"));
    let errors = |kind: &'static str| {
        let weir = &weir;
        async move { counter(weir, &format!("weir_redis_errors_total{{kind=\"{kind}\"}}")).await }
    };

    // A key of another type where the bucket should be: refused, naming it, every time.
    redis.cli(&["HSET", "weir:day\u{1f}\u{1f}typed", "field", "value"]);
    for _ in 0..5 {
        let (status, body) = ask(&weir, "day", "typed").await;
        assert_eq!(status, 429, "{body}");
        assert!(
            body["reason"].as_str().unwrap().contains("wrong_type"),
            "{body}"
        );
    }
    assert_eq!(errors("wrong_type").await, 5);

    // A damaged bucket (a time far in the future) reads as an empty one: the wait a refusal
    // names is at most what one request takes to refill (a day / 10), and the refusal of a
    // policy that does not wait says it is limited, not that it waited.
    redis.cli(&[
        "SET",
        "weir:day\u{1f}\u{1f}damaged",
        "9223372036854775807000",
    ]);
    let (status, body) = ask(&weir, "day", "damaged").await;
    assert_eq!(status, 429, "{body}");
    let retry = body["retry_after_ms"].as_u64().unwrap();
    assert!(retry <= 8_640_000, "{body}");
    assert!(
        !body["reason"].as_str().unwrap().contains("waiting"),
        "{body}"
    );

    // A day's quota spent, then Redis out of memory (`maxmemory` with `noeviction`).
    assert_eq!(admitted(&[&weir], "day", "spent", 10).await.0, 10);
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    // The spent key is refused (its script writes nothing); an admission would write, and
    // Redis refuses the write: refused by name, where it used to fail open.
    assert_eq!(ask(&weir, "day", "spent").await.0, 429);
    for _ in 0..5 {
        let (status, body) = ask(&weir, "day", "fresh").await;
        assert_eq!(status, 429, "{body}");
        assert!(
            body["reason"].as_str().unwrap().contains("out_of_memory"),
            "{body}"
        );
    }
    assert_eq!(errors("out_of_memory").await, 5);
    assert_eq!(
        counter(&weir, "weir_redis_decisions_total{outcome=\"fail_open\"}").await,
        0
    );
    let ready: Value = reqwest::get(weir.url("/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        ready.get("warnings").is_none(),
        "Redis is reachable: {ready}"
    );

    // Redis gone: an outage, decided by `on_unavailable`, and said in `/readyz`.
    redis.kill();
    assert_eq!(
        admitted(&[&weir], "day", "other", 20).await,
        (20, vec!["fail_open".to_owned()])
    );
    assert!(errors("connection").await + errors("timeout").await >= 20);
    let ready = reqwest::get(weir.url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200, "a fail-open node still serves");
    let ready: Value = ready.json().await.unwrap();
    assert!(
        ready["warnings"][0].as_str().unwrap().contains("Redis"),
        "{ready}"
    );

    weir.signal("TERM");
    let (_, stderr) = weir.wait();
    for kind in ["wrong_type", "out_of_memory"] {
        let lines = stderr
            .lines()
            .filter(|l| l.contains("Redis could not decide") && l.contains(kind))
            .count();
        assert_eq!(lines, 1, "{kind} logged once:\n{stderr}");
    }
}

/// Decisions that arrive together leave together: with one script call out at a time, 310
/// requests asked at once cost Redis at most half as many calls (Redis's own count and the
/// node's `weir_redis_script_calls_total` agree), each of twenty keys is still counted exactly
/// (10 of its 15 admitted), and a key of another type asked in the same calls is refused by
/// name without failing the decisions beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_asked_together_share_script_calls_and_keep_their_own_answers() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let redis = Redis::start(dir.path(), port, false).await;
    let settings = format!("url = {:?}\nbatches_in_flight = 1", redis.url());
    let weir = Server::start(&config(&settings, "open"), &dir.path().join("weir"));
    // The script loaded, and Redis's counts zeroed after it.
    assert_eq!(ask(&weir, "day", "warm").await.0, 200);
    redis.cli(&["HSET", "weir:day\u{1f}\u{1f}typed", "field", "value"]);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let calls_before = counter(&weir, "weir_redis_script_calls_total").await;

    // Twenty keys asked fifteen times each, and the key of another type among them.
    let keys: Vec<String> = (0..310)
        .map(|i| match i % 31 {
            30 => "typed".to_owned(),
            _ => format!("k{}", i % 20),
        })
        .collect();
    let answers =
        futures_util::future::join_all(keys.iter().map(|key| ask(&weir, "day", key))).await;
    let mut admitted = std::collections::BTreeMap::<&str, usize>::new();
    for (key, (status, body)) in keys.iter().zip(&answers) {
        if key == "typed" {
            assert_eq!(status, &429, "{body}");
            assert!(
                body["reason"].as_str().unwrap().contains("wrong_type"),
                "{body}"
            );
            continue;
        }
        match status {
            200 => *admitted.entry(key).or_default() += 1,
            429 => assert!(
                body["reason"].as_str().unwrap().contains("limit"),
                "{key}: {body}"
            ),
            other => panic!("{key}: unexpected {other}: {body}"),
        }
    }
    assert_eq!(admitted.len(), 20, "{admitted:?}");
    assert!(admitted.values().all(|&n| n == 10), "{admitted:?}");

    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls_in_redis: u64 = stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .map(|line| {
            let calls = line.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    let calls = counter(&weir, "weir_redis_script_calls_total").await - calls_before;
    assert_eq!(calls, calls_in_redis, "{stats}");
    assert!(
        calls > 0 && calls * 2 <= keys.len() as u64,
        "{calls} script calls for {} decisions",
        keys.len()
    );
}

const CLUSTER_SECRET: &str = "the members of this cluster share this secret";

/// A cluster member `id` on `config`, in `dir/id`, gossiping on `gossip` (through `join`).
fn member(
    dir: &std::path::Path,
    id: &str,
    config: &str,
    gossip: &str,
    join: Option<&str>,
) -> Server {
    cluster_member(config, &dir.join(id), (id, gossip, join), CLUSTER_SECRET)
}

async fn put_shared(server: &Server) -> (u16, Value) {
    let response = reqwest::Client::new()
        .put(server.url("/v1/policies/shared"))
        .json(&json!({"scope": "redis", "on_exhausted": "reject", "token_bucket": {"rate": 1, "burst": 5}}))
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// A policy whose buckets live in Redis means one bucket for the whole cluster only if every
/// member can reach the Redis: the cluster refuses to commit it while a member has no
/// `[redis]` (naming it), and a member without one that runs it anyway (its config changed
/// after the commit) refuses its requests by name, never deciding them per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_policy_is_committed_only_where_every_member_can_run_it() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), false).await;
    let base = "[[policy]]\nname = \"base\"\ntoken_bucket = { rate = 10, burst = 10 }\n";
    let with = format!("[redis]\nurl = {:?}\n\n{base}", redis.url());
    let seed = free_udp();
    let n1 = member(dir.path(), "n1", &with, &seed, None);
    let n2 = member(dir.path(), "n2", &with, &free_udp(), Some(&seed));
    let n3 = member(dir.path(), "n3", base, &free_udp(), Some(&seed));
    eventually(Duration::from_secs(60), "three members ready", || async {
        is_ready(&n1).await && is_ready(&n2).await && is_ready(&n3).await
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "the PUT refused, naming n3 alone",
        || async {
            let (status, body) = put_shared(&n1).await;
            assert_eq!(status, 400, "{body}");
            let detail = body["detail"].as_str().unwrap().to_owned();
            detail.contains("n3") && !detail.contains("n2")
        },
    )
    .await;

    // n3 given the cluster's `[redis]`: committed.
    n3.signal("TERM");
    assert!(n3.wait().0.success());
    let n3 = member(dir.path(), "n3", &with, &free_udp(), Some(&seed));
    eventually(
        Duration::from_secs(60),
        "committed once every member has a Redis",
        || async { is_ready(&n3).await && put_shared(&n1).await.0 == 201 },
    )
    .await;

    // n3 started again without it: it runs the committed policy, and refuses it by name.
    n3.signal("TERM");
    assert!(n3.wait().0.success());
    let n3 = member(dir.path(), "n3", base, &free_udp(), Some(&seed));
    eventually(Duration::from_secs(60), "n3 ready again", || is_ready(&n3)).await;
    let (status, body) = ask(&n3, "shared", "k").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("no `[redis]`"),
        "{body}"
    );
    let view: Value = reqwest::get(n3.url("/v1/cluster"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["cannot_run"], json!(["shared"]), "{view}");
    let (status, body) = ask(&n1, "shared", "k").await;
    assert_eq!(
        (status, body["tier"].as_str()),
        (200, Some("redis")),
        "{body}"
    );
}

#[tokio::test]
async fn envoy_rules_and_limits_sent_with_requests_kept_in_redis_count_once_for_every_node() {
    if !redis_available() {
        return;
    }
    use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use weir_api::envoy::service::ratelimit::v3::RateLimitRequest;
    use weir_api::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use weir_api::envoy::r#type::v3::RateLimitUnit;

    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), false).await;
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: day, requests_per_unit: 4 }\n",
    )
    .unwrap();
    let config = format!(
        "[redis]\nurl = {:?}\nevery_policy = true\n[rls]\nconfig = {:?}\n",
        redis.url(),
        rules.display().to_string()
    );
    let a = Server::start(&config, &dir.path().join("a"));
    let b = Server::start(&config, &dir.path().join("b"));
    let mut clients = [
        RateLimitServiceClient::connect(a.grpc.clone())
            .await
            .unwrap(),
        RateLimitServiceClient::connect(b.grpc.clone())
            .await
            .unwrap(),
    ];
    // (key, value, a limit sent with it per unit) asked `times`, through each node in turn:
    // (code, remaining) each time.
    let mut ask = async |key: &str, value: &str, sent: Option<(u32, RateLimitUnit)>, times| {
        let mut codes = Vec::new();
        for i in 0..times {
            let answer = clients[i % 2]
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".to_owned(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: key.to_owned(),
                            value: value.to_owned(),
                        }],
                        limit: sent.map(|(requests_per_unit, unit)| RateLimitOverride {
                            requests_per_unit,
                            unit: unit as i32,
                        }),
                        hits_addend: None,
                    }],
                    hits_addend: 0,
                })
                .await
                .unwrap()
                .into_inner();
            codes.push((answer.overall_code, answer.statuses[0].limit_remaining));
        }
        codes
    };
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(
        ask("user", "alice", None, 6).await,
        [(ok, 3), (ok, 2), (ok, 1), (ok, 0), (over, 0), (over, 0)]
    );
    // A limit sent with a rule's descriptor, of the rule's unit, counts in the rule's window
    // (as the reference server's one counter does), past the rule's own limit.
    assert_eq!(
        ask("user", "bob", Some((6, RateLimitUnit::Day)), 8).await,
        [
            (ok, 5),
            (ok, 4),
            (ok, 3),
            (ok, 2),
            (ok, 1),
            (ok, 0),
            (over, 0),
            (over, 0)
        ]
    );
    // One no rule holds counts in the domain's counter of its unit: in Redis too, so the two
    // nodes share it.
    assert_eq!(
        ask("team", "x", Some((3, RateLimitUnit::Hour)), 5).await,
        [(ok, 2), (ok, 1), (ok, 0), (over, 0), (over, 0)]
    );
    assert!(
        !redis.cli(&["KEYS", "*sent:HOUR*"]).trim().is_empty(),
        "the domain's counter is kept in Redis"
    );
}

#[tokio::test]
async fn a_redis_cluster_keeps_every_bucket_and_a_killed_master_fails_open_its_slots() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut masters: Vec<Redis> = Vec::new();
    for _ in 0..3 {
        let taken: Vec<u16> = masters.iter().map(|m| m.port).collect();
        masters.push(Redis::start(dir.path(), cluster_port(&taken), true).await);
    }
    let addresses: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("running redis-cli --cluster create");
    assert!(created.status.success(), "{created:?}");
    for master in &masters {
        eventually(
            Duration::from_secs(10),
            "the cluster's state ok",
            || async {
                master
                    .cli(&["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            },
        )
        .await;
    }
    let nodes: Vec<String> = masters.iter().map(Redis::url).collect();
    let redis = format!("cluster = {nodes:?}");
    let a = Server::start(&config(&redis, "open"), &dir.path().join("a"));
    let b = Server::start(&config(&redis, "open"), &dir.path().join("b"));

    // 30 keys, spread over the three masters' slots: each admits its 10 and no more.
    let keys: Vec<String> = (0..30).map(|k| format!("tenant-{k}")).collect();
    for key in &keys {
        assert_eq!(admitted(&[&a, &b], "day", key, 12).await.0, 10, "{key}");
    }
    // One master killed mid-run: its keys' decisions fail open, the others' stay exact.
    masters[0].kill();
    let mut fail_open = 0;
    for key in &keys {
        let (status, body) = ask(&a, "day", key).await;
        match (status, body["tier"].as_str()) {
            (200, Some("fail_open")) => fail_open += 1,
            (429, _) => {}
            other => panic!("{key}: {other:?} {body}"),
        }
    }
    assert!(
        fail_open > 0 && fail_open < keys.len(),
        "{fail_open} of {} failed open",
        keys.len()
    );
}

/// A sentinel watching the master on `master`, failing it over a second after it stops
/// answering; on `port`, in `dir`.
/// The password the Sentinel-watched master and its replica ask for.
const SENTINEL_PASSWORD: &str = "sentinel-test-pass";

/// How a Sentinel-watched master and replica are deployed in a test: given the test's dir and
/// a port, what each of them is started with, what its sentinel's config says besides the
/// master it monitors, and the node's `[redis]` lines; and what `redis-cli` needs to be let in.
struct SentinelDeployment {
    server: fn(&Path, u16) -> Vec<String>,
    sentinel: fn(&Path, u16) -> String,
    node: fn(&Path, u16) -> String,
    cli: fn(&Path) -> Vec<String>,
}

/// A sentinel on `port` monitoring the master on `master`, as `deployment` has it.
async fn sentinel(dir: &Path, port: u16, master: u16, deployment: &SentinelDeployment) -> Redis {
    let config = dir.join(format!("sentinel-{port}.conf"));
    std::fs::write(
        &config,
        format!(
            "bind 127.0.0.1\n{}\nsentinel monitor weir 127.0.0.1 {master} 1\n\
             sentinel auth-pass weir {SENTINEL_PASSWORD}\n\
             sentinel down-after-milliseconds weir 1000\nsentinel failover-timeout weir 5000\n",
            (deployment.sentinel)(dir, port)
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&config)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting redis-server --sentinel");
    Redis::of(child, port, (deployment.cli)(dir))
        .answering()
        .await
}

/// A master and its replica behind a password, watched by a sentinel, deployed as
/// `deployment` says in `dir`: the node logs in to whichever the sentinel names; the master
/// killed, decisions fail open until the replica is promoted, then are made there with the
/// buckets as the master left them.
async fn a_sentinel_failover(dir: &Path, deployment: SentinelDeployment) {
    let start = |port: u16| async move {
        let args = (deployment.server)(dir, port);
        Redis::start_with(dir, port, &args, (deployment.cli)(dir)).await
    };
    let mut master = start(free_port()).await;
    let replica = start(free_port()).await;
    // Redis waits 5 s before a replica's first (diskless) sync, to batch replicas: not here.
    master.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    replica.cli(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]);
    // `state=online` is not enough: after a diskless sync the master holds the command stream
    // back until the replica's first acknowledgement (up to a second later, more under load),
    // and a failover meanwhile loses every write since the sync. A write seen on the replica
    // says the stream flows.
    master.cli(&["SET", "probe", "1"]);
    eventually(
        Duration::from_secs(30),
        "the replica receiving the stream",
        || async { replica.cli(&["GET", "probe"]).trim() == "1" },
    )
    .await;
    let watcher = sentinel(dir, free_port(), master.port, &deployment).await;
    // A first decision makes its connections (over TLS, two handshakes): more than the
    // 200 ms the other tests allow, under load. A dead master is refused at once meanwhile.
    let node = Server::start(
        &config(&(deployment.node)(dir, watcher.port), "open")
            .replace("timeout = \"200ms\"", "timeout = \"2s\""),
        &dir.join("a"),
    );
    assert_eq!(
        admitted(&[&node], "day", "tenant", 12).await,
        (10, vec!["redis".to_owned()])
    );
    master.kill();
    // Failed open until the sentinel promotes the replica; then decided in Redis again, on
    // the master the sentinel names now.
    eventually(
        Duration::from_secs(30),
        "decisions on the promoted replica",
        || async {
            let (status, body) = ask(&node, "day", "other").await;
            status == 200 && body["tier"] == "redis"
        },
    )
    .await;
    assert!(replica.cli(&["ROLE"]).starts_with("master"));
    // The spent bucket is spent there too: the script's writes were replicated (as their
    // effects) before the master died.
    let (status, body) = ask(&node, "day", "tenant").await;
    assert_eq!(
        status, 429,
        "the promoted replica gave a spent bucket again: {body}"
    );
    let failed_open = counter(&node, "weir_redis_decisions_total{outcome=\"fail_open\"}").await;
    assert!(failed_open >= 1, "{failed_open}");
}

/// The password on every server, the replica's to its master too, as a deployed pair has it.
fn with_password() -> Vec<String> {
    [
        "--requirepass",
        SENTINEL_PASSWORD,
        "--masterauth",
        SENTINEL_PASSWORD,
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test]
async fn a_sentinel_failover_moves_the_decisions_to_the_promoted_replica() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    a_sentinel_failover(
        dir.path(),
        SentinelDeployment {
            server: |_, port| {
                [vec!["--port".to_owned(), port.to_string()], with_password()].concat()
            },
            sentinel: |_, port| format!("port {port}"),
            node: |_, sentinel| {
                format!(
                    "sentinel = {{ master = \"weir\", nodes = [\"redis://127.0.0.1:{sentinel}\"], \
                     password = {SENTINEL_PASSWORD:?} }}"
                )
            },
            cli: |_| {
                ["-a", SENTINEL_PASSWORD, "--no-auth-warning"]
                    .map(str::to_owned)
                    .to_vec()
            },
        },
    )
    .await;
}

/// The same over TLS: the servers, their replication and the sentinel on TLS ports only, each
/// asking for a client certificate; the node reaches the sentinel by `rediss://` and the
/// master it names over TLS, with the files of `[redis.tls]`.
#[tokio::test]
async fn a_sentinel_failover_over_tls_moves_the_decisions_to_the_promoted_replica() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    a_sentinel_failover(
        dir.path(),
        SentinelDeployment {
            server: |dir, port| {
                let replication = ["--tls-replication", "yes"].map(str::to_owned).to_vec();
                [on_tls_only(dir, port), with_password(), replication].concat()
            },
            sentinel: |dir, port| {
                let file = |name: &str| dir.join(name).display().to_string();
                format!(
                    "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes",
                    file("redis.crt"),
                    file("redis.key"),
                    file("ca.crt")
                )
            },
            node: |dir, sentinel| {
                let file = |name: &str| dir.join(name).display().to_string();
                format!(
                    "sentinel = {{ master = \"weir\", nodes = [\"rediss://127.0.0.1:{sentinel}\"], \
                     password = {SENTINEL_PASSWORD:?} }}\n\
                     tls = {{ ca = {:?}, cert = {:?}, key = {:?} }}",
                    file("ca.crt"),
                    file("client.crt"),
                    file("client.key")
                )
            },
            cli: |dir| {
                let mut args = cli_over_tls(dir);
                args.extend(["-a", SENTINEL_PASSWORD].map(str::to_owned));
                args
            },
        },
    )
    .await;
}

/// A CA, Redis's certificate for 127.0.0.1 and a client certificate, both signed by the CA,
/// written in `dir` as `ca.crt`, `redis.crt`/`redis.key` and `client.crt`/`client.key`.
fn certificates(dir: &std::path::Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Names of their own: OpenSSL (Redis's side) takes a certificate named as its issuer for
    // a self-signed one.
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "weir test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    for (name, subject) in [("redis", "127.0.0.1"), ("client", "weir-node")] {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![subject.to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, subject);
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// What a Redis on TLS only is started with, on `port`, with the files `certificates` wrote
/// in `dir`: each client asked for a certificate.
fn on_tls_only(dir: &Path, port: u16) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &file("redis.crt"),
        "--tls-key-file",
        &file("redis.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "yes",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// What `redis-cli` needs to reach a Redis on TLS only: the CA and the client certificate.
fn cli_over_tls(dir: &Path) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    [
        "--tls",
        "--cacert",
        &file("ca.crt"),
        "--cert",
        &file("client.crt"),
        "--key",
        &file("client.key"),
        "--no-auth-warning",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The Redis store as it is deployed: `rediss://` verified by a CA, a client certificate Redis
/// asks for (`tls-auth-clients yes`), an ACL user in the URL and the default user off. The
/// buckets are kept there; a node without the client certificate, or with the wrong password,
/// is refused by Redis and decides as `on_unavailable` says, the wrong password counted as
/// `auth`; a `[redis.tls]` with a plain `redis://` URL, or a file that is not there, is
/// refused by name before anything starts.
#[tokio::test]
async fn a_redis_behind_tls_and_an_acl_user_keeps_the_buckets() {
    if !redis_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let file = |name: &str| dir.path().join(name).display().to_string();
    let port = free_port();
    let mut server = on_tls_only(dir.path(), port);
    server.extend(
        [
            "--user",
            "default",
            "off",
            "--user",
            "weir",
            "on",
            ">s3cret-pass",
            "~weir:*",
            "+@all",
        ]
        .map(str::to_owned),
    );
    let mut cli = cli_over_tls(dir.path());
    cli.extend(["--user", "weir", "--pass", "s3cret-pass"].map(str::to_owned));
    let redis = Redis::start_with(dir.path(), port, &server, cli).await;
    // The first decision makes the TLS connection: more than the 200 ms the others allow.
    let node = |password: &str, client_certificate: bool| {
        let certificate = if client_certificate {
            format!(
                "cert = {:?}\nkey = {:?}",
                file("client.crt"),
                file("client.key")
            )
        } else {
            String::new()
        };
        format!(
            r#"
[redis]
url = "rediss://weir:{password}@127.0.0.1:{port}"
on_unavailable = "closed"
timeout = "5s"

[redis.tls]
ca = {ca:?}
{certificate}

[[policy]]
name = "day"
scope = "redis"
on_exhausted = "reject"
token_bucket = {{ rate = 0.000115740740, burst = 10 }}
"#,
            ca = file("ca.crt")
        )
    };

    let a = Server::start(&node("s3cret-pass", true), &dir.path().join("a"));
    assert_eq!(
        admitted(&[&a], "day", "tenant", 12).await,
        (10, vec!["redis".to_owned()])
    );
    let keys = redis.cli(&["--scan", "--pattern", "weir:*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");

    // Redis asks for a client certificate this node does not have: no connection, refused
    // as `closed` says.
    let b = Server::start(&node("s3cret-pass", false), &dir.path().join("b"));
    let (status, body) = ask(&b, "day", "tenant").await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("could not decide"),
        "{body}"
    );
    // The wrong password: refused, counted as an authentication failure.
    let c = Server::start(&node("wrong-pass", true), &dir.path().join("c"));
    let (status, body) = ask(&c, "day", "tenant").await;
    assert_eq!(status, 429, "{body}");
    assert!(
        counter(&c, "weir_redis_errors_total{kind=\"auth\"}").await >= 1,
        "the wrong password is not counted as `auth`"
    );

    // Refused before anything starts, by name.
    let check = |text: String| {
        let path = dir.path().join("check.toml");
        std::fs::write(&path, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr)
    };
    let plain = check(node("s3cret-pass", true).replace("rediss://", "redis://"));
    assert!(plain.contains("applies to `rediss://` URLs"), "{plain}");
    let missing = check(node("s3cret-pass", true).replace("ca.crt", "nowhere.crt"));
    assert!(
        missing.contains("[redis.tls] `ca`") && missing.contains("nowhere.crt"),
        "{missing}"
    );
}
