//! The quick starts, run: each program `docs/quickstart.md` shows is taken from the page as
//! written, run against `weir serve` on the embedded default config (the Redis protocol on, as
//! the page starts it; every address moved to a free port and given to the program in the
//! variable it reads), and must print what the page says it prints — and the server must have
//! decided what the program says it did.
//!
//! - Python with httpx over the HTTP API: a rate policy's refusals waited out, a concurrency
//!   lease taken and given back;
//! - Python with redis-py, and Node.js with ioredis, over the Redis protocol: `CL.THROTTLE`.
//!
//! httpx and redis-py come from PyPI, ioredis from npm (`tests/node`, `npm ci` there); CI
//! installs them and sets `WEIR_REQUIRE_HTTPX` and `WEIR_REQUIRE_REDIS`, so there a missing one
//! fails the test rather than skipping it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Server, counter};

/// The page the quick starts are on, from the repository's root.
const PAGE: &str = "docs/quickstart.md";

/// How long one quick start may run before it is stopped; each takes well under a second.
const BOUND: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn page() -> String {
    std::fs::read_to_string(repo().join(PAGE)).unwrap()
}

/// The fenced blocks of the page's section whose `## ` heading contains `marker`, each as its
/// info string and its text.
fn section_blocks(marker: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut in_section = false;
    let mut open: Option<(String, String)> = None;
    for line in page().lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (Some(_), Some(_)) => {
                let block = open.take();
                if in_section {
                    blocks.extend(block);
                }
            }
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (None, None) => {
                if let Some(heading) = line.strip_prefix("## ") {
                    in_section = heading.contains(marker);
                }
            }
        }
    }
    blocks
}

/// The quick start under the heading that contains `marker`: its program (the first block in
/// `lang`) and what the page says it prints (the first `text` block after it).
fn quick_start(marker: &str, lang: &str) -> (String, String) {
    let blocks = section_blocks(marker);
    let at = blocks
        .iter()
        .position(|(info, _)| info == lang)
        .unwrap_or_else(|| panic!("{PAGE}: no ```{lang} block under a heading with {marker:?}"));
    let printed = blocks[at..]
        .iter()
        .find(|(info, _)| info == "text")
        .unwrap_or_else(|| panic!("{PAGE}: the {marker} quick start does not show what it prints"));
    (blocks[at].1.clone(), printed.1.clone())
}

/// Whether `probe` runs and succeeds here, that is whether `what` is installed. If not, the
/// test is skipped, unless the variable `required_by` is set (as CI sets it): then it fails.
fn installed(what: &str, probe: &mut Command, required_by: &str) -> bool {
    let found = probe.output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os(required_by).is_none(),
            "{what} is required here ({required_by} is set)"
        );
        eprintln!("skipping: {what} is not installed");
    }
    found
}

/// `npm ci`'s packages for the Node.js tests, where `require` finds them (`NODE_PATH`).
fn node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/node_modules")
}

/// `weir serve` as the page starts it — no config file, so the embedded default, and the Redis
/// protocol on — but on free loopback ports, its data in `dir`.
fn serve(dir: &Path) -> Server {
    let data = dir.join("data");
    Server::start_from_env(
        &[
            ("WEIR_HTTP", "127.0.0.1:0"),
            ("WEIR_GRPC", "127.0.0.1:0"),
            ("WEIR_RESP", "127.0.0.1:0"),
            ("WEIR_DATA_DIR", data.to_str().unwrap()),
            ("WEIR_LOG", "warn"),
        ],
        &data,
    )
}

/// Runs `command` (a quick start) with `env` and none of the caller's other `WEIR_*`
/// variables, and returns what it printed, failing the test if it fails or has not finished
/// within [`BOUND`] (it is then killed, by its own process id).
fn run(mut command: Command, env: &[(&str, &str)], what: &str) -> String {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WEIR_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the {what} quick start: {e}"));
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    let output = match finished.recv_timeout(BOUND) {
        Ok(output) => Some(output.expect("waiting for the quick start")),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            None
        }
    };
    let (status, stdout, stderr) = match output {
        Some(output) => (
            Some(output.status),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
        None => (None, String::new(), String::new()),
    };
    let Some(status) = status else {
        panic!("the {what} quick start did not finish within {BOUND:?}:\n{stdout}\n{stderr}");
    };
    assert!(
        status.success(),
        "the {what} quick start failed ({status}):\n{stdout}\n{stderr}"
    );
    stdout
}

/// The `redis://` URL of `server`'s Redis-protocol listener.
fn redis_url(server: &Server) -> String {
    let resp = server.resp.as_deref().expect("WEIR_RESP was given");
    format!("redis://{resp}")
}

/// Writes `program` to a file named `name` in `dir`, and the path.
fn script(dir: &Path, name: &str, program: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, program).unwrap();
    path
}

/// The `--resp` address the page starts the node with.
fn documented_resp() -> String {
    let page = page();
    let (_, after) = page
        .split_once("serve --resp ")
        .unwrap_or_else(|| panic!("{PAGE} no longer starts the node with --resp"));
    after.split_whitespace().next().unwrap().to_owned()
}

/// Each program, run as it stands, falls back on the address the node listens on when started
/// as the page says, and names the variable that moves it.
#[test]
fn the_quick_starts_default_to_the_addresses_the_page_starts_the_node_on() {
    let config: toml::Table = toml::from_str(weir_server::DEFAULT_CONFIG).unwrap();
    let http = config["server"]["http"].as_str().unwrap();
    let http = format!("http://{http}");
    let redis = format!("redis://{}", documented_resp());
    for (marker, lang, variable, address) in [
        ("httpx", "python", "WEIR_URL", &http),
        ("redis-py", "python", "WEIR_REDIS", &redis),
        ("ioredis", "javascript", "WEIR_REDIS", &redis),
    ] {
        let (program, _) = quick_start(marker, lang);
        let fallback = format!("{variable}\", \"{address}\"");
        let fallback_js = format!("{variable} ?? \"{address}\"");
        assert!(
            program.contains(&fallback) || program.contains(&fallback_js),
            "{PAGE}: the {marker} quick start should read {variable}, defaulting to {address}:\n{program}"
        );
    }
}

/// The numbers in `line`, in order.
fn numbers(line: &str) -> Vec<u64> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|piece| !piece.is_empty())
        .map(|piece| piece.parse().unwrap())
        .collect()
}

/// httpx: `tables` (10 a second per table, evenly spaced) admits the first request at once and
/// refuses the next, with the rest of its 100 ms in `retry_after_ms` and `Retry-After: 1`; the
/// program waits them out. Then a `search` lease, taken and given back.
#[tokio::test]
async fn the_httpx_quick_start_waits_out_its_refusals_and_gives_its_lease_back() {
    let dir = tempfile::tempdir().unwrap();
    if !installed(
        "python3 with httpx",
        Command::new("python3").args(["-c", "import httpx"]),
        "WEIR_REQUIRE_HTTPX",
    ) {
        return;
    }
    let (program, documented) = quick_start("httpx", "python");
    let server = serve(dir.path());
    let mut python = Command::new("python3");
    python.arg(script(dir.path(), "quick_start.py", &program));
    let printed = run(python, &[("WEIR_URL", server.http.as_str())], "httpx");
    // The waits differ from run to run, and a program held up for 100 ms between two requests
    // (a busy machine) is refused less often: the refusals are checked one by one, the rest of
    // what it prints line for line.
    let refusal = |line: &&str| line.contains("refused");
    let others = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| !refusal(line))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        others(&printed),
        others(&documented),
        "{PAGE}, httpx: it printed\n{printed}"
    );
    let first = printed.lines().next().unwrap_or_default();
    assert!(
        !refusal(&first),
        "the first request was refused:\n{printed}"
    );
    let documented_refusal = documented
        .lines()
        .find(refusal)
        .expect("the page shows a refusal");
    let shape = |line: &str| line.replace(|c: char| c.is_ascii_digit(), "");
    let refusals: Vec<&str> = printed.lines().filter(refusal).collect();
    assert!(!refusals.is_empty(), "nothing was refused:\n{printed}");
    for &line in &refusals {
        assert_eq!(shape(line), shape(documented_refusal), "{printed}");
        let shown = numbers(line);
        let &[retry_after_ms, retry_after_s] = shown.as_slice() else {
            panic!("a refusal should show its wait in ms and its Retry-After: {line}");
        };
        assert!(retry_after_ms <= 100, "{line}");
        assert_eq!(retry_after_s, 1, "{line}");
    }
    // What the server decided is what the program says it did.
    let decisions = |policy: &str, outcome: &str| {
        format!(
            "weir_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\",decided=\"here\"}}"
        )
    };
    assert_eq!(counter(&server, &decisions("tables", "admitted")).await, 3);
    assert_eq!(
        counter(&server, &decisions("tables", "rejected")).await,
        refusals.len() as u64
    );
    assert_eq!(counter(&server, &decisions("search", "admitted")).await, 1);
    assert_eq!(counter(&server, "weir_leases_released_total").await, 1);
    assert_eq!(counter(&server, "weir_leases_active").await, 0);
}

/// `CL.THROTTLE user 4 10 60` six times at once: five allowed, the sixth limited for one
/// emission interval (6 s), the bucket whole again after five (30 s).
async fn cl_throttle_quick_start(server: &Server, printed: &str, documented: &str, what: &str) {
    assert_eq!(printed, documented, "{PAGE}, {what}");
    for (outcome, decided) in [("admitted", 5), ("limited", 1)] {
        let series = format!("weir_cl_throttle_decisions_total{{outcome=\"{outcome}\"}}");
        assert_eq!(counter(server, &series).await, decided, "{what}: {series}");
    }
}

#[tokio::test]
async fn the_redis_py_quick_start_prints_what_the_page_says() {
    let dir = tempfile::tempdir().unwrap();
    if !installed(
        "python3 with redis-py",
        Command::new("python3").args(["-c", "import redis"]),
        "WEIR_REQUIRE_REDIS",
    ) {
        return;
    }
    let (program, documented) = quick_start("redis-py", "python");
    let server = serve(dir.path());
    let resp = redis_url(&server);
    let mut python = Command::new("python3");
    python.arg(script(dir.path(), "quick_start.py", &program));
    let printed = run(python, &[("WEIR_REDIS", resp.as_str())], "redis-py");
    cl_throttle_quick_start(&server, &printed, &documented, "redis-py").await;
}

#[tokio::test]
async fn the_ioredis_quick_start_prints_what_the_page_says() {
    let dir = tempfile::tempdir().unwrap();
    let modules = node_modules();
    let node_path = modules.to_str().unwrap();
    if !installed(
        &format!(
            "node with ioredis (`npm ci` in {})",
            modules.parent().unwrap().display()
        ),
        Command::new("node")
            .current_dir(dir.path())
            .env("NODE_PATH", node_path)
            .args(["-e", "require('ioredis')"]),
        "WEIR_REQUIRE_REDIS",
    ) {
        return;
    }
    let (program, documented) = quick_start("ioredis", "javascript");
    let server = serve(dir.path());
    let resp = redis_url(&server);
    let mut node = Command::new("node");
    node.current_dir(dir.path())
        .arg(script(dir.path(), "quick_start.js", &program));
    let printed = run(
        node,
        &[("WEIR_REDIS", resp.as_str()), ("NODE_PATH", node_path)],
        "ioredis",
    );
    cl_throttle_quick_start(&server, &printed, &documented, "ioredis").await;
}

/// The Rust quick start on the page is the example the `weir` crate builds, whole; the crate's
/// `tests/axum_quickstart.rs` drives that example's `app()`.
#[test]
fn the_rust_quick_start_is_the_example_the_crate_builds() {
    let (program, printed) = quick_start("axum", "rust");
    let example = std::fs::read_to_string(repo().join("crates/weir/examples/axum_quickstart.rs"))
        .expect("reading the example");
    assert_eq!(program, example, "docs/quickstart.md's Rust block");
    assert_eq!(printed.lines().filter(|line| *line == "200").count(), 5);
    assert_eq!(printed.lines().last(), Some("429"));
}
