//! The alerting rules of `docs/prometheus/weir-rules.yaml` fired by a real Prometheus against
//! a live cluster, not only by promtool's unit tests on made-up series: three nodes, two of
//! them killed, a change refused — and the alerts an on-call engineer needs then are firing;
//! a node whose Redis is full, with its errors by kind; and a node whose disk is full, its kept
//! buckets not written.
//!
//! The rules are loaded as they are but for their `for:`, set to 0 s (how long a condition must
//! last is what the unit tests hold; here, that the expressions select what a node exports and
//! fire on it). Prometheus (Debian's `prometheus`, beside promtool) scrapes each second and
//! evaluates each second. It is skipped, saying so, where it is missing, unless
//! `WEIR_REQUIRE_PROMTOOL` is set, as CI sets it.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, eventually, free_port, free_udp};

const SECRET: &str = "the alerting test's cluster secret";

/// A Prometheus server, stopped (by its PID) when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port, scraping `targets` as job `weir` and
    /// evaluating `rules` each second.
    fn start(dir: &Path, targets: &[&str], rules: &Path) -> Prometheus {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: {}\n",
                rules.display(),
                serde_json::to_string(targets).unwrap()
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// How many series `query` selects now.
    async fn series(&self, query: &str) -> usize {
        let Ok(response) = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query)])
            .send()
            .await
        else {
            return 0;
        };
        let body: Value = response.json().await.unwrap_or(Value::Null);
        body["data"]["result"].as_array().map_or(0, Vec::len)
    }

    /// The alerts firing now, as `(alertname, instance)`.
    async fn firing(&self) -> BTreeSet<(String, String)> {
        self.firing_kinds()
            .await
            .into_iter()
            .map(|(alert, _)| alert)
            .collect()
    }

    /// The alerts firing now, as `((alertname, instance), kind)` (`kind` empty when the alert
    /// has none).
    async fn firing_kinds(&self) -> BTreeSet<((String, String), String)> {
        let Ok(response) = reqwest::get(format!("{}/api/v1/alerts", self.url)).await else {
            return BTreeSet::new();
        };
        let body: Value = response.json().await.unwrap_or(Value::Null);
        body["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alert| alert["state"] == "firing")
            .map(|alert| {
                let label = |name: &str| alert["labels"][name].as_str().unwrap_or("").to_owned();
                ((label("alertname"), label("instance")), label("kind"))
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rules file with every `for:` set to 0 s.
fn rules_firing_at_once(dir: &Path) -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(repo.join("docs/prometheus/weir-rules.yaml")).unwrap();
    let at_once: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 0s", &line[..line.len() - line.trim_start().len()]),
            None => line.to_owned(),
        })
        .collect();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, at_once.join("\n")).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_alerts_fire_against_a_live_cluster_that_lost_its_majority() {
    if !support::available("prometheus", &["--version"], "WEIR_REQUIRE_PROMTOOL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = "[server]\nforget_after = \"2s\"\n";
    let seed = free_udp();
    let member = |id: &str, gossip: &str, join: Option<&str>| {
        support::cluster_member(config, &dir.path().join(id), (id, gossip, join), SECRET)
    };
    let n1 = member("n1", &seed, None);
    let n2 = member("n2", &free_udp(), Some(&seed));
    let n3 = member("n3", &free_udp(), Some(&seed));
    let nodes = [&n1, &n2, &n3];
    eventually(
        Duration::from_secs(60),
        "three voters and a leader",
        || async {
            for node in nodes {
                let view = cluster_view(node).await;
                let log = &view["policy_log"];
                if log["voters"] != 3 || log["leader"].is_null() {
                    return false;
                }
            }
            true
        },
    )
    .await;

    let targets: Vec<&str> = nodes
        .iter()
        .map(|node| node.http.trim_start_matches("http://"))
        .collect();
    let prometheus = Prometheus::start(dir.path(), &targets, &rules_firing_at_once(dir.path()));
    let n1_target = targets[0].to_owned();
    // A counter's increase is seen only from a sample before it: every node scraped, and
    // nothing firing yet.
    eventually(
        Duration::from_secs(60),
        "Prometheus scraping every node",
        || async {
            prometheus.series("weir_policy_log_quorum").await == 3
                && prometheus.firing().await.is_empty()
        },
    )
    .await;

    // Two of three voters lost for good.
    n2.signal("KILL");
    n3.signal("KILL");
    let _ = (n2.wait(), n3.wait());
    eventually(
        Duration::from_secs(60),
        "a change through n1 refused",
        || async {
            let response = reqwest::Client::new()
                .put(n1.url("/v1/policies/after"))
                .json(&json!({"on_exhausted": "reject", "token_bucket": {"rate": 5, "burst": 5}}))
                .send()
                .await
                .unwrap();
            response.status() == 503
        },
    )
    .await;

    let expected: BTreeSet<(String, String)> = [
        "WeirPolicyLogNoQuorum",
        "WeirPolicyLogVoterGone",
        "WeirClusterMemberUnseen",
        "WeirPolicyChangesRefused",
        "WeirClusterMemberMissing",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), n1_target.clone()))
    .collect();
    eventually(
        Duration::from_secs(60),
        "the alerts firing for n1",
        || async { prometheus.firing().await.is_superset(&expected) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answering_with_errors_fires_its_alert_by_kind() {
    if !support::available("prometheus", &["--version"], "WEIR_REQUIRE_PROMTOOL")
        || !support::available("redis-server", &["--version"], "WEIR_REQUIRE_REDIS")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A Redis out of memory that evicts nothing: every decision's script is refused, `OOM`.
    let port = free_port();
    let redis = Stopped(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--maxmemory", "1", "--maxmemory-policy", "noeviction"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server"),
    );
    let config = format!(
        "[redis]\nurl = \"redis://127.0.0.1:{port}\"\n[[policy]]\nname = \"r\"\nscope = \"redis\"\non_exhausted = \"reject\"\ntoken_bucket = {{ rate = 10, burst = 10 }}\n"
    );
    let node = Server::start(&config, &dir.path().join("data"));
    let target = node.http.trim_start_matches("http://").to_owned();
    let prometheus = Prometheus::start(dir.path(), &[&target], &rules_firing_at_once(dir.path()));
    eventually(
        Duration::from_secs(60),
        "Prometheus scraping the node",
        || async { prometheus.series("weir_redis_errors_total").await > 0 },
    )
    .await;
    let refused = async || {
        reqwest::Client::new()
            .post(node.url("/v1/acquire"))
            .json(&json!({"policy": "r", "key": "k"}))
            .send()
            .await
            .is_ok_and(|r| !r.status().is_success())
    };
    let expected = ("WeirRedisErrors".to_owned(), target.clone());
    eventually(
        Duration::from_secs(60),
        "WeirRedisErrors firing",
        || async {
            assert!(
                refused().await,
                "a decision Redis answered with an error is refused"
            );
            prometheus
                .firing_kinds()
                .await
                .contains(&(expected.clone(), "out_of_memory".to_owned()))
        },
    )
    .await;
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_buckets_not_written_on_a_full_disk_fire_their_alert() {
    if !support::available("prometheus", &["--version"], "WEIR_REQUIRE_PROMTOOL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("disk");
    let Some(tmpfs) = support::disk::small_disk(&small) else {
        return;
    };
    let node = Server::start(support::disk::KEPT_DAY, &small.join("data"));
    let target = node.http.trim_start_matches("http://").to_owned();
    let prometheus = Prometheus::start(dir.path(), &[&target], &rules_firing_at_once(dir.path()));
    eventually(
        Duration::from_secs(60),
        "Prometheus scraping the node",
        || async { prometheus.series("weir_kept_bucket_writes_total").await > 0 },
    )
    .await;
    support::disk::fill(&small);
    let expected = ("WeirKeptBucketWritesFailing".to_owned(), target.clone());
    let mut key = 0;
    eventually(
        Duration::from_secs(60),
        "WeirKeptBucketWritesFailing firing",
        || {
            // A bucket spent since the last walk, for each walk to have one to write.
            key += 1;
            let (node, prometheus, expected) = (&node, &prometheus, &expected);
            async move {
                let spent = reqwest::Client::new()
                    .post(node.url("/v1/acquire"))
                    .json(&json!({"policy": "day", "key": format!("k{key}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(spent.status(), 200, "it still decides on a full disk");
                prometheus.firing().await.contains(expected)
            }
        },
    )
    .await;
    drop(prometheus);
    drop(node);
    drop(tmpfs);
}

/// A child process killed (by its PID) when dropped.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn cluster_view(server: &Server) -> Value {
    match reqwest::get(server.url("/v1/cluster")).await {
        Ok(response) => response.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}
