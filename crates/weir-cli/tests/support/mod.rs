//! Starts the real `weir` binary on ephemeral loopback ports for integration tests.

#![allow(dead_code)] // each test binary uses a different part of this

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use weir_bench::nodes::{Listening, listening};

pub mod disk;
pub mod envoy;
pub mod netns;
pub mod redis;

/// A running `weir serve`.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub http: String,
    /// `http://127.0.0.1:PORT` of the gRPC API.
    pub grpc: String,
    /// `127.0.0.1:PORT` of the Redis-protocol listener, if it was asked for (`--resp`).
    pub resp: Option<String>,
    /// `(name, 127.0.0.1:PORT)` of each registered front door's listener that was asked for
    /// (`--NAME ADDR`).
    pub doors: Vec<(String, String)>,
    /// The data dir it runs with.
    pub data_dir: PathBuf,
    /// Its standard error, gathered after it exits.
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// Keeps the `WEIR_*` variables of whoever runs the tests (`WEIR_JOIN`, `WEIR_LOG_FORMAT`, a
/// token…) away from a test's server: it gets only the ones the test gives.
fn without_weir_variables(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WEIR_") {
            command.env_remove(name);
        }
    }
}

/// How often [`eventually`] and [`holds_for`] look again.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Waits for a condition: asks `check` until it says yes, failing the test with `what` once
/// `within` has passed without it.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    let mut looks = looks();
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        looks.tick().await;
    }
}

/// How a test says something did *not* happen: asks `check` for `watched`, failing the test at
/// the first look it says no. `why` says why that long is enough.
pub async fn holds_for<F, Fut>(watched: Duration, why: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    let mut looks = looks();
    while start.elapsed() < watched {
        assert!(
            check().await,
            "stopped holding after {:?}: {why}",
            start.elapsed()
        );
        looks.tick().await;
    }
}

/// The looks of [`eventually`] and [`holds_for`]: one every [`LOOK_EVERY`] from the second on
/// (the first is at once); a slow check delays the next rather than bunching them.
fn looks() -> tokio::time::Interval {
    let mut looks = tokio::time::interval_at(tokio::time::Instant::now() + LOOK_EVERY, LOOK_EVERY);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    looks
}

/// A loopback TCP port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free loopback UDP address, for a cluster member's gossip.
pub fn free_udp() -> String {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// A cluster member `id` on `config` in `data_dir`, gossiping on `gossip` (joining through
/// `join`), proving it knows `secret` as every member of its cluster does.
pub fn cluster_member(
    config: &str,
    data_dir: &Path,
    (id, gossip, join): (&str, &str, Option<&str>),
    secret: &str,
) -> Server {
    let mut args = vec!["--node-id", id, "--gossip", gossip];
    if let Some(seed) = join {
        args.extend(["--join", seed]);
    }
    Server::start_full(config, data_dir, &[("WEIR_CLUSTER_SECRET", secret)], &args)
}

/// Whether `server`'s `/readyz` answers 200.
pub async fn is_ready(server: &Server) -> bool {
    reqwest::get(server.url("/readyz"))
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// Whether the policy `name` runs on `server`.
pub async fn has_policy(server: &Server, name: &str) -> bool {
    reqwest::get(server.url(&format!("/v1/policies/{name}")))
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// The value of the counter `series` (`name_total{labels}`, as written in the exposition) in
/// `server`'s `/metrics`; 0 when it is not there.
pub async fn counter(server: &Server, series: &str) -> u64 {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Writes `files` (name, text) as version `version` of a ConfigMap-style mount in `dir` and
/// swaps them in as the kubelet does: each `name → ..data/name`, and `..data` replaced by a
/// rename.
pub fn publish(dir: &Path, version: &str, files: &[(&str, &str)]) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).unwrap();
    for (name, text) in files {
        std::fs::write(versioned.join(name), text).unwrap();
    }
    let staged = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &staged).unwrap();
    std::fs::rename(&staged, dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

/// Whether `program` runs here (`probe` is an argument that makes it answer and exit); if
/// not, the caller skips its test (or part), unless the variable `required_by` is set — as CI
/// sets it, where a missing tool must fail the test rather than skip it.
pub fn available(program: &str, probe: &[&str], required_by: &str) -> bool {
    let found = Command::new(program)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os(required_by).is_none(),
            "{program} is required here"
        );
        eprintln!("skipping: {program} is not installed");
    }
    found
}

/// The `weir` binary under test.
pub fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

impl Server {
    /// `127.0.0.1:PORT` of the registered front door `name`'s listener, if it listens.
    pub fn door(&self, name: &str) -> Option<&str> {
        self.doors
            .iter()
            .find(|(door, _)| door == name)
            .map(|(_, addr)| addr.as_str())
    }

    /// Starts `weir serve` with `config` (TOML text) and `data_dir`, and waits until it says on
    /// which ports it listens.
    pub fn start(config: &str, data_dir: &Path) -> Server {
        Server::start_with(config, data_dir, &[])
    }

    /// Like [`start`](Self::start), with extra environment variables.
    pub fn start_with(config: &str, data_dir: &Path, env: &[(&str, &str)]) -> Server {
        Server::start_full(config, data_dir, env, &[])
    }

    /// Like [`start`](Self::start), with extra environment variables and arguments.
    pub fn start_full(
        config: &str,
        data_dir: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Server {
        Server::start_logging(config, data_dir, env, args, "warn")
    }

    /// Like [`start_full`](Self::start_full), logging at `log` (a level or filter) rather
    /// than `warn`.
    pub fn start_logging(
        config: &str,
        data_dir: &Path,
        env: &[(&str, &str)],
        args: &[&str],
        log: &str,
    ) -> Server {
        Server::start_listening(config, data_dir, (env, args), log, "127.0.0.1:0")
    }

    /// Like [`start`](Self::start), its gRPC listener on `grpc` (to come back where the
    /// clients it had know to find it).
    pub fn start_on_grpc(config: &str, data_dir: &Path, grpc: &str) -> Server {
        Server::start_listening(config, data_dir, (&[], &[]), "warn", grpc)
    }

    /// Cluster member `id` in `network`'s namespace `i`, listening on that namespace's
    /// address, gossiping on it and joining through `join` (another member's address), proving
    /// it knows `secret`.
    pub fn start_in(
        network: &netns::Network,
        i: usize,
        (config, data_dir): (&str, &Path),
        (id, join): (&str, Option<String>),
        secret: &str,
    ) -> Server {
        let address = network.address(i);
        let gossip = format!("{address}:7946");
        let mut args = vec!["--node-id", id, "--gossip", &gossip];
        let seed = join.map(|seed| format!("{seed}:7946"));
        if let Some(seed) = &seed {
            args.extend(["--join", seed]);
        }
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &network.namespace(i)])
            .arg(env!("CARGO_BIN_EXE_weir"));
        Server::start_command(
            command,
            config,
            data_dir,
            (
                // Off loopback a node refuses to start without an admin token.
                &[
                    ("WEIR_CLUSTER_SECRET", secret),
                    ("WEIR_ADMIN_TOKEN", "the namespaced nodes' admin token"),
                ],
                &args,
            ),
            "warn",
            (&format!("{address}:8080"), &format!("{address}:8081")),
        )
    }

    fn start_listening(
        config: &str,
        data_dir: &Path,
        (env, args): (&[(&str, &str)], &[&str]),
        log: &str,
        grpc: &str,
    ) -> Server {
        Server::start_command(
            weir(),
            config,
            data_dir,
            (env, args),
            log,
            ("127.0.0.1:0", grpc),
        )
    }

    /// Starts `command` (the `weir` binary, perhaps behind a wrapper) as `weir serve` on
    /// `config`, listening on `(http, grpc)`.
    fn start_command(
        mut command: Command,
        config: &str,
        data_dir: &Path,
        (env, args): (&[(&str, &str)], &[&str]),
        log: &str,
        (http, grpc): (&str, &str),
    ) -> Server {
        let config_path = data_dir.with_extension("toml");
        std::fs::write(&config_path, config).expect("writing the test config");
        command
            .args(["serve", "--http", http, "--grpc", grpc, "--log", log])
            .arg("--config")
            .arg(&config_path)
            .arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        without_weir_variables(&mut command);
        for (name, value) in env {
            command.env(name, value);
        }
        Server::spawn(command, data_dir)
    }

    /// Starts `weir serve` with no arguments at all: configured by `env` alone.
    pub fn start_from_env(env: &[(&str, &str)], data_dir: &Path) -> Server {
        let mut command = weir();
        command
            .arg("serve")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        without_weir_variables(&mut command);
        for (name, value) in env {
            command.env(name, value);
        }
        Server::spawn(command, data_dir)
    }

    /// Spawns `command` (a `weir serve`) and waits until it says on which ports it listens.
    fn spawn(mut command: Command, data_dir: &Path) -> Server {
        let mut child = command.spawn().expect("starting weir serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let stderr =
            std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let Some(Listening {
            http,
            grpc,
            resp,
            doors,
        }) = listening(&mut child, Duration::from_secs(30))
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "weir serve did not start: {}",
                stderr.join().unwrap_or_default()
            );
        };
        Server {
            http,
            grpc,
            resp,
            doors,
            child: Some(child),
            data_dir: data_dir.to_owned(),
            stderr: Some(stderr),
        }
    }

    fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    /// Sends a signal (`TERM`, `KILL`) to the server.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the server to exit; returns its status and standard error.
    pub fn wait(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        let status = child.wait().expect("waiting for weir serve");
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (status, stderr)
    }

    /// `url` under the HTTP API.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
