//! The config file's policies applied live: a Kubernetes-style ConfigMap swap (a `..data`
//! symlink replaced atomically), the data dir's API changes keeping their precedence, a bad
//! file keeping the running config, and SIGHUP.

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Server, counter, publish};

const FIRST: &str = r#"
[[policy]]
name = "x"
on_exhausted = "reject"
token_bucket = { rate = 2, burst = 100 }

[[policy]]
name = "gone"
on_exhausted = "reject"
strict = { qps = 10 }

[[policy]]
name = "pinned"
on_exhausted = "reject"
strict = { qps = 1 }
"#;

const SECOND: &str = r#"
[[policy]]
name = "x"
on_exhausted = "reject"
token_bucket = { rate = 5, burst = 100 }

[[policy]]
name = "new"
on_exhausted = "reject"
strict = { qps = 10 }

[[policy]]
name = "pinned"
on_exhausted = "reject"
strict = { qps = 3 }
"#;

const BROKEN: &str = "[[policy]\nname = \"x\"\n";

async fn get(server: &Server, path: &str) -> (StatusCode, Value) {
    let response = reqwest::get(server.url(path)).await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn acquire(server: &Server, cost: u64) -> StatusCode {
    reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": "x", "key": "k", "cost": cost}))
        .send()
        .await
        .unwrap()
        .status()
}

/// `weir_config_reloads_total{outcome}` as `/metrics` shows it.
async fn reloads(server: &Server, outcome: &str) -> u64 {
    counter(
        server,
        &format!("weir_config_reloads_total{{outcome=\"{outcome}\"}}"),
    )
    .await
}

/// Waits (up to `within`) for `done`; false if it never came.
async fn eventually<F: std::future::Future<Output = bool>>(
    within: Duration,
    mut done: impl FnMut() -> F,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_configmap_swap_is_applied_keeping_state_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("config");
    std::fs::create_dir(&mount).unwrap();
    publish(&mount, "first", &[("weir.toml", FIRST)]);
    let data = dir.path().join("data");
    let config = mount.join("weir.toml");
    let server = Server::start_from_env(
        &[
            ("WEIR_CONFIG", config.to_str().unwrap()),
            ("WEIR_DATA_DIR", data.to_str().unwrap()),
            ("WEIR_HTTP", "127.0.0.1:0"),
            ("WEIR_GRPC", "127.0.0.1:0"),
            ("WEIR_LOG", "warn"),
        ],
        &data,
    );
    // An API change over a file policy: it keeps precedence over later edits of the file.
    let pinned = reqwest::Client::new()
        .put(server.url("/v1/policies/pinned"))
        .json(&json!({"strict": {"qps": 9}}))
        .send()
        .await
        .unwrap();
    assert_eq!(pinned.status(), StatusCode::OK);
    // Key `k` spends its whole burst: 50 more are refused.
    assert_eq!(acquire(&server, 100).await, StatusCode::OK);
    assert_eq!(acquire(&server, 50).await, StatusCode::TOO_MANY_REQUESTS);

    publish(&mount, "second", &[("weir.toml", SECOND)]);
    let swapped = eventually(Duration::from_secs(2), || async {
        get(&server, "/v1/policies/x").await.1["token_bucket"]["rate"] == json!(5.0)
    })
    .await;
    assert!(swapped, "the new rate was not applied within 2 s");
    // Reshaped, not restarted: `k` is still spent (a fresh bucket would start full).
    assert_eq!(acquire(&server, 50).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        get(&server, "/v1/policies/gone").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&server, "/v1/policies/new").await.0, StatusCode::OK);
    assert_eq!(
        get(&server, "/v1/policies/pinned").await.1["strict"]["qps"],
        json!(9.0)
    );
    assert_eq!(reloads(&server, "applied").await, 1);

    publish(&mount, "broken", &[("weir.toml", BROKEN)]);
    let refused = eventually(Duration::from_secs(2), || async {
        reloads(&server, "failed").await == 1
    })
    .await;
    assert!(refused, "the broken file was not reported within 2 s");
    assert_eq!(
        get(&server, "/v1/policies/x").await.1["token_bucket"]["rate"],
        json!(5.0)
    );
    assert_eq!(get(&server, "/v1/policies/new").await.0, StatusCode::OK);
    assert_eq!(get(&server, "/readyz").await.0, StatusCode::OK);
    assert_eq!(reloads(&server, "applied").await, 1);

    // SIGHUP reads the file again though it did not change: the same failure, counted again.
    server.signal("HUP");
    let reread = eventually(Duration::from_secs(2), || async {
        reloads(&server, "failed").await == 2
    })
    .await;
    assert!(reread, "SIGHUP did not reload");
    server.signal("TERM");
    let (status, stderr) = server.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("line 1") && stderr.contains("config not reloaded"),
        "the failure names the file's line: {stderr}"
    );
}

/// A plain file edited in place, and one replaced by a rename as editors save, are both seen;
/// an empty `WEIR_JOIN` names no seed (the node starts, alone and ready).
#[tokio::test]
async fn a_plain_file_edited_in_place_or_renamed_over_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, FIRST).unwrap();
    let data = dir.path().join("data");
    let server = Server::start_from_env(
        &[
            ("WEIR_CONFIG", config.to_str().unwrap()),
            ("WEIR_DATA_DIR", data.to_str().unwrap()),
            ("WEIR_HTTP", "127.0.0.1:0"),
            ("WEIR_GRPC", "127.0.0.1:0"),
            ("WEIR_JOIN", ""),
            ("WEIR_LOG", "warn"),
        ],
        &data,
    );
    assert_eq!(get(&server, "/readyz").await.0, StatusCode::OK);
    std::fs::write(&config, SECOND).unwrap();
    let edited = eventually(Duration::from_secs(2), || async {
        get(&server, "/v1/policies/x").await.1["token_bucket"]["rate"] == json!(5.0)
    })
    .await;
    assert!(edited, "an edit in place was not applied within 2 s");
    let renamed = dir.path().join("weir.toml.new");
    std::fs::write(&renamed, FIRST.replace("rate = 2", "rate = 7")).unwrap();
    std::fs::rename(&renamed, &config).unwrap();
    let replaced = eventually(Duration::from_secs(2), || async {
        get(&server, "/v1/policies/x").await.1["token_bucket"]["rate"] == json!(7.0)
    })
    .await;
    assert!(
        replaced,
        "a file renamed over the config was not applied within 2 s"
    );
    assert_eq!(reloads(&server, "applied").await, 2);
    assert_eq!(reloads(&server, "failed").await, 0);
}

const WITH_LEASES: &str = r#"
[server]
lease_sweep = "1s"

[[policy]]
name = "conc"
on_exhausted = "reject"
concurrency = { node_limit = 5, lease_ttl = "60s" }

[[policy]]
name = "tb"
on_exhausted = "reject"
token_bucket = { rate = 10, burst = 10 }
"#;

async fn lease(server: &Server) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": "conc", "key": "k"}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn renew(server: &Server, lease: &Value) -> StatusCode {
    reqwest::Client::new()
        .post(server.url("/v1/renew"))
        .json(&json!({ "lease": lease }))
        .send()
        .await
        .unwrap()
        .status()
}

/// A file with no `[[policy]]` table — comment-only, or cut short after `[server]` by a write
/// that was not atomic — is refused while policies run, unless it says `policy = []`. A
/// policy the file does remove takes its leases with it: renewing one is 404, and the policy
/// made again under the name counts only what it admits itself.
#[tokio::test]
async fn a_reload_that_would_remove_every_policy_must_say_so_and_leases_end_with_their_policy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The server runs on the file it is given, which is watched: edited below.
    let server = Server::start(WITH_LEASES, &data);
    let config = data.with_extension("toml");
    let mut old = Vec::new();
    for _ in 0..2 {
        let (status, body) = lease(&server).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        old.push(body["lease"].clone());
    }
    let cut = WITH_LEASES.split("[[policy]]").next().unwrap().to_owned();
    for (n, text) in [
        "# every policy was commented out\n# [[policy]]\n".to_owned(),
        cut,
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&config, text).unwrap();
        let refused = eventually(Duration::from_secs(3), || async {
            reloads(&server, "failed").await == n as u64 + 1
        })
        .await;
        assert!(refused, "reload {n} was not counted as failed");
        assert_eq!(get(&server, "/v1/policies/conc").await.0, StatusCode::OK);
        assert_eq!(renew(&server, &old[0]).await, StatusCode::OK);
    }
    // `conc` removed by the file: its leases end with it.
    std::fs::write(
        &config,
        WITH_LEASES.replace("name = \"conc\"", "name = \"other\""),
    )
    .unwrap();
    let removed = eventually(Duration::from_secs(3), || async {
        get(&server, "/v1/policies/conc").await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(removed, "the reload removing `conc` was not applied");
    assert_eq!(renew(&server, &old[1]).await, StatusCode::NOT_FOUND);
    // Back again: five in flight is five new leases, not three beside two old ones.
    std::fs::write(&config, WITH_LEASES).unwrap();
    let back = eventually(Duration::from_secs(3), || async {
        get(&server, "/v1/policies/conc").await.0 == StatusCode::OK
    })
    .await;
    assert!(back);
    for n in 0..5 {
        assert_eq!(lease(&server).await.0, StatusCode::OK, "lease {n}");
    }
    assert_eq!(lease(&server).await.0, StatusCode::TOO_MANY_REQUESTS);
    // Said explicitly, every policy goes.
    std::fs::write(&config, "policy = []\n").unwrap();
    let emptied = eventually(Duration::from_secs(3), || async {
        get(&server, "/v1/policies").await.1["policies"] == json!([])
    })
    .await;
    assert!(emptied, "`policy = []` did not remove every policy");
    assert_eq!(reloads(&server, "failed").await, 2);
}

/// The header `GET /v1/policies/{name}` says where a policy comes from in.
async fn source_of(server: &Server, name: &str) -> Option<String> {
    let response = reqwest::get(server.url(&format!("/v1/policies/{name}")))
        .await
        .unwrap();
    response
        .headers()
        .get("weir-policy-source")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// `weir config ARGS… --server` against `server`: (success, stdout, stderr).
fn weir_config(server: &Server, args: &[&str]) -> (bool, String, String) {
    let output = support::weir()
        .arg("config")
        .args(args)
        .args(["--server", &server.http])
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A file policy changed and another deleted over the API: where each comes from is said, a
/// reload names them as shadowed (the file's edit does not reach them), and a revert brings
/// the file's versions back — the edited one's new version, and the deleted one.
#[tokio::test]
async fn a_file_policy_changed_over_the_api_says_so_and_a_revert_brings_the_files_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(FIRST, &data);
    assert_eq!(source_of(&server, "x").await.as_deref(), Some("file"));
    let put = reqwest::Client::new()
        .put(server.url("/v1/policies/x"))
        .json(&json!({"on_exhausted": "reject", "token_bucket": {"rate": 9, "burst": 100}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let deleted = reqwest::Client::new()
        .delete(server.url("/v1/policies/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    assert_eq!(
        source_of(&server, "x").await.as_deref(),
        Some("api; overrides=file")
    );
    let (_, list) = get(&server, "/v1/policies").await;
    let listed = |name: &str| {
        list["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"]["name"] == name)
            .map(|p| (p["source"].clone(), p["overrides_file"].clone()))
    };
    assert_eq!(listed("x"), Some((json!("api"), json!(true))));
    assert_eq!(listed("pinned"), Some((json!("file"), json!(false))));
    let (ok, _, said) = weir_config(&server, &["get", "x"]);
    assert!(
        ok && said.contains("in place of the config file's"),
        "{said}"
    );
    assert_eq!(
        counter(&server, "weir_config_shadowed_policies").await,
        2,
        "x changed and gone deleted over the API"
    );

    // The file edited: its `x` does not reach the node while the API's stands.
    let config = data.with_extension("toml");
    std::fs::write(&config, FIRST.replace("rate = 2", "rate = 6")).unwrap();
    // Read again, and nothing changes: every policy it changed is one the API shadows.
    let reread = eventually(Duration::from_secs(5), || async {
        reloads(&server, "unchanged").await + reloads(&server, "applied").await >= 1
    })
    .await;
    assert!(reread, "the edit was not read");
    assert_eq!(
        get(&server, "/v1/policies/x").await.1["token_bucket"]["rate"],
        json!(9.0)
    );

    // Reverted: the file's versions, as the file has them now.
    let (ok, out, said) = weir_config(&server, &["revert", "x"]);
    assert!(ok, "{said}");
    assert!(
        said.contains("the config file's version runs now"),
        "{said}"
    );
    let reverted: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reverted["token_bucket"]["rate"], json!(6.0), "{out}");
    assert_eq!(source_of(&server, "x").await.as_deref(), Some("file"));
    assert_eq!(
        get(&server, "/v1/policies/gone").await.0,
        StatusCode::NOT_FOUND
    );
    let (ok, _, said) = weir_config(&server, &["revert", "gone"]);
    assert!(ok, "{said}");
    assert_eq!(source_of(&server, "gone").await.as_deref(), Some("file"));
    assert_eq!(counter(&server, "weir_config_shadowed_policies").await, 0);
    // Nothing left to revert: said so, by name.
    let (ok, _, said) = weir_config(&server, &["revert", "x"]);
    assert!(
        !ok && said.contains("no change made over the API to revert"),
        "{said}"
    );

    server.signal("TERM");
    let (_, log) = server.wait();
    assert!(
        log.contains("replaced or deleted over the API") && log.contains("\"gone\""),
        "{log}"
    );
}
