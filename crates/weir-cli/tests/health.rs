//! `grpc.health.v1` as a real client sees it (grpcio's health checking package, as
//! orchestrators' probes use it): SERVING while the node serves, NOT_SERVING from the first
//! moment of a SIGTERM drain, in agreement with `/readyz`.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::Server;

const CONFIG: &str = r#"
[[policy]]
name = "slow"
on_exhausted = "wait"
max_wait = "60s"
leaky_bucket = { initial = 0, refill_interval = "30s", refill_amount = 1, max = 1 }
"#;

/// Checks the server and Weir's service, then watches the server's status and prints each
/// change until NOT_SERVING.
const WATCH: &str = r#"
import sys, grpc
from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as rpc
name = pb.HealthCheckResponse.ServingStatus.Name
stub = rpc.HealthStub(grpc.insecure_channel(sys.argv[1]))
for service in ("", "weir.v1.Weir"):
    print("check", service or "-", name(stub.Check(pb.HealthCheckRequest(service=service), timeout=5).status), flush=True)
for answer in stub.Watch(pb.HealthCheckRequest(service=""), timeout=20):
    print("watch", name(answer.status), flush=True)
    if answer.status == pb.HealthCheckResponse.NOT_SERVING:
        break
"#;

fn grpcio_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import grpc, grpc_health.v1.health_pb2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("WEIR_REQUIRE_GRPCIO").is_none(),
            "grpcio and grpcio-health-checking are required here"
        );
        eprintln!("skipping: python3 with grpcio and grpcio-health-checking is not installed");
    }
    found
}

#[tokio::test]
async fn grpcio_sees_serving_then_not_serving_from_the_start_of_a_drain() {
    if !grpcio_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    // A request waiting for its turn keeps the drain going after SIGTERM.
    let waiting = tokio::spawn(
        reqwest::Client::new()
            .post(server.url("/v1/acquire"))
            .json(&serde_json::json!({"policy": "slow", "key": "k"}))
            .send(),
    );
    let target = server.grpc.trim_start_matches("http://").to_owned();
    let mut watcher = Command::new("python3")
        .args(["-c", WATCH, &target])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("a line from the watcher").unwrap();
    assert_eq!(next(), "check - SERVING");
    assert_eq!(next(), "check weir.v1.Weir SERVING");
    assert_eq!(next(), "watch SERVING");
    let ready = reqwest::get(server.url("/readyz")).await.unwrap().status();
    assert_eq!(ready, reqwest::StatusCode::OK);
    server.signal("TERM");
    assert_eq!(next(), "watch NOT_SERVING");
    assert!(watcher.wait().unwrap().success());
    let answered = waiting.await.unwrap().unwrap();
    assert_eq!(answered.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let (status, stderr) = server.wait();
    assert!(status.success(), "{stderr}");
}
