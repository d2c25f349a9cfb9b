//! The operator's first hour, from outside: the traps that cost an incident (two nodes on one
//! data dir, a seed that is never reached, a month where a minute was meant) and the papercuts
//! around them (a host name for a listener, every mistake listed at once, counters there from
//! the start, errors that say which flag to use).

mod support;

use std::time::Duration;

use support::{Server, eventually, weir};

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
token_bucket = { rate = 100, burst = 100 }
"#;

async fn get(url: String) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[test]
fn a_second_node_on_a_running_nodes_data_dir_refuses_to_start_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = Server::start(CONFIG, &data);
    let second = weir()
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--node-id",
            "other",
        ])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("is in use by another weir serve (pid ")
            && stderr.contains("node local, http 127.0.0.1:0)")
            && stderr.contains("--data-dir"),
        "{stderr}"
    );
    // Deleting the `lock` file does not free the dir: the lock is on the dir itself.
    std::fs::remove_file(data.join("lock")).unwrap();
    let third = weir()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!third.status.success());
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(
        stderr.contains("is in use by another weir serve"),
        "{stderr}"
    );
    // The first one is untouched, and once it has stopped the dir is free again.
    first.signal("TERM");
    assert!(first.wait().0.success());
    let again = Server::start(CONFIG, &data);
    drop(again);
}

#[tokio::test]
async fn a_node_that_cannot_join_says_what_it_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    // A seed where nothing gossips: the node serves, is not ready, and says why.
    let server = Server::start_logging(
        CONFIG,
        &dir.path().join("data"),
        &[],
        &["--gossip", "127.0.0.1:0", "--join", "127.0.0.1:9"],
        "info",
    );
    let (status, body) = get(server.url("/readyz")).await;
    assert_eq!(status, 503);
    assert!(
        body.contains("joining the cluster") && body.contains("127.0.0.1:9"),
        "{body}"
    );
    assert!(
        body.contains("cluster_secret"),
        "what to check is said: {body}"
    );
    // The log says so within a few seconds of the start: once `/readyz` says six have
    // passed, the line written at five is there.
    eventually(
        Duration::from_secs(20),
        "`/readyz` counting six seconds",
        || async {
            let (_, body) = get(server.url("/readyz")).await;
            let waited: u64 = body
                .split("with the other members after ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|seconds| seconds.parse().ok())
                .unwrap_or(0);
            waited >= 6
        },
    )
    .await;
    server.signal("TERM");
    let (status, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert!(status.success());
    assert!(
        log.contains("not ready: joining the cluster") && log.contains("127.0.0.1:9"),
        "{log}"
    );
}

#[test]
fn listeners_take_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_from_env(
        &[
            ("WEIR_HTTP", "localhost:0"),
            ("WEIR_GRPC", "localhost:0"),
            ("WEIR_DATA_DIR", data.to_str().unwrap()),
        ],
        &data,
    );
    assert!(
        server.http.starts_with("http://127.0.0.1:"),
        "{}",
        server.http
    );
}

fn series<'a>(metrics: &'a str, name: &str) -> Option<&'a str> {
    metrics
        .lines()
        .find(|line| line.starts_with(name))
        .map(|line| line.rsplit(' ').next().unwrap())
}

#[tokio::test]
async fn a_fresh_node_exports_its_counters_at_zero_and_says_what_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let one = Server::start(CONFIG, &dir.path().join("one"));
    let two = Server::start(CONFIG, &dir.path().join("two"));
    let (_, metrics) = get(one.url("/metrics")).await;
    for zero in [
        "weir_config_reloads_total{outcome=\"applied\"}",
        "weir_config_reloads_total{outcome=\"failed\"}",
        "weir_tls_reloads_total{outcome=\"failed\"}",
    ] {
        assert_eq!(series(&metrics, zero), Some("0"), "{zero} in\n{metrics}");
    }
    // A protocol's counters come with its listener: this node was started without `--resp`.
    assert_eq!(
        series(&metrics, "weir_resp_connections_closed_total"),
        None,
        "{metrics}"
    );
    let build = metrics
        .lines()
        .find(|line| line.starts_with("weir_build_info{"))
        .unwrap_or_else(|| panic!("no build info in\n{metrics}"));
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && build.contains("commit=\"")
            && build.ends_with(" 1"),
        "{build}"
    );
    let rss: f64 = series(&metrics, "process_resident_memory_bytes ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(rss > 1_000_000.0, "{rss}");
    let fds: f64 = series(&metrics, "process_open_fds ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(fds >= 3.0, "{fds}");
    assert!(
        series(&metrics, "process_cpu_seconds_total ").is_some(),
        "{metrics}"
    );
    // The policies in force, as a hash: the same on two nodes with the same policies, another
    // once one of them changes.
    let hash = |metrics: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with("weir_config_info{hash=\""))
            .unwrap()
            .to_owned()
    };
    let (_, other) = get(two.url("/metrics")).await;
    assert_eq!(hash(&metrics), hash(&other));
    let changed = reqwest::Client::new()
        .put(two.url("/v1/policies/api"))
        .json(&serde_json::json!({"token_bucket": {"rate": 5, "burst": 5}}))
        .send()
        .await
        .unwrap();
    assert!(changed.status().is_success());
    let (_, other) = get(two.url("/metrics")).await;
    assert_ne!(hash(&metrics), hash(&other));
}

#[test]
fn the_tools_say_which_flag_to_use() {
    // `weir bench` with a bare address: told to give a URL, once.
    let bench = weir()
        .args([
            "bench",
            "--target",
            "http",
            "--server",
            "127.0.0.1:8080",
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    assert!(!bench.status.success());
    let stderr = String::from_utf8_lossy(&bench.stderr);
    assert!(
        stderr.contains("has no scheme") && stderr.contains("--server http://127.0.0.1:8080"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("no scheme").count(), 1, "{stderr}");

    // `weir config` without the token a server asks for: told which flag or variable.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", "an-admin-token-of-some-length")],
    );
    let delete = weir()
        .args(["config", "delete", "api", "--server", &server.http])
        .env_remove("WEIR_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!delete.status.success());
    let stderr = String::from_utf8_lossy(&delete.stderr);
    assert!(stderr.contains("--token or WEIR_ADMIN_TOKEN"), "{stderr}");
}

/// `weir check-config --rls-config RULES` alone: whether it passed, and what it printed.
fn check_rules(rules: &std::path::Path) -> (bool, String) {
    let out = weir()
        .args(["check-config", "--rls-config"])
        .arg(rules)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn check_config_checks_rules_alone_and_lists_every_unknown_field_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limt:\n      unit: second\n      requests_per_unit: 5\n  - key: ip\n    rate_limit:\n      unit: minute\n      requests_per_units: 5\n",
    )
    .unwrap();
    let (passed, text) = check_rules(&rules);
    assert!(!passed);
    assert!(
        text.contains("rules.yaml:4:5")
            && text.contains("`rate_limt` (did you mean `rate_limit`?)"),
        "{text}"
    );
    assert!(
        text.contains("rules.yaml:10:7")
            && text.contains("`requests_per_units` (did you mean `requests_per_unit`?)"),
        "{text}"
    );
    assert!(text.contains("2 problem(s)"), "{text}");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let (passed, text) = check_rules(&rules);
    assert!(passed, "{text}");
    assert!(
        text.contains("1 RLS domain(s), 1 counted rule(s)"),
        "{text}"
    );
}
