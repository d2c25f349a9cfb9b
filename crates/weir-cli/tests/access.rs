//! Who may change what, from outside: a web page reaching a loopback server through a
//! visitor's browser (DNS rebinding), the data plane's own credential beside the admin token,
//! and names that would pass for another's.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::Server;

const CONFIG: &str = r#"
[[policy]]
name = "api"
on_exhausted = "reject"
token_bucket = { rate = 100, burst = 100 }
"#;

/// Sends `method path` with `body` (if any), `Host: host` and the bearer `token` (if any).
async fn send(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    host: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new()
        .request(method, server.url(path))
        .header("host", host);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn policy() -> Value {
    json!({"token_bucket": {"rate": 5, "burst": 5}, "on_exhausted": "reject"})
}

fn acquire() -> Value {
    json!({"policy": "api", "key": "k"})
}

/// A loopback server without an admin token changes state only for requests sent to a
/// loopback host or one the operator lists: a page that rebinds `evil.example` to 127.0.0.1
/// cannot rewrite policies, or spend quotas, through its visitor's browser. Reads stay open.
#[tokio::test]
async fn without_an_admin_token_state_changes_need_a_loopback_or_listed_host() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[server]\nallowed_hosts = [\"weir.internal\"]\n{CONFIG}");
    let server = Server::start(&config, &dir.path().join("data"));
    let port = server.http.rsplit(':').next().unwrap().to_owned();
    let evil = format!("evil.example:{port}");
    for (method, path, body) in [
        (Method::PUT, "/v1/policies/new", Some(policy())),
        (Method::DELETE, "/v1/policies/api", None),
        (Method::POST, "/v1/acquire", Some(acquire())),
        (Method::POST, "/v1/busy", Some(json!({"policy": "api"}))),
    ] {
        let (status, answer) = send(&server, method.clone(), path, &evil, None, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        assert_eq!(answer["error"], "host_not_allowed");
        assert!(
            answer["detail"].as_str().unwrap().contains("allowed_hosts"),
            "{answer}"
        );
    }
    assert_eq!(
        send(&server, Method::GET, "/v1/policies/api", &evil, None, None)
            .await
            .0,
        StatusCode::OK,
        "reads stay open"
    );
    assert_eq!(
        send(&server, Method::GET, "/v1/policies/new", &evil, None, None)
            .await
            .0,
        StatusCode::NOT_FOUND,
        "the refused PUT changed nothing"
    );
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("weir.internal:{port}"),
    ] {
        let (status, answer) = send(
            &server,
            Method::PUT,
            "/v1/policies/new",
            &host,
            None,
            Some(policy()),
        )
        .await;
        assert!(status.is_success(), "{host}: {status} {answer}");
        let (status, _) = send(
            &server,
            Method::POST,
            "/v1/acquire",
            &host,
            None,
            Some(acquire()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
}

/// The status line of `head` (a whole request head, sent as it is over a new connection).
async fn raw(server: &Server, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = server.http.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = tcp.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A state change whose `Host` is given twice, is not a host and port, or is missing from an
/// HTTP/1.1 request is a 400, as HTTP's own servers answer: the host check sees the one host
/// the client named, never the first of several or the start of a longer value. A name with a
/// trailing dot is the name: a listed `weir.internal` takes `weir.internal.`.
#[tokio::test]
async fn a_state_change_with_a_doubtful_host_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[server]\nallowed_hosts = [\"weir.internal\"]\n{CONFIG}");
    let server = Server::start(&config, &dir.path().join("data"));
    let body = r#"{"policy":"api","key":"k"}"#;
    let post = |hosts: &[&str], version: &str| {
        let mut head = format!("POST /v1/acquire HTTP/{version}\r\n");
        for host in hosts {
            head.push_str(&format!("Host: {host}\r\n"));
        }
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        head
    };
    for (hosts, why) in [
        (&["localhost", "evil.example"][..], "two Host headers"),
        (
            &["localhost:21580 evil"][..],
            "a Host that is not a host and port",
        ),
        (&[][..], "no Host in HTTP/1.1"),
    ] {
        let status = raw(&server, &post(hosts, "1.1")).await;
        assert!(status.contains(" 400 "), "{why}: {status}");
    }
    assert!(
        raw(&server, &post(&["localhost"], "1.1"))
            .await
            .contains(" 200 ")
    );
    assert!(
        raw(&server, &post(&[], "1.0")).await.contains(" 200 "),
        "HTTP/1.0 may omit it"
    );
    let (status, answer) = send(
        &server,
        reqwest::Method::POST,
        "/v1/acquire",
        "weir.internal.",
        None,
        Some(acquire()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// With an admin token, the token is the check: any host with it may change policies.
#[tokio::test]
async fn with_an_admin_token_the_token_decides_whatever_the_host() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let admin = "an-admin-token-of-some-length";
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", admin)],
    );
    let (status, _) = send(
        &server,
        Method::PUT,
        "/v1/policies/new",
        "weir.example.com",
        Some(admin),
        Some(policy()),
    )
    .await;
    assert!(status.is_success(), "{status}");
    let (status, _) = send(
        &server,
        Method::PUT,
        "/v1/policies/new",
        "localhost",
        None,
        Some(policy()),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The data token guards acquire, release, renew and busy on HTTP (the admin token also
/// works there); it does not open policy changes.
#[tokio::test]
async fn the_data_plane_has_its_own_token_apart_from_the_admin_token() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let admin = "an-admin-token-of-some-length";
    let data = "a-data-token-of-some-length";
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_ADMIN_TOKEN", admin), ("WEIR_DATA_TOKEN", data)],
    );
    let host = "127.0.0.1";
    let (status, answer) = send(
        &server,
        Method::POST,
        "/v1/acquire",
        host,
        None,
        Some(acquire()),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .contains("WEIR_DATA_TOKEN"),
        "{answer}"
    );
    let (status, _) = send(
        &server,
        Method::POST,
        "/v1/acquire",
        host,
        Some("not-the-token-at-all"),
        Some(acquire()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for token in [data, admin] {
        let (status, _) = send(
            &server,
            Method::POST,
            "/v1/acquire",
            host,
            Some(token),
            Some(acquire()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _) = send(
        &server,
        Method::PUT,
        "/v1/policies/api",
        host,
        Some(data),
        Some(policy()),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the data token rewrites no policy"
    );
    // gRPC too: the data token in the `authorization` metadata.
    use weir_server::proto::AcquireRequest;
    use weir_server::proto::weir_client::WeirClient;
    let mut client = WeirClient::connect(server.grpc.clone()).await.unwrap();
    let request = || AcquireRequest {
        policy: "api".into(),
        key: "g".into(),
        ..Default::default()
    };
    let refused = client.acquire(request()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut with_token = tonic::Request::new(request());
    with_token
        .metadata_mut()
        .insert("authorization", format!("Bearer {data}").parse().unwrap());
    assert!(
        client
            .acquire(with_token)
            .await
            .unwrap()
            .into_inner()
            .admitted
    );
}

/// The protocols' own names are reserved, and a name cannot show itself as another.
#[tokio::test]
async fn reserved_and_misleading_policy_names_are_refused() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    for name in ["CL.THROTTLE", "cl.throttle", "rls:edge.user"] {
        let (status, answer) = send(
            &server,
            Method::PUT,
            &format!("/v1/policies/{name}"),
            "localhost",
            None,
            Some(policy()),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{name}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains("prefix"),
            "{answer}"
        );
    }
    let spoof = "invoice\u{202e}gnp.exe";
    let (status, answer) = send(
        &server,
        Method::PUT,
        &format!("/v1/policies/{}", "invoice%E2%80%AEgnp.exe"),
        "localhost",
        None,
        Some(policy()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{spoof}: {answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("bidirectional"),
        "{answer}"
    );
    // And in a config file, by `check-config`.
    let file = dir.path().join("reserved.toml");
    std::fs::write(
        &file,
        "[[policy]]\nname = \"CL.THROTTLE\"\nstrict = { qps = 1 }\n",
    )
    .unwrap();
    let out = support::weir()
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("is reserved"), "{text}");
}
