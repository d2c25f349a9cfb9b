//! TLS as clients nobody here wrote see it — `curl`, `redis-cli`, grpcio — with certificates
//! the tests make: served on every listener, mutual TLS refusing a client without a
//! certificate, a rotated certificate served after the files are swapped, a bad file refused at
//! start (naming it) and at reload (keeping the one in use), and two nodes calling each other
//! over mutual TLS.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use support::{Server, available};

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }

[[policy]]
name = "shared"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 0.01, burst = 5 }
"#;

/// A CA the tests make, and what it signs.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Authority { cert, key }
    }

    /// A certificate for `127.0.0.1` and `localhost`, good for serving and as a client's, as
    /// (certificate PEM, key PEM).
    fn issue(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes the CA's certificate to `dir/file`.
    fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }
}

/// Writes a certificate and key as `dir/{name}.crt` and `dir/{name}.key`.
fn write_pair(dir: &Path, name: &str, (cert, key): &(String, String)) -> (PathBuf, PathBuf) {
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (cert_path, key_path)
}

/// Replaces `path` with `text` at once, as a rename over it (how deploy tools swap files).
fn swap(path: &Path, text: &str) {
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).unwrap();
    std::fs::rename(&fresh, path).unwrap();
}

/// The config with `[server.tls]` naming the files.
fn config(cert: &Path, key: &Path, client_ca: Option<&Path>, peer_name: bool) -> String {
    let mut tls = format!(
        "[server.tls]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    if let Some(ca) = client_ca {
        tls.push_str(&format!("client_ca = {:?}\n", ca.display().to_string()));
    }
    if peer_name {
        tls.push_str("peer_name = \"localhost\"\n");
    }
    // A short header timeout, for the test of a client silent after its handshake.
    format!("[server]\nheader_timeout = \"2s\"\n\n{tls}{CONFIG}")
}

fn https(server: &Server, path: &str) -> String {
    server.url(path).replacen("http://", "https://", 1)
}

/// `curl ARGS URL`: its exit code and what it printed (the status code).
fn curl(args: &[&str], url: &str) -> (i32, String) {
    curl_writing(args, "%{http_code}", url)
}

/// `curl ARGS URL`: its exit code and what it printed (`-w write_out`).
fn curl_writing(args: &[&str], write_out: &str, url: &str) -> (i32, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-o", "/dev/null", "-w", write_out])
        .args(args)
        .arg(url)
        .output()
        .expect("running curl");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// The CA whose certificate the test's server serves now: the second once it is written.
fn second_or_first_ca(dir: &tempfile::TempDir) -> PathBuf {
    let second = dir.path().join("second-ca.crt");
    match second.exists() {
        true => second,
        false => dir.path().join("first-ca.crt"),
    }
}

fn path_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Asks grpcio's health client over TLS; `client` is the certificate and key to present.
fn grpcio_health(grpc: &str, ca: &Path, client: Option<(&Path, &Path)>) -> String {
    let script = r#"
import sys, grpc
from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as rpc
read = lambda p: open(p, "rb").read()
ca, cert, key = sys.argv[2], sys.argv[3], sys.argv[4]
creds = grpc.ssl_channel_credentials(root_certificates=read(ca),
    private_key=read(key) if key else None, certificate_chain=read(cert) if cert else None)
channel = grpc.secure_channel(sys.argv[1], creds, options=[("grpc.ssl_target_name_override", "localhost")])
try:
    status = rpc.HealthStub(channel).Check(pb.HealthCheckRequest(service=""), timeout=5).status
    print(pb.HealthCheckResponse.ServingStatus.Name(status))
except grpc.RpcError as e:
    print("refused", e.code())
"#;
    let (cert, key) = client.map_or(("", ""), |(c, k)| (path_arg(c), path_arg(k)));
    let output = Command::new("python3")
        .args(["-c", script, grpc.trim_start_matches("http://")])
        .args([path_arg(ca), cert, key])
        .output()
        .expect("running python3");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
        + &String::from_utf8_lossy(&output.stderr)
}

fn grpcio_available() -> bool {
    available(
        "python3",
        &["-c", "import grpc, grpc_health.v1.health_pb2"],
        "WEIR_REQUIRE_GRPCIO",
    )
}

/// `redis-cli --tls … PING`: what it printed.
fn redis_ping(resp: &str, ca: &Path, client: Option<(&Path, &Path)>) -> String {
    let (host, port) = resp.rsplit_once(':').unwrap();
    let mut command = Command::new("redis-cli");
    command.args(["--tls", "--cacert", path_arg(ca), "-h", host, "-p", port]);
    if let Some((cert, key)) = client {
        command.args(["--cert", path_arg(cert), "--key", path_arg(key)]);
    }
    let output = command.arg("PING").output().expect("running redis-cli");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
        + &String::from_utf8_lossy(&output.stderr)
}

/// Polls (bounded) until `check` holds.
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn curl_reads_over_tls_and_a_rotated_certificate_is_served_after_the_swap() {
    if !available("curl", &["--version"], "WEIR_REQUIRE_CURL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = Authority::new("first CA");
    let first_ca = first.write(dir.path(), "first-ca.crt");
    let (cert, key) = write_pair(dir.path(), "node", &first.issue("node"));
    let server = Server::start_full(
        &config(&cert, &key, None, false),
        &dir.path().join("data"),
        &[],
        &["--resp", "127.0.0.1:0"],
    );
    let health = https(&server, "/healthz");

    let (code, out) = curl(&["--cacert", path_arg(&first_ca)], &health);
    assert_eq!((code, out.as_str()), (0, "200"), "curl --cacert over TLS");
    // HTTP/2, as ALPN chose it, and HTTP/1.1 when asked for.
    for (asked, spoken) in [("--http2", "200 2"), ("--http1.1", "200 1.1")] {
        let args = [asked, "--cacert", path_arg(&first_ca)];
        let (code, out) = curl_writing(&args, "%{http_code} %{http_version}", &health);
        assert_eq!((code, out.as_str()), (0, spoken));
    }
    // A client that does not trust the CA is refused by curl itself: TLS is really in use.
    let (code, _) = curl(&[], &health);
    assert_ne!(code, 0, "curl trusted a certificate no system CA signed");
    // Plain HTTP to the TLS port: a plain 400 that says TLS is required, not a raw alert.
    let plain = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-w", " %{http_code}"])
        .arg(server.url("/healthz"))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&plain.stdout);
    assert!(
        answer.ends_with(" 400") && answer.contains("tls_required") && answer.contains("https://"),
        "{plain:?}"
    );
    if available("redis-cli", &["--version"], "WEIR_REQUIRE_REDIS") {
        let resp = server.resp.as_deref().unwrap();
        assert_eq!(redis_ping(resp, &first_ca, None), "PONG");
    }
    if grpcio_available() {
        assert_eq!(grpcio_health(&server.grpc, &first_ca, None), "SERVING");
    }

    // A half-written certificate (here: not PEM at all) keeps the one in use.
    swap(&cert, "not a certificate\n");
    server.signal("HUP");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        let (code, out) = curl(&["--cacert", path_arg(&first_ca)], &health);
        assert_eq!(
            (code, out.as_str()),
            (0, "200"),
            "the old certificate is still served"
        );
    }

    let tls_reloads = |outcome: &str| -> u64 {
        let metrics = Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert"])
            .arg(second_or_first_ca(&dir))
            .arg(https(&server, "/metrics"))
            .output()
            .unwrap();
        let series = format!("weir_tls_reloads_total{{outcome=\"{outcome}\"}} ");
        String::from_utf8_lossy(&metrics.stdout)
            .lines()
            .find_map(|line| {
                line.strip_prefix(&series)
                    .map(|n| n.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {series} in {metrics:?}"))
    };
    assert!(tls_reloads("failed") >= 1, "the refused reload is counted");

    // Rotated to a certificate of another CA: served without a restart.
    let second = Authority::new("second CA");
    let second_ca = second.write(dir.path(), "second-ca.crt");
    let (cert_pem, key_pem) = second.issue("node, rotated");
    swap(&key, &key_pem);
    swap(&cert, &cert_pem);
    eventually(
        "the rotated certificate served",
        Duration::from_secs(5),
        || curl(&["--cacert", path_arg(&second_ca)], &health).0 == 0,
    );
    let (code, _) = curl(&["--cacert", path_arg(&first_ca)], &health);
    assert_ne!(
        code, 0,
        "the old certificate is still served after the swap"
    );
    assert!(tls_reloads("applied") >= 1, "the rotation is counted");

    server.signal("TERM");
    let (status, stderr) = server.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("TLS certificates not reloaded") && stderr.contains("node.crt"),
        "the refused reload is logged with its file: {stderr}"
    );
}

#[test]
fn a_client_silent_after_its_handshake_is_closed_after_the_header_timeout() {
    if !available("openssl", &["version"], "WEIR_REQUIRE_OPENSSL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("weir CA");
    let ca_path = ca.write(dir.path(), "ca.crt");
    let (cert, key) = write_pair(dir.path(), "node", &ca.issue("node"));
    let server = Server::start(&config(&cert, &key, None, false), &dir.path().join("data"));
    let http = server.http.trim_start_matches("http://").to_owned();
    let grpc = server.grpc.trim_start_matches("http://").to_owned();
    for (address, alpn) in [(&http, "h2"), (&http, "http/1.1"), (&grpc, "h2")] {
        // openssl completes the handshake, then waits on its standard input: sends nothing.
        let mut silent = Command::new("openssl")
            .args(["s_client", "-quiet", "-connect", address, "-alpn", alpn])
            .arg("-CAfile")
            .arg(&ca_path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let opened = Instant::now();
        let closed = loop {
            if let Some(status) = silent.try_wait().unwrap() {
                break Some(status);
            }
            if opened.elapsed() > Duration::from_secs(10) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = silent.kill();
        let _ = silent.wait();
        assert!(
            closed.is_some(),
            "a silent client ({address}, {alpn}) was kept past the 2 s header timeout"
        );
        assert!(
            opened.elapsed() >= Duration::from_millis(1500),
            "closed before the timeout: {:?}",
            opened.elapsed()
        );
    }
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    if !available("curl", &["--version"], "WEIR_REQUIRE_CURL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("weir CA");
    let ca_path = ca.write(dir.path(), "ca.crt");
    let (cert, key) = write_pair(dir.path(), "node", &ca.issue("node"));
    let (client_cert, client_key) = write_pair(dir.path(), "client", &ca.issue("client"));
    // A certificate another CA signed is no better than none.
    let stranger = Authority::new("stranger CA");
    let (stranger_cert, stranger_key) =
        write_pair(dir.path(), "stranger", &stranger.issue("stranger"));
    let server = Server::start_full(
        &config(&cert, &key, Some(&ca_path), false),
        &dir.path().join("data"),
        &[],
        &["--resp", "127.0.0.1:0"],
    );
    let health = https(&server, "/healthz");
    let trust = ["--cacert", path_arg(&ca_path)];

    let (code, out) = curl(&trust, &health);
    assert_ne!(code, 0, "a client without a certificate was served: {out}");
    let with = |cert: &Path, key: &Path| {
        let mut args = trust.to_vec();
        args.extend(["--cert", path_arg(cert), "--key", path_arg(key)]);
        curl(&args, &health)
    };
    let (code, out) = with(&stranger_cert, &stranger_key);
    assert_ne!(
        code, 0,
        "a client with a stranger's certificate was served: {out}"
    );
    let (code, out) = with(&client_cert, &client_key);
    assert_eq!((code, out.as_str()), (0, "200"));

    // Weir's own client, as an operator runs it.
    let config_get = |client: &[&str]| {
        support::weir()
            .args(["config", "get", "api", "--server", &https(&server, "")])
            .args(trust)
            .args(client)
            .env_remove("WEIR_CLIENT_CERT")
            .env_remove("WEIR_CLIENT_KEY")
            .output()
            .unwrap()
    };
    let refused = config_get(&[]);
    assert!(!refused.status.success());
    let got = config_get(&[
        "--cert",
        path_arg(&client_cert),
        "--key",
        path_arg(&client_key),
    ]);
    let said = String::from_utf8_lossy(&got.stdout);
    assert!(
        got.status.success() && said.contains("\"name\": \"api\""),
        "{said}{}",
        String::from_utf8_lossy(&got.stderr)
    );

    if available("redis-cli", &["--version"], "WEIR_REQUIRE_REDIS") {
        let resp = server.resp.as_deref().unwrap();
        assert_ne!(redis_ping(resp, &ca_path, None), "PONG");
        assert_eq!(
            redis_ping(resp, &ca_path, Some((&client_cert, &client_key))),
            "PONG"
        );
    }
    if grpcio_available() {
        let refused = grpcio_health(&server.grpc, &ca_path, None);
        assert!(refused.starts_with("refused"), "{refused}");
        assert_eq!(
            grpcio_health(&server.grpc, &ca_path, Some((&client_cert, &client_key))),
            "SERVING"
        );
    }
}

#[test]
fn a_missing_or_mismatched_file_stops_the_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("weir CA");
    let (cert, key) = write_pair(dir.path(), "node", &ca.issue("node"));
    let (_, other_key) = write_pair(dir.path(), "other", &ca.issue("other"));
    let missing = dir.path().join("missing.key");
    let not_pem = dir.path().join("garbage.crt");
    std::fs::write(&not_pem, "garbage\n").unwrap();
    let cases = [
        (&cert, &missing, "missing.key"),
        (&cert, &other_key, "other.key"),
        (&not_pem, &key, "garbage.crt"),
    ];
    for (cert, key, named) in cases {
        let file = dir.path().join("weir.toml");
        std::fs::write(&file, config(cert, key, None, false)).unwrap();
        // The check a deploy runs first says the same as the start.
        let check = support::weir()
            .args(["check-config"])
            .arg(&file)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&check.stdout);
        assert!(!check.status.success() && said.contains(named), "{said}");
        // Bounded: a regression that lets it start must fail the test, not hang it.
        let start = Command::new("timeout")
            .arg("30")
            .arg(env!("CARGO_BIN_EXE_weir"))
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .arg("--config")
            .arg(&file)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env_remove("WEIR_TLS_CERT")
            .env_remove("WEIR_TLS_KEY")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&start.stderr);
        assert!(!start.status.success() && said.contains(named), "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_call_each_other_over_mutual_tls() {
    if !available("curl", &["--version"], "WEIR_REQUIRE_CURL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Nodes' certificates from the cluster's CA, clients' from another: each node verifies
    // nodes calling in by `peer_ca`, and clients by `client_ca`.
    let ca = Authority::new("cluster CA");
    let peer_ca = ca.write(dir.path(), "peer-ca.crt");
    let clients = Authority::new("clients' CA");
    let client_ca = clients.write(dir.path(), "client-ca.crt");
    let udp = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string()
    };
    let seed = udp();
    let (cert, key) = write_pair(dir.path(), "client", &clients.issue("client"));
    // curl trusts the CA the nodes' certificates come from.
    let ca_path = peer_ca.clone();
    let mut nodes = Vec::new();
    for (id, gossip, join) in [
        ("n1", seed.clone(), None),
        ("n2", udp(), Some(seed.clone())),
    ] {
        let node_dir = dir.path().join(id);
        std::fs::create_dir_all(&node_dir).unwrap();
        let (node_cert, node_key) = write_pair(&node_dir, id, &ca.issue(id));
        let mut args = vec!["--node-id", id, "--gossip", &gossip];
        if let Some(seed) = &join {
            args.extend(["--join", seed]);
        }
        // Verified for one name all node certificates carry, not for each address.
        let config = config(&node_cert, &node_key, Some(&client_ca), true).replacen(
            "peer_name",
            &format!("peer_ca = {:?}\npeer_name", path_arg(&peer_ca)),
            1,
        );
        nodes.push(Server::start_full(
            &config,
            &node_dir.join("data"),
            &[("WEIR_CLUSTER_SECRET", "two nodes share this secret")],
            &args,
        ));
    }
    let get = |server: &Server, path: &str| -> serde_json::Value {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert", path_arg(&ca_path)])
            .args(["--cert", path_arg(&cert), "--key", path_arg(&key)])
            .arg(https(server, path))
            .output()
            .unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    };
    let ask = |server: &Server| -> u16 {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert", path_arg(&ca_path)])
            .args(["--cert", path_arg(&cert), "--key", path_arg(&key)])
            .args(["-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg("content-type: application/json")
            .args(["-d", r#"{"policy": "shared", "key": "tenant-a"}"#])
            .arg(https(server, "/v1/acquire"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).parse().unwrap_or(0)
    };
    let started = Instant::now();
    loop {
        let seen: Vec<usize> = nodes
            .iter()
            .map(|n| {
                // Members seen, the ring rebuilt from them, and the new owner's census
                // answered (until then it holds the buckets it took on).
                let view = get(n, "/v1/cluster");
                let members = view["members"].as_array().map_or(0, Vec::len);
                let ring = view["ring"]["members"].as_u64().unwrap_or(0) as usize;
                match view["ring"]["handed_over"] == true {
                    true => members.min(ring),
                    false => 0,
                }
            })
            .collect();
        if seen == [2, 2] {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "gossip did not converge: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let view = get(&nodes[0], "/v1/cluster");
    let addresses = view["members"].to_string();
    assert_eq!(addresses.matches("https://").count(), 2, "{addresses}");

    // A burst of 5 for the one key, asked 5 times through each node: 5 admitted in all, the
    // non-owner's decisions forwarded to the owner over mutual TLS, none failed.
    let mut admitted = 0;
    for _ in 0..5 {
        for node in &nodes {
            let status = ask(node);
            assert!(status == 200 || status == 429, "{status}");
            admitted += usize::from(status == 200);
        }
    }
    assert_eq!(admitted, 5);
    let mut forwarded = 0;
    for node in &nodes {
        let counters = &get(node, "/v1/cluster")["counters"];
        assert_eq!(counters["forward_failed"], 0, "{counters}");
        forwarded += counters["forwarded"].as_u64().unwrap();
    }
    assert_eq!(forwarded, 5, "the non-owner forwarded each of its five");
}
