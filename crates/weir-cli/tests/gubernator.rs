//! Gubernator's v1 API from outside, as its users' clients reach it: the gRPC service with
//! grpcio (the reference cases of Gubernator's functional tests, `gubernator_client.py`), the
//! HTTP gateway with curl, and what `/metrics` counts of both.

mod support;

use std::process::Command;

use support::{Server, available};

const CONFIG: &str = "";

fn grpcio_available() -> bool {
    available(
        "python3",
        &["-c", "import grpc, google.protobuf"],
        "WEIR_REQUIRE_GRPCIO",
    )
}

/// `curl` with `args`: the body and the status code, on the last line.
fn curl(args: &[&str]) -> (String, u16) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("running curl");
    assert!(output.status.success(), "curl {args:?}: {output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (body.to_owned(), code.parse().unwrap())
}

#[test]
fn grpcio_passes_gubernators_reference_cases() {
    if !grpcio_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_full(
        CONFIG,
        &dir.path().join("data"),
        &[],
        &["--gubernator", "127.0.0.1:0"],
    );
    let target = server
        .door("gubernator")
        .expect("the Gubernator listener's address")
        .to_owned();
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gubernator_client.py");
    let output = Command::new("timeout")
        .args(["120", "python3", client, &target])
        .output()
        .expect("running the grpcio client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("all reference cases passed"), "{stdout}");
}

#[test]
fn curl_reaches_the_gateway_on_the_http_port() {
    if !available("curl", &["--version"], "WEIR_REQUIRE_CURL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));

    // TestGRPCGateway: field names as the proto writes them.
    let (health, code) = curl(&[&server.url("/v1/HealthCheck")]);
    assert_eq!(code, 200, "{health}");
    for field in [
        "\"peer_count\":1",
        "\"local_peers\"",
        "\"region_peers\":[]",
        "\"status\":\"healthy\"",
    ] {
        assert!(health.contains(field), "{field} in {health}");
    }
    let (live, code) = curl(&[&server.url("/v1/LiveCheck")]);
    assert_eq!((live.as_str(), code), ("{}", 200));

    let ask = |body: &str| {
        curl(&[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "--data",
            body,
            &server.url("/v1/GetRateLimits"),
        ])
    };
    // 64-bit integers as strings or numbers, enums by name or number, either field spelling.
    let body = r#"{"requests":[{"name":"TestGRPCGateway","unique_key":"k","duration":"1000","hits":1,"limit":"10"},
        {"name":"TestGRPCGateway","uniqueKey":"l","duration":60000,"hits":"3","limit":2,"algorithm":"LEAKY_BUCKET","behavior":"DRAIN_OVER_LIMIT"}]}"#;
    let (answer, code) = ask(body);
    assert_eq!(code, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let first = &answer["responses"][0];
    assert_eq!(first["status"], "UNDER_LIMIT");
    assert_eq!(
        (first["limit"].as_str(), first["remaining"].as_str()),
        (Some("10"), Some("9"))
    );
    assert_eq!(first["error"], "");
    assert!(
        first["reset_time"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            > 0
    );
    let second = &answer["responses"][1];
    assert_eq!(
        (second["status"].as_str(), second["remaining"].as_str()),
        (Some("OVER_LIMIT"), Some("0"))
    );

    // As the docs show it: `curl -d`, no content type of JSON.
    let (answer, code) = curl(&[
        "-d",
        r#"{"requests":[{"name":"requests_per_sec","unique_key":"account:12345","hits":"1","limit":"10","duration":"1000"}]}"#,
        &server.url("/v1/GetRateLimits"),
    ]);
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains(r#""remaining":"9""#), "{answer}");

    // The batch limit, and a field the API does not have: the gateway's error shape.
    let many: Vec<String> = (0..1001)
        .map(|i| {
            format!(r#"{{"name":"batch","unique_key":"{i}","hits":1,"limit":1,"duration":1000}}"#)
        })
        .collect();
    let (refused, code) = ask(&format!(r#"{{"requests":[{}]}}"#, many.join(",")));
    assert_eq!(code, 400, "{refused}");
    let refused: serde_json::Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(refused["code"], 11);
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("max size is '1000'")
    );
    let (refused, code) = ask(r#"{"requests":[{"name":"n","unique_key":"k","hitz":1}]}"#);
    assert_eq!(code, 400, "{refused}");
    assert!(
        refused.contains("\"code\":3") && refused.contains("hitz"),
        "{refused}"
    );

    // Counted on /metrics, by algorithm and status.
    let (metrics, _) = curl(&[&server.url("/metrics")]);
    assert!(
        metrics.contains(
            r#"weir_gubernator_decisions_total{algorithm="token_bucket",status="under_limit"} 2"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"weir_gubernator_decisions_total{algorithm="leaky_bucket",status="over_limit"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("weir_gubernator_buckets 3"), "{metrics}");
}

#[test]
fn the_data_token_guards_the_gateway_and_the_service() {
    if !available("curl", &["--version"], "WEIR_REQUIRE_CURL") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = "a-data-token-of-some-length";
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_DATA_TOKEN", token)],
    );
    let body = r#"{"requests":[{"name":"n","unique_key":"k","hits":1,"limit":1,"duration":1000}]}"#;
    let url = server.url("/v1/GetRateLimits");
    let post = [
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "--data",
        body,
        url.as_str(),
    ];
    let (refused, code) = curl(&post);
    assert_eq!(code, 401, "{refused}");
    let bearer = format!("authorization: Bearer {token}");
    let (answer, code) = curl(&[&["-H", bearer.as_str()][..], &post[..]].concat());
    assert_eq!(code, 200, "{answer}");
}

/// Its listener beyond loopback needs the data token, whether the flag or the table puts it
/// there, and the refusal says what it would expose and how its clients send the token.
#[test]
fn its_listener_beyond_loopback_without_a_data_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let weir = env!("CARGO_BIN_EXE_weir");
    let by_flag = Command::new("timeout")
        .args(["30", weir, "serve", "--gubernator", "0.0.0.0:0"])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("WEIR_DATA_TOKEN")
        .output()
        .unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, "[gubernator]\nlisten = \"0.0.0.0:1051\"\n").unwrap();
    let by_table = Command::new(weir)
        .arg("check-config")
        .arg(&config)
        .env_remove("WEIR_DATA_TOKEN")
        .output()
        .unwrap();
    for (how, output) in [("--gubernator", by_flag), ("[gubernator] listen", by_table)] {
        assert!(!output.status.success(), "{how}: {output:?}");
        // `serve` says it on standard error, `check-config` among the problems it lists.
        let stderr =
            String::from_utf8_lossy(&output.stderr) + String::from_utf8_lossy(&output.stdout);
        assert!(
            stderr.contains("(`gubernator`) without a data token"),
            "{how}: {stderr}"
        );
        assert!(
            stderr.contains("any Gubernator bucket") && stderr.contains("authorization: Bearer"),
            "{how}: {stderr}"
        );
    }
}
