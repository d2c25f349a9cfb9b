//! `redis-server` processes (Debian's) for the tests of buckets kept in Redis: started on a
//! port of the test's, asked with `redis-cli`, stopped by their PID when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{available, eventually};

/// A `redis-server` of a test's, stopped (by its PID) when dropped.
pub struct Redis {
    child: Child,
    /// The port it listens on (over TLS, for one started with TLS).
    pub port: u16,
    /// What `redis-cli` needs besides the port to be let in (TLS files, a user).
    cli_args: Vec<String>,
}

/// Whether redis-server runs here; if not, the test is skipped unless CI requires it.
pub fn redis_available() -> bool {
    available("redis-server", &["--version"], "WEIR_REQUIRE_REDIS")
}

impl Redis {
    /// A standalone Redis (or, with `cluster`, a cluster-enabled one) on `port`, in `dir`.
    pub async fn start(dir: &Path, port: u16, cluster: bool) -> Redis {
        let mut args = vec!["--port".to_owned(), port.to_string()];
        if cluster {
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                ]
                .map(str::to_owned),
            );
        }
        Redis::start_with(dir, port, &args, Vec::new()).await
    }

    /// A Redis on `port` in `dir`, started with `args` besides the bind, the dir and no
    /// persistence (they say where it listens); `redis-cli` is given `cli_args` to be let in.
    pub async fn start_with(
        dir: &Path,
        port: u16,
        args: &[String],
        cli_args: Vec<String>,
    ) -> Redis {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server");
        Redis {
            child,
            port,
            cli_args,
        }
        .answering()
        .await
    }

    /// A Redis the test spawned itself (a sentinel), answering on `port`; `redis-cli` is
    /// given `cli_args` to be let in.
    pub fn of(child: Child, port: u16, cli_args: Vec<String>) -> Redis {
        Redis {
            child,
            port,
            cli_args,
        }
    }

    /// Itself, once it answers `PING`.
    pub async fn answering(self) -> Redis {
        eventually(
            Duration::from_secs(10),
            "redis-server answering",
            || async { self.cli(&["PING"]).trim() == "PONG" },
        )
        .await;
        self
    }

    /// `redis-cli -p PORT ARGS`: its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(args)
            .output()
            .expect("running redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops it now (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
