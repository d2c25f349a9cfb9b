//! The Redis protocol with real clients nobody here wrote: `redis-cli`, `redis-benchmark`,
//! redis-py, redis-rs, ioredis and node-redis, against a real `weir serve --resp`; and bad input
//! over a raw socket.
//!
//! `redis-cli` and `redis-benchmark` come with Debian's redis-tools, redis-py from PyPI, the
//! Node.js clients from npm (`tests/node`); CI installs them and sets `WEIR_REQUIRE_REDIS`, so
//! there a missing client fails the test rather than skipping it.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use support::Server;

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 2 }

[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1 }

[[policy]]
name = "queued"
on_exhausted = "wait"
max_wait = "2s"
token_bucket = { rate = 10, burst = 1 }
"#;

fn server(dir: &std::path::Path, env: &[(&str, &str)]) -> (Server, String) {
    let server = Server::start_full(CONFIG, dir, env, &["--resp", "127.0.0.1:0"]);
    let resp = server.resp.clone().expect("--resp was given");
    (server, resp)
}

/// Whether `program` runs here; if not, the test is skipped unless CI requires it.
fn available(program: &str, probe: &[&str]) -> bool {
    support::available(program, probe, "WEIR_REQUIRE_REDIS")
}

/// `redis-cli -h … -p … ARGS`, its standard output (redis-cli prints one value a line when
/// its output is not a terminal).
fn cli(resp: &str, args: &[&str]) -> String {
    cli_output(resp, args).0
}

/// `redis-cli -h … -p … ARGS`: its standard output and standard error.
fn cli_output(resp: &str, args: &[&str]) -> (String, String) {
    let (host, port) = resp.rsplit_once(':').unwrap();
    let output = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("running redis-cli");
    assert!(output.status.success(), "{output:?}");
    (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn redis_cli_throttles_through_weir() {
    if !available("redis-cli", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, resp) = server(&dir.path().join("data"), &[]);

    // redis-cell's documented example, on a new key.
    assert_eq!(
        lines(&cli(&resp, &["CL.THROTTLE", "user123", "15", "30", "60"])),
        ["0", "16", "15", "-1", "2"]
    );
    // A burst of 2 at one a minute: two go, the third is limited.
    for expected in [["0", "2", "1", "-1", "30"], ["0", "2", "0", "-1", "60"]] {
        assert_eq!(
            lines(&cli(&resp, &["CL.THROTTLE", "tenant", "1", "1", "30"])),
            expected
        );
    }
    assert_eq!(
        lines(&cli(&resp, &["CL.THROTTLE", "tenant", "1", "1", "30"])),
        ["1", "2", "0", "30", "60"]
    );

    // A concurrency policy: a lease, refused while it is held, released, taken again.
    let taken = cli(&resp, &["WEIR.ACQUIRE", "search", "t1"]);
    let fields = lines(&taken);
    assert_eq!(&fields[..2], ["admitted", "1"], "{taken}");
    let lease = fields[fields.iter().position(|f| *f == "lease").unwrap() + 1].to_owned();
    let refused = cli(&resp, &["WEIR.ACQUIRE", "search", "t1"]);
    assert_eq!(&lines(&refused)[..2], ["admitted", "0"], "{refused}");
    assert!(refused.contains("concurrency limit reached"), "{refused}");
    assert_eq!(cli(&resp, &["WEIR.RELEASE", &lease]).trim(), "OK");
    assert_eq!(
        &lines(&cli(&resp, &["WEIR.ACQUIRE", "search", "t1"]))[..2],
        ["admitted", "1"]
    );

    // RESP3 through HELLO, and Redis's own errors.
    assert_eq!(cli(&resp, &["-3", "PING"]).trim(), "PONG");
    assert_eq!(
        cli(&resp, &["FOO", "bar"]).trim(),
        "ERR unknown command 'foo', with args beginning with: 'bar'"
    );
    assert_eq!(
        cli(&resp, &["CL.THROTTLE", "k", "x", "1", "1"]).trim(),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        cli(&resp, &["CL.THROTTLE", "k", "-1", "1", "1"]).trim(),
        "ERR max_burst must be 0 or more, got -1"
    );
    assert_eq!(
        cli(&resp, &["WEIR.ACQUIRE", "nope", "k"]).trim(),
        "ERR no policy named `nope`"
    );

    // The decisions are counted like any other: the limited key is in "who is throttled",
    // and /metrics has CL.THROTTLE's counts and the policy's.
    let throttles: serde_json::Value =
        serde_json::from_str(&fetch(&server.url("/v1/throttles?policy=CL.THROTTLE"))).unwrap();
    assert_eq!(throttles["rows"][0]["key"], "tenant", "{throttles}");
    let metrics = fetch(&server.url("/metrics"));
    assert!(
        metrics.contains("weir_cl_throttle_decisions_total{outcome=\"limited\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("weir_cl_throttle_decisions_total{outcome=\"admitted\"} 3"));
    // Every command is counted by name, errors apart; a name Weir does not answer as `other`.
    for series in [
        "weir_api_requests_total{api=\"resp\",endpoint=\"CL.THROTTLE\",code=\"ok\"} 4",
        "weir_api_requests_total{api=\"resp\",endpoint=\"CL.THROTTLE\",code=\"error\"} 2",
        "weir_api_requests_total{api=\"resp\",endpoint=\"other\",code=\"error\"} 1",
    ] {
        assert!(metrics.contains(series), "{series}\n{metrics}");
    }
}

/// A GET's body, for a test without a runtime of its own.
fn fetch(url: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() })
}

#[test]
fn a_password_is_asked_for_when_the_server_has_a_data_token() {
    if !available("redis-cli", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = "a-token-of-some-length";
    let admin = "the-admin-token-is-another";
    let (_server, resp) = server(
        &dir.path().join("data"),
        &[("WEIR_DATA_TOKEN", token), ("WEIR_ADMIN_TOKEN", admin)],
    );
    // The admin token is not a password here: services that throttle through Redis never
    // hold the credential that rewrites policies. Nor is a user other than `default`.
    for (user, password) in [("default", admin), ("ops", token)] {
        let (out, err) = cli_output(
            &resp,
            &[
                "--no-auth-warning",
                "--user",
                user,
                "--pass",
                password,
                "PING",
            ],
        );
        assert!(
            err.contains("WRONGPASS") && out.contains("NOAUTH"),
            "{user}/{password} is refused: {out} {err}"
        );
    }
    assert_eq!(
        cli(&resp, &["CL.THROTTLE", "k", "1", "1", "1"]).trim(),
        "NOAUTH Authentication required."
    );
    assert_eq!(
        lines(&cli(
            &resp,
            &[
                "--no-auth-warning",
                "-a",
                token,
                "CL.THROTTLE",
                "k",
                "1",
                "1",
                "1"
            ]
        ))[0],
        "0"
    );
    let (out, err) = cli_output(&resp, &["--no-auth-warning", "-a", "wrong", "PING"]);
    assert!(
        err.contains("WRONGPASS") && out.contains("NOAUTH"),
        "a wrong password is refused: {out} {err}"
    );
    // HELLO with AUTH inside it, as RESP3 clients send it.
    assert_eq!(
        cli(
            &resp,
            &[
                "--no-auth-warning",
                "-3",
                "--user",
                "default",
                "--pass",
                token,
                "PING"
            ]
        )
        .trim(),
        "PONG"
    );
}

/// redis-py: RESP3 by default in its newest versions, RESP2 here too; raw commands, a
/// pipeline, a waiting acquire with other commands pipelined behind it, and AUTH inside HELLO.
#[test]
fn redis_py_speaks_both_protocols() {
    if !available("python3", &["-c", "import redis"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = "a-token-of-some-length";
    let (_server, resp) = server(&dir.path().join("data"), &[("WEIR_DATA_TOKEN", token)]);
    let (host, port) = resp.rsplit_once(':').unwrap();
    let script = r#"
import json, sys, redis
host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {}
for proto in (2, 3):
    r = redis.Redis(host=host, port=port, password=token, protocol=proto, client_name="weir-test")
    out[f"cell{proto}"] = r.execute_command("CL.THROTTLE", f"py{proto}", 15, 30, 60)
    taken = r.execute_command("WEIR.ACQUIRE", "search", f"k{proto}")
    if isinstance(taken, list):
        taken = dict(zip(taken[::2], taken[1::2]))
    out[f"acquire{proto}"] = {k.decode() if isinstance(k, bytes) else k: (v.decode() if isinstance(v, bytes) else v) for k, v in taken.items()}
    r.execute_command("WEIR.RELEASE", out[f"acquire{proto}"]["lease"])
    out[f"name{proto}"] = r.execute_command("CLIENT", "GETNAME").decode()
pipe = redis.Redis(host=host, port=port, password=token, protocol=3).pipeline(transaction=False)
pipe.execute_command("WEIR.ACQUIRE", "queued", "q", "WAIT", "1000")
pipe.execute_command("WEIR.ACQUIRE", "queued", "q", "WAIT", "1000")
for i in range(100):
    pipe.execute_command("CL.THROTTLE", "piped", 1000, 1, 60)
replies = pipe.execute()
out["waited"] = [reply[b"waited_ms"] if b"waited_ms" in reply else reply["waited_ms"] for reply in replies[:2]]
out["piped_remaining"] = [reply[2] for reply in replies[2:]]
print(json.dumps(out))
"#;
    let output = Command::new("python3")
        .args(["-c", script, host, port, token])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for proto in [2, 3] {
        assert_eq!(
            out[format!("cell{proto}")],
            serde_json::json!([0, 16, 15, -1, 2])
        );
        let acquired = &out[format!("acquire{proto}")];
        assert!(
            acquired["admitted"] == 1 || acquired["admitted"] == true,
            "{acquired}"
        );
        assert_eq!(acquired["tier"], "node");
        assert_eq!(out[format!("name{proto}")], "weir-test");
    }
    // The second acquire waited ~100 ms for its token in the line; the 100 commands
    // pipelined behind the waiting ones were answered, in order, after them.
    let waited = out["waited"].as_array().unwrap();
    assert_eq!(waited[0], 0);
    assert!(waited[1].as_u64().unwrap() >= 50, "{out}");
    let remaining: Vec<u64> = out["piped_remaining"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(remaining, (901..=1000).rev().collect::<Vec<u64>>());
}

/// Transactions as redis-py makes them (its default `pipeline()` is `MULTI` … `EXEC`): the
/// queued commands run together at `EXEC`, a discarded or aborted block takes nothing, and
/// Redis's errors for the rest.
#[test]
fn redis_py_transactions_run_together_and_a_discarded_one_takes_nothing() {
    if !available("python3", &["-c", "import redis"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_server, resp) = server(&dir.path().join("data"), &[]);
    let (host, port) = resp.rsplit_once(':').unwrap();
    let script = r#"
import json, sys, redis
host, port = sys.argv[1], int(sys.argv[2])
r = redis.Redis(host=host, port=port)
out = {}
pipe = r.pipeline()  # a transaction
pipe.execute_command("CL.THROTTLE", "tx", 4, 1, 60)
pipe.execute_command("CL.THROTTLE", "tx", 4, 1, 60)
pipe.execute_command("WEIR.ACQUIRE", "queued", "q", "WAIT", "1000")
pipe.execute_command("WEIR.ACQUIRE", "queued", "q", "WAIT", "1000")
replies = pipe.execute()
out["remaining"] = [replies[0][2], replies[1][2]]
out["admitted"] = [dict(zip(reply[::2], reply[1::2]))[b"admitted"] for reply in replies[2:]]
# A discarded block takes nothing.
pipe = r.pipeline()
pipe.execute_command("CL.THROTTLE", "tx", 4, 1, 60)
pipe.reset()
c = r.connection_pool.get_connection("MULTI")
def call(*args):
    c.send_command(*args)
    try:
        return c.read_response()
    except redis.ResponseError as e:
        return "error: " + str(e)
out["multi"] = call("MULTI")
out["queued"] = call("CL.THROTTLE", "tx", 4, 1, 60)
out["nested"] = call("MULTI")
out["discard"] = call("DISCARD")
out["exec_alone"] = call("EXEC")
out["discard_alone"] = call("DISCARD")
# An unknown command aborts the whole block, and what was queued before it is not run.
call("MULTI")
call("CL.THROTTLE", "tx", 4, 1, 60)
out["unknown"] = call("NOSUCH")
out["aborted"] = call("EXEC")
out["after"] = r.execute_command("CL.THROTTLE", "tx", 4, 1, 60)[2]
out["watch"] = call("WATCH", "tx")
print(json.dumps(out, default=lambda b: b.decode()))
"#;
    let output = Command::new("python3")
        .args(["-c", script, host, port])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["remaining"], serde_json::json!([4, 3]), "{out}");
    assert_eq!(out["admitted"], serde_json::json!([1, 1]), "{out}");
    assert_eq!(out["multi"], "OK");
    assert_eq!(out["queued"], "QUEUED");
    assert_eq!(out["nested"], "error: MULTI calls can not be nested");
    assert_eq!(out["discard"], "OK");
    assert_eq!(out["exec_alone"], "error: EXEC without MULTI");
    assert_eq!(out["discard_alone"], "error: DISCARD without MULTI");
    assert!(
        out["unknown"]
            .as_str()
            .unwrap()
            .starts_with("error: unknown command 'nosuch'"),
        "{out}"
    );
    // (redis-py keeps the message of an `EXECABORT` error, not its code.)
    assert!(
        out["aborted"]
            .as_str()
            .unwrap()
            .contains("Transaction discarded because of previous errors"),
        "{out}"
    );
    // Only the two in the executed block were taken: 5 − 2 − this one.
    assert_eq!(out["after"], 2, "{out}");
    assert!(
        out["watch"].as_str().unwrap().contains("not supported"),
        "{out}"
    );
}

/// redis-rs, the Rust client, through its raw-command interface.
#[test]
fn redis_rs_throttles_through_weir() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, resp) = server(&dir.path().join("data"), &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = redis::Client::open(format!("redis://{resp}")).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let verdict: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg("rs")
            .arg(15)
            .arg(30)
            .arg(60)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(verdict, [0, 16, 15, -1, 2]);
        let taken: Vec<redis::Value> = redis::cmd("WEIR.ACQUIRE")
            .arg("api")
            .arg("k")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(taken[1], redis::Value::Int(1), "{taken:?}");
        let pong: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(pong, "PONG");
    });
}

/// redis-benchmark, closed loop, custom commands, with and without pipelining: it stops at
/// the first error reply, so finishing is the check.
#[test]
fn redis_benchmark_runs_without_errors() {
    if !available("redis-benchmark", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_server, resp) = server(&dir.path().join("data"), &[]);
    let (host, port) = resp.rsplit_once(':').unwrap();
    for pipeline in ["1", "16"] {
        for command in [
            &["CL.THROTTLE", "bench", "15", "30", "60"][..],
            &["WEIR.ACQUIRE", "api", "bench"],
        ] {
            let output = Command::new("redis-benchmark")
                .args([
                    "-h", host, "-p", port, "-n", "2000", "-c", "10", "-P", pipeline, "-q",
                ])
                .args(command)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{command:?} -P {pipeline}: {output:?}"
            );
            assert!(text.contains("requests per second"), "{text}");
        }
    }
}

/// Sends `bytes` and reads until the server closes the connection or goes quiet.
fn exchange(resp: &str, bytes: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(resp).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

#[test]
fn bad_input_gets_an_error_that_names_it_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, resp) = server(&dir.path().join("data"), &[]);
    // Errors within a well-formed request leave the connection usable.
    let (replies, closed) = exchange(
        &resp,
        b"*2\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$2\r\n99\r\n$1\r\n0\r\n$1\r\n1\r\n*1\r\n$4\r\nPING\r\n",
    );
    assert_eq!(
        replies,
        "-ERR wrong number of arguments for 'cl.throttle' command\r\n-ERR count must be 1 or more, got 0\r\n+PONG\r\n"
    );
    assert!(!closed);
    // A stream that can no longer be split into requests: the error, then the connection
    // closes.
    for (bytes, error) in [
        (
            &b"*1000000000\r\n"[..],
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$1000000000\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n*1\r\n$4\r\nPING\r\n",
            "-ERR Protocol error: expected '$', got '*'\r\n",
        ),
        (
            b"*1\r\n$4\r\nPINGxx",
            "-ERR Protocol error: a bulk string's data is not followed by CRLF\r\n",
        ),
    ] {
        assert_eq!(
            exchange(&resp, bytes),
            (error.to_owned(), true),
            "{bytes:?}"
        );
    }
    // A gigabyte announced: refused from its header, before anything is buffered for it.
    let mut big = b"*2\r\n$4\r\nECHO\r\n$1073741824\r\n".to_vec();
    big.extend([b'x'; 100]);
    let (replies, closed) = exchange(&resp, &big);
    assert!(
        replies.starts_with("-ERR Protocol error: invalid bulk length"),
        "{replies}"
    );
    assert!(closed);
    // And the server goes on.
    assert_eq!(
        exchange(&resp, b"PING\r\nQUIT\r\n"),
        ("+PONG\r\n+OK\r\n".to_owned(), true)
    );
}

/// Sockets that connect and say nothing, or start a command and never finish it, cannot lock
/// the port: at `max_connections` the connection silent longest makes room for a newcomer, and
/// a command begun is given `header_timeout` to arrive whole. Through such an attack on every
/// slot, `redis-cli PING` is answered within a second each time it is tried.
#[test]
fn silent_and_half_sent_connections_do_not_lock_the_port() {
    if !available("redis-cli", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[server]\nmax_connections = 20\nheader_timeout = \"2s\"\n{CONFIG}");
    let server = Server::start_full(
        &config,
        &dir.path().join("data"),
        &[],
        &["--resp", "127.0.0.1:0"],
    );
    let resp = server.resp.clone().unwrap();
    let mut attackers = Vec::new();
    for n in 0..20 {
        let mut socket = TcpStream::connect(&resp).unwrap();
        if n % 2 == 1 {
            socket.write_all(b"*2\r\n$4\r\nPI").unwrap();
        }
        attackers.push(socket);
    }
    // A trickler: a byte every 200 ms of a request that never ends.
    let mut trickler = TcpStream::connect(&resp).unwrap();
    trickler
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let trickling = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let head = b"*2\r\n$4\r\nPING\r\n$100000\r\n".iter();
        for byte in head.chain(std::iter::repeat(&b'a')) {
            if trickler.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            if started.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        // Closed by the server: reading finds the end (or a reset), not the timeout.
        let mut rest = Vec::new();
        let read = trickler.read_to_end(&mut rest);
        (started.elapsed(), read.map_err(|e| e.kind()))
    });
    std::thread::sleep(Duration::from_millis(1200));
    let (host, port) = resp.rsplit_once(':').unwrap();
    for probe in 0..8 {
        let started = std::time::Instant::now();
        let output = Command::new("timeout")
            .args(["5", "redis-cli", "-h", host, "-p", port, "PING"])
            .output()
            .unwrap();
        let took = started.elapsed();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "PONG",
            "probe {probe}: {output:?}"
        );
        assert!(took < Duration::from_secs(1), "probe {probe} took {took:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (took, read) = trickling.join().unwrap();
    assert!(
        took < Duration::from_secs(6) && !matches!(read, Err(std::io::ErrorKind::WouldBlock)),
        "the trickler was kept {took:?} ({read:?})"
    );
    let metrics = fetch(&server.url("/metrics"));
    let closed = |reason: &str| -> u64 {
        let series = format!("weir_resp_connections_closed_total{{reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    assert!(closed("evicted") >= 1, "{metrics}");
    assert!(closed("command_timeout") >= 1, "{metrics}");
    drop(attackers);
}

/// ioredis and node-redis, the Node.js clients, each with its own connect sequence: raw
/// commands, a pipeline, a transaction (`multi`, which both make with `MULTI` … `EXEC`), and a
/// discarded one taking nothing. Their packages are in `tests/node` (`npm ci` there).
#[test]
fn node_clients_throttle_pipeline_and_run_transactions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    let installed = Command::new("node")
        .current_dir(&dir)
        .args(["-e", "require('ioredis'); require('redis')"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        assert!(
            std::env::var_os("WEIR_REQUIRE_REDIS").is_none(),
            "node with ioredis and redis (`npm ci` in {}) is required here",
            dir.display()
        );
        eprintln!("skipping: node or its Redis clients are not installed");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (_server, resp) = server(&data.path().join("data"), &[]);
    let (host, port) = resp.rsplit_once(':').unwrap();
    let output = Command::new("node")
        .current_dir(&dir)
        .args(["clients.js", host, port])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for client in ["ioredis", "node_redis"] {
        let out = &out[client];
        assert_eq!(
            out["throttle"],
            serde_json::json!([0, 5, 4, -1, 60]),
            "{client}"
        );
        assert_eq!(out["pipeline"], serde_json::json!([4, 3]), "{client}");
        assert_eq!(out["multi"], serde_json::json!([4, 3]), "{client}");
        let acquired = out["acquired"].as_array().unwrap();
        assert_eq!(
            acquired[..2],
            [serde_json::json!("admitted"), serde_json::json!(1)]
        );
    }
    // The discarded block took nothing: 5 − 2 − this one.
    assert_eq!(out["ioredis"]["after"], 2);
}
