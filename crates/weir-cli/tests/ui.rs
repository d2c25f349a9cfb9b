//! The live page at `/ui`: its assets as the binary embeds them, and the page itself in
//! headless Chromium (driven by `ui_browser.py` through selenium) against a real `weir serve`
//! under load. The browser run also makes the README's screenshots: into a scratch directory,
//! or, with `WEIR_SCREENSHOTS=docs`, over `docs/ui-*.png` (how they are made for the README).

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Server, eventually};

const TOKEN: &str = "ui-test-token-4f1c9a";

const CONFIG: &str = r#"
[[policy]]
name = "tables"
on_exhausted = "reject"
strict = { qps = 5 }

[[policy]]
name = "edited"
on_exhausted = "reject"
strict = { qps = 10 }

[[policy]]
name = "getpage"
mode = "monitor"
kinds = ["PageRequestHandler"]
on_exhausted = "reject"
token_bucket = { rate = 20 }

[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 4, shared_limit = 8, lease_ttl = "30s" }

[[policy]]
name = "ms-tables"
on_exhausted = "reject"
adaptive = { top_k = 2, ratio = 0.5, floor = 1.0, window = "3s", upgrade_interval = "1s", downgrade_interval = "30s" }
"#;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn assets_dir() -> PathBuf {
    repo().join("crates/weir-server/src/front_door/http/ui")
}

/// The files under `/ui/` and where their sources are.
const ASSETS: [(&str, &str, &str); 6] = [
    ("/ui", "index.html", "text/html; charset=utf-8"),
    ("/ui/app.js", "app.js", "text/javascript; charset=utf-8"),
    ("/ui/style.css", "style.css", "text/css; charset=utf-8"),
    (
        "/ui/uPlot.iife.min.js",
        "vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
    ),
    (
        "/ui/uPlot.min.css",
        "vendor/uplot/uPlot.min.css",
        "text/css; charset=utf-8",
    ),
    (
        "/ui/uPlot.LICENSE",
        "vendor/uplot/LICENSE",
        "text/plain; charset=utf-8",
    ),
];

/// Each asset is served whole, with its type, `Cache-Control` and `ETag` (and a 304 when the
/// browser has it), from bytes inside the binary: the server runs from an empty directory, and
/// the bytes it answers with are found verbatim in the executable. No answer carries the token.
#[tokio::test]
async fn assets_are_the_embedded_bytes_with_types_and_tags() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", TOKEN)],
    );
    let binary = std::fs::read(env!("CARGO_BIN_EXE_weir")).unwrap();
    let client = reqwest::Client::new();
    for (path, source, content_type) in ASSETS {
        let response = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["cache-control"], "no-cache", "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        let etag = headers["etag"].to_str().unwrap().to_owned();
        let body = response.bytes().await.unwrap();
        let on_disk = std::fs::read(assets_dir().join(source)).unwrap();
        assert_eq!(
            body.as_ref(),
            on_disk.as_slice(),
            "{path} is not its source"
        );
        assert!(
            binary.windows(body.len()).any(|w| w == body.as_ref()),
            "{path} is not embedded in the binary"
        );
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains(TOKEN), "{path} carries the token");
        assert!(
            !headers
                .iter()
                .any(|(_, v)| v.to_str().unwrap_or("").contains(TOKEN)),
            "{path}'s headers carry the token"
        );
        let again = client
            .get(server.url(path))
            .header("if-none-match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{path}");
    }
    // The page's scripts come from its own origin only.
    let page = client.get(server.url("/ui")).send().await.unwrap();
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("script-src 'self'"), "{policy}");
    let missing = client.get(server.url("/ui/nope.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

/// `/v1/stats`, the page's counters: per policy, with leases by tier and the ring's shares.
#[tokio::test]
async fn stats_count_decisions_and_leases() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let client = reqwest::Client::new();
    for _ in 0..8 {
        client
            .post(server.url("/v1/acquire"))
            .json(&serde_json::json!({"policy": "tables", "key": "k"}))
            .send()
            .await
            .unwrap();
    }
    let lease = client
        .post(server.url("/v1/acquire"))
        .json(&serde_json::json!({"policy": "search", "key": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(lease.status(), 200);
    let stats: serde_json::Value = client
        .get(server.url("/v1/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let policy = |name: &str| {
        stats["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == name)
            .unwrap()
            .clone()
    };
    let tables = policy("tables");
    assert_eq!(tables["started"], 8);
    assert_eq!(
        tables["admitted"].as_u64().unwrap() + tables["rejected"].as_u64().unwrap(),
        8,
        "{tables}"
    );
    assert!(tables["rejected"].as_u64().unwrap() > 0, "{tables}");
    let search = policy("search");
    assert_eq!(search["in_flight"], 1, "{search}");
    assert_eq!(search["leases_node"], 1, "{search}");
    assert_eq!(search["leases_shared"], 0, "{search}");
    assert_eq!(stats["leases"]["active"], 1);
    assert!(policy("ms-tables")["adaptive"]["last_busy_ms"].is_null());
    assert!(tables.get("adaptive").is_none());
    let busy = client
        .post(server.url("/v1/busy"))
        .json(&serde_json::json!({"policy": "ms-tables"}))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 200);
    let stats: serde_json::Value = client
        .get(server.url("/v1/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let adaptive = stats["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "ms-tables")
        .unwrap()["adaptive"]
        .clone();
    assert_eq!(adaptive["busy_signals"], 1, "{adaptive}");
    assert!(adaptive["last_busy_ms"].as_u64().unwrap() <= stats["at_ms"].as_u64().unwrap());
    assert_eq!(
        stats["ring"]["shares"][stats["node_id"].as_str().unwrap()],
        1.0
    );
}

fn selenium_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import selenium"])
        .output()
        .is_ok_and(|o| o.status.success())
        && ["chromium", "chromedriver"].iter().all(|tool| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if !found {
        assert!(
            std::env::var_os("WEIR_REQUIRE_CHROMIUM").is_none(),
            "chromium, chromedriver and python3's selenium are required here"
        );
        eprintln!("skipping: chromium, chromedriver or python3's selenium is not installed");
    }
    found
}

/// Sends requests until `stop`: `tables/hot` far over its 5 a second (throttled), the monitor
/// policy over its rate (would throttle), two leases held, busy signals to the adaptive one;
/// and the monitor policy's key `bulk` at some two thousand a second, so that its chart's axis
/// reads in the thousands (the widest labels the page's layout check must see fit).
async fn load(server: String, stop: tokio::sync::watch::Receiver<bool>) {
    let client = reqwest::Client::new();
    // Eight clients, each paced at one request every 4 ms.
    let bulk: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            let url = format!("{server}/v1/acquire");
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(Duration::from_millis(4));
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !*stop.borrow() {
                    ticks.tick().await;
                    let _ = client
                        .post(&url)
                        .json(&serde_json::json!({"policy": "getpage", "key": "bulk", "kind": "PageRequestHandler"}))
                        .send()
                        .await;
                }
            })
        })
        .collect();
    let acquire = |body: serde_json::Value| {
        let client = client.clone();
        let url = format!("{server}/v1/acquire");
        async move {
            let _ = client.post(url).json(&body).send().await;
        }
    };
    for key in ["a", "b"] {
        acquire(serde_json::json!({"policy": "search", "key": key})).await;
    }
    let mut round = 0u64;
    while !*stop.borrow() {
        acquire(serde_json::json!({"policy": "tables", "key": "hot"})).await;
        // A key that would show as "invoice…exe.png" if its override were obeyed.
        acquire(serde_json::json!({"policy": "tables", "key": "invoice\u{202e}gnp.exe"})).await;
        if round.is_multiple_of(4) {
            acquire(serde_json::json!({"policy": "tables", "key": "cold"})).await;
            acquire(serde_json::json!({"policy": "getpage", "key": "tenant-1", "kind": "PageRequestHandler"})).await;
            acquire(
                serde_json::json!({"policy": "ms-tables", "key": "t1", "kind": "PREPARE_ROWSET"}),
            )
            .await;
        }
        if round.is_multiple_of(40) {
            let _ = client
                .post(format!("{server}/v1/busy"))
                .json(&serde_json::json!({"policy": "ms-tables"}))
                .send()
                .await;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for client in bulk {
        client.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_browser_under_load() {
    if !selenium_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Debug logging: every line the server writes is searched for the token afterwards.
    let server = Server::start_logging(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", TOKEN)],
        &[],
        "debug",
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loading = tokio::spawn(load(server.http.clone(), stopped));
    // The key is held back before the page opens.
    let throttles = server.url("/v1/throttles");
    eventually(
        Duration::from_secs(30),
        "the load holding a key back",
        || async {
            let rows: serde_json::Value = reqwest::get(&throttles)
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            rows["rows"].as_array().is_some_and(|rows| !rows.is_empty())
        },
    )
    .await;

    // With no admin token: the page must stay read-only there.
    let read_only = Server::start(CONFIG, &dir.path().join("read-only"));
    let shots = match std::env::var_os("WEIR_SCREENSHOTS") {
        Some(dir) => repo().join(dir),
        None => dir.path().join("screenshots"),
    };
    std::fs::create_dir_all(&shots).unwrap();
    let output = run_browser(
        "ui_browser.py",
        &[
            server.http.clone(),
            TOKEN.to_owned(),
            shots.display().to_string(),
            read_only.http.clone(),
        ],
    )
    .await;
    stop.send_replace(true);
    loading.await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for check in [
        "ok throttled key shown",
        "ok bidirectional override shown escaped",
        "ok numbers match /v1/throttles",
        "ok chart has",
        "ok edit without the token refused",
        "ok edit with a wrong token refused",
        "ok edit with the token applied",
        "ok conflicting edit reported",
        "ok token in none of",
        "ok no errors in the console",
        "ok no choice of whose numbers on a single node",
        "ok layout at 1400 px",
        "ok layout at 360 px",
        "ok screenshot ui-wide.png",
        "ok screenshot ui-narrow.png",
        "ok read-only without a server token",
    ] {
        assert!(stdout.contains(check), "missing `{check}`:\n{stdout}");
    }
    for shot in ["ui-wide.png", "ui-narrow.png"] {
        let png = std::fs::read(shots.join(shot)).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{shot}");
    }

    server.signal("TERM");
    let (status, log) = server.wait();
    assert!(status.success(), "{log}");
    assert!(!log.is_empty(), "debug logging wrote nothing to search");
    assert!(!log.contains(TOKEN), "the server logged the token:\n{log}");
}

/// Runs the browser script `script` (beside this file) with `args`, for at most 120 s: SIGTERM
/// then lets the script stop its driver and browser by their ids; SIGKILL if it has not within
/// ten seconds. Its output, once it has exited.
async fn run_browser(script: &str, args: &[String]) -> std::process::Output {
    let browser = Command::new("python3")
        .arg(repo().join("crates/weir-cli/tests").join(script))
        .args(args)
        // Selenium's own driver manager would go looking on the network: the driver is given.
        .env("SE_OFFLINE", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting python3");
    let pid = browser.id().to_string();
    let mut exited = tokio::task::spawn_blocking(move || browser.wait_with_output().unwrap());
    if let Ok(output) = tokio::time::timeout(Duration::from_secs(120), &mut exited).await {
        return output.unwrap();
    }
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    if tokio::time::timeout(Duration::from_secs(10), &mut exited)
        .await
        .is_err()
    {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
    let output = exited.await.unwrap();
    panic!(
        "the browser run took over 120 s:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// In a cluster the page shows the whole cluster's numbers by default: a policy asked only
/// through the other member shows its admissions on this member's page, and "this node"
/// shows this member's own (none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_whole_cluster_by_default() {
    if !selenium_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gossip = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let other_gossip = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let paged = Server::start_full(
        CONFIG,
        &dir.path().join("paged"),
        &[],
        &["--node-id", "paged", "--gossip", &gossip],
    );
    let asked = Server::start_full(
        CONFIG,
        &dir.path().join("asked"),
        &[],
        &[
            "--node-id",
            "asked",
            "--gossip",
            &other_gossip,
            "--join",
            &gossip,
        ],
    );
    for server in [&paged, &asked] {
        eventually(Duration::from_secs(30), "both members ready", || async {
            reqwest::get(server.url("/readyz"))
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
    }
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let url = asked.url("/v1/acquire");
    let loading = tokio::spawn(async move {
        let client = reqwest::Client::new();
        // Paced, twenty a second: twice the policy's rate.
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        while !*stopped.borrow_and_update() {
            ticks.tick().await;
            let _ = client
                .post(&url)
                .json(&serde_json::json!({"policy": "edited", "key": "k"}))
                .send()
                .await;
        }
    });
    let output = run_browser("ui_cluster_browser.py", std::slice::from_ref(&paged.http)).await;
    stop.send_replace(true);
    loading.await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for check in [
        "cluster by default",
        "the other member's admissions",
        "this node alone",
    ] {
        assert!(stdout.contains(&format!("ok {check}")), "{stdout}");
    }
}
