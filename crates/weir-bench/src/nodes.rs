//! Local `weir serve` processes a scenario starts, measures and stops: a lone node, or a
//! cluster on loopback joined by gossip.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a node may take to say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that sets the started nodes' `--log` filter (default `error`), to
/// see what a scenario's nodes did: their logs go to the bench's standard error.
pub const NODE_LOG: &str = "WEIR_BENCH_NODE_LOG";

/// A `weir serve` child process; killed when dropped.
pub struct LocalNode {
    child: Child,
    /// Its HTTP API, `http://127.0.0.1:PORT`.
    pub http: String,
    /// Its gRPC API, `http://127.0.0.1:PORT`.
    pub grpc: String,
    /// How it was started, to start it again.
    binary: PathBuf,
    dir: PathBuf,
    args: Vec<String>,
}

impl LocalNode {
    /// Starts `binary serve` on `config` (TOML text) with its data in `dir`, on ephemeral
    /// loopback ports, plus `args`; returns once it says where it listens.
    pub fn start(binary: &Path, config: &str, dir: &Path, args: &[String]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config_path = dir.join("weir.toml");
        std::fs::write(&config_path, config)
            .with_context(|| format!("writing {}", config_path.display()))?;
        Self::spawn(binary, dir, args)
    }

    /// Stops it gracefully (SIGTERM, as an orchestrator does) and waits until it has exited.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill -TERM {} failed", self.pid());
        self.child
            .wait()
            .context("waiting for weir serve to exit")?;
        Ok(())
    }

    /// Starts it again, as it was started, on its data dir (new HTTP and gRPC ports).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let binary = self.binary.clone();
        self.restart_on(&binary)
    }

    /// Starts it again on its data dir as it was started, but from `binary` (another release:
    /// an upgrade or a rollback).
    pub fn restart_on(&mut self, binary: &Path) -> anyhow::Result<()> {
        let again = Self::spawn(binary, &self.dir, &self.args)?;
        *self = again;
        Ok(())
    }

    fn spawn(binary: &Path, dir: &Path, args: &[String]) -> anyhow::Result<Self> {
        let config_path = dir.join("weir.toml");
        let mut child = Command::new(binary)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .arg("--log")
            .arg(std::env::var(NODE_LOG).unwrap_or_else(|_| "error".to_owned()))
            .arg("--config")
            .arg(&config_path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} serve", binary.display()))?;
        let Some(Listening { http, grpc, .. }) = listening(&mut child, START_TIMEOUT) else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("weir serve did not say where it listens within {START_TIMEOUT:?}");
        };
        Ok(LocalNode {
            child,
            http,
            grpc,
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            args: args.to_vec(),
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time it has used so far (user + system, every thread), from `/proc` (Linux only).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        cpu_time_of(&stat).with_context(|| format!("no CPU times in {path}"))
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a started `weir serve` listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    /// Its HTTP API, `http://ADDR`.
    pub http: String,
    /// Its gRPC API, `http://ADDR`.
    pub grpc: String,
    /// Its Redis-protocol listener, `ADDR`, if it has one.
    pub resp: Option<String>,
    /// Its registered front doors' listeners, `(name, ADDR)` each, in the line's order.
    pub doors: Vec<(String, String)>,
}

/// Waits up to `timeout` for a starting `weir serve` (its standard output piped) to print
/// `listening http=ADDR grpc=ADDR [resp=ADDR] [NAME=ADDR]...`. The rest of its output is read and dropped, so
/// the child never blocks on a full pipe.
pub fn listening(child: &mut Child, timeout: Duration) -> Option<Listening> {
    let stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("listening ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx.recv_timeout(timeout).ok()?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|part| part.strip_prefix(name))
            .map(str::to_owned)
    };
    Some(Listening {
        http: format!("http://{}", field("http=")?),
        grpc: format!("http://{}", field("grpc=")?),
        resp: field("resp="),
        doors: line
            .split_whitespace()
            .skip(1)
            .filter_map(|part| part.split_once('='))
            .filter(|(name, _)| !["http", "grpc", "resp"].contains(name))
            .map(|(name, addr)| (name.to_owned(), addr.to_owned()))
            .collect(),
    })
}

/// `utime + stime` of a `/proc/PID/stat` line. They count in USER_HZ ticks, which Linux fixes
/// at 100 a second for user space whatever the kernel's own tick.
fn cpu_time_of(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces; the fields after its `)` are fixed.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// A `redis-server` child process on a free loopback port, for the Redis baseline; killed when
/// dropped.
pub struct LocalRedis {
    child: Child,
    /// `redis://127.0.0.1:PORT`.
    pub url: String,
}

impl LocalRedis {
    /// Starts one, without persistence; `None` when `redis-server` is not installed.
    pub fn start() -> anyhow::Result<Option<Self>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free port for redis-server")?
            .port();
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error).context("starting redis-server"),
        };
        let mut redis = LocalRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > START_TIMEOUT {
                let _ = redis.child.kill();
                anyhow::bail!("redis-server did not listen on {port} within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(redis))
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a scenario's nodes keep their files; removed when dropped.
pub struct Workdir(PathBuf);

impl Workdir {
    /// A fresh directory under the system's temporary directory.
    pub fn new(scenario: &str) -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let dir =
            std::env::temp_dir().join(format!("weir-{scenario}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Workdir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `count` nodes on `config`, joined by gossip through the first, and waits until each
/// sees all of them.
pub async fn start_cluster(
    binary: &Path,
    config: &str,
    dir: &Path,
    count: usize,
) -> anyhow::Result<Vec<LocalNode>> {
    let mut nodes = Vec::with_capacity(count);
    let mut seed = None;
    for i in 0..count {
        let gossip = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|socket| socket.local_addr())
            .context("finding a free UDP port for gossip")?
            .to_string();
        let mut args = vec![
            "--node-id".to_owned(),
            format!("n{}", i + 1),
            "--gossip".to_owned(),
            gossip.clone(),
        ];
        if let Some(seed) = &seed {
            args.extend(["--join".to_owned(), String::clone(seed)]);
        }
        seed.get_or_insert(gossip);
        let (binary, config, dir) = (
            binary.to_owned(),
            config.to_owned(),
            dir.join(format!("n{}", i + 1)),
        );
        let node =
            tokio::task::spawn_blocking(move || LocalNode::start(&binary, &config, &dir, &args))
                .await??;
        nodes.push(node);
    }
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let mut converged = true;
        for node in &nodes {
            let view = client
                .get(format!("{}/v1/cluster", node.http))
                .send()
                .await
                .context("asking a node for its members")?
                .json::<serde_json::Value>()
                .await
                .context("reading a node's members")?;
            // Those that answer: a voter gossip no longer sees is listed too, as suspect.
            let members = view["members"].as_array().map_or(0, |members| {
                members
                    .iter()
                    .filter(|m| m["state"] == "alive" || m["state"] == "leaving")
                    .count()
            });
            // And every member's handover of what the ring moved there has arrived.
            converged &= members == count && view["ring"]["handed_over"] == true;
        }
        if converged {
            return Ok(nodes);
        }
        if started.elapsed() > START_TIMEOUT {
            anyhow::bail!("{count} nodes did not all see each other within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (weir serve) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(cpu_time_of(stat), Some(Duration::from_millis(3250)));
        assert_eq!(cpu_time_of("4242 (weir"), None);
    }
}
