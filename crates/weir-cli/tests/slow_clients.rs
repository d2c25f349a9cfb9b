//! Clients that are slow, silent, greedy or careless, against a real `weir serve` with short
//! limits: none of them holds a connection past its timeout, none keeps others from being
//! served, and an over-limit body gets a 413 the client can read.
//!
//! These tests run on real sockets and real time (a paused clock cannot pace a TCP peer); each
//! is bounded, and their limits are a second, so a timing assertion has a second of slack.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(max_connections: usize) -> String {
    format!(
        r#"
[server]
header_timeout = "1s"
body_timeout = "1s"
max_connections = {max_connections}

[[policy]]
name = "tokens"
on_exhausted = "reject"
token_bucket = {{ rate = 1000, burst = 1000 }}
"#
    )
}

fn address(server: &Server) -> String {
    server.http.trim_start_matches("http://").to_owned()
}

const BODY: &str = r#"{"policy":"tokens","key":"k"}"#;

fn acquire_request() -> String {
    format!(
        "POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
}

/// Reads until the server closes the connection (bounded: 10 s); returns what it sent and
/// how long that took.
async fn read_to_close(tcp: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open past 10 s"
    );
    (
        String::from_utf8_lossy(&received).into_owned(),
        started.elapsed(),
    )
}

async fn decide(server: &Server) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(server.url("/v1/acquire"))
        .json(&json!({"policy": "tokens", "key": "k"}))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn headers_sent_a_byte_at_a_time_are_cut_off_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let mut slow = TcpStream::connect(address(&server)).await.unwrap();
    let (mut reader, mut writer) = slow.split();
    let request = acquire_request();
    let trickle = async {
        let mut pace = tokio::time::interval(Duration::from_millis(100));
        for byte in request.as_bytes() {
            pace.tick().await;
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
    };
    let watch = async {
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buf)).await;
        (closed, started.elapsed())
    };
    let others = async {
        for _ in 0..10 {
            assert_eq!(decide(&server).await, reqwest::StatusCode::OK);
        }
    };
    let ((closed, after), (), ()) = tokio::join!(watch, others, async {
        tokio::select! {
            () = trickle => {}
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    });
    assert!(closed.is_ok(), "a slow sender was never cut off");
    assert!(
        after >= Duration::from_millis(900),
        "cut off after {after:?}"
    );
    assert!(
        after < Duration::from_secs(5),
        "cut off only after {after:?}"
    );
}

#[tokio::test]
async fn a_silent_and_an_idle_keep_alive_connection_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let mut silent = TcpStream::connect(address(&server)).await.unwrap();
    let mut idle = TcpStream::connect(address(&server)).await.unwrap();
    idle.write_all(acquire_request().as_bytes()).await.unwrap();
    let ((_, silent_for), (answered, idle_for)) =
        tokio::join!(read_to_close(&mut silent), read_to_close(&mut idle));
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    for waited in [silent_for, idle_for] {
        assert!(
            waited >= Duration::from_millis(900),
            "closed after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(5),
            "closed only after {waited:?}"
        );
    }
}

/// gRPC: a client that connects and never sends HTTP/2's connection preface is closed after
/// the header timeout too (hyper would wait for the preface for ever), while a real client is
/// served beside it.
#[tokio::test]
async fn a_silent_grpc_connection_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let mut silent = TcpStream::connect(server.grpc.trim_start_matches("http://"))
        .await
        .unwrap();
    let (sent, silent_for) = read_to_close(&mut silent).await;
    assert!(sent.is_empty(), "{sent}");
    assert!(
        silent_for >= Duration::from_millis(900) && silent_for < Duration::from_secs(5),
        "closed after {silent_for:?}"
    );
    let channel = tonic::transport::Channel::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.status, 1, "SERVING");
}

#[tokio::test]
async fn a_stalled_body_is_answered_408() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let mut tcp = TcpStream::connect(address(&server)).await.unwrap();
    let head = "POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"policy\":";
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (answer, waited) = read_to_close(&mut tcp).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
}

/// Sends `request` whole while reading the answer (up to 10 s, until the server closes): a
/// server that answers before reading everything does not stall the sending.
async fn send_while_reading(tcp: &mut TcpStream, request: &[u8]) -> (std::io::Result<()>, String) {
    let (mut reader, mut writer) = tcp.split();
    let send = async { writer.write_all(request).await };
    let read = async {
        let mut received = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut received)).await;
        String::from_utf8_lossy(&received).into_owned()
    };
    tokio::join!(send, read)
}

#[tokio::test]
async fn an_over_limit_body_gets_a_413_the_client_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let big = 200_000;
    // Sent whole without waiting: the server reads it away before answering, so the answer is
    // not lost to a reset.
    let mut eager = TcpStream::connect(address(&server)).await.unwrap();
    let head = format!(
        "POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {big}\r\n\r\n"
    );
    let mut whole = head.into_bytes();
    whole.extend(std::iter::repeat_n(b' ', big));
    let (sent, answer) = send_while_reading(&mut eager, &whole).await;
    assert!(sent.is_ok(), "the body could not be sent: {sent:?}");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"], "too_large");

    // Asked with `Expect: 100-continue`: the 413 comes instead of the 100, before any body.
    let mut careful = TcpStream::connect(address(&server)).await.unwrap();
    let head = format!(
        "POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {big}\r\nexpect: 100-continue\r\n\r\n"
    );
    careful.write_all(head.as_bytes()).await.unwrap();
    let (answer, _) = read_to_close(&mut careful).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(2), &dir.path().join("data"));
    // Two connections that say nothing take both slots until their header timeout.
    let silent: Vec<TcpStream> = vec![
        TcpStream::connect(address(&server)).await.unwrap(),
        TcpStream::connect(address(&server)).await.unwrap(),
    ];
    let started = Instant::now();
    let mut third = TcpStream::connect(address(&server)).await.unwrap();
    third.write_all(acquire_request().as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), third.read_exact(&mut answer))
        .await
        .expect("the third connection was never served")
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(&answer, b"HTTP/1.1 200");
    assert!(
        waited >= Duration::from_millis(500),
        "served after {waited:?}, before a slot was free"
    );
    drop(silent);
}

/// A body with no length sent in chunks: over the limit it is refused as too large wherever the
/// limit falls; within it, chunks are joined into the one JSON body they make.
#[tokio::test]
async fn a_chunked_body_is_joined_and_held_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(100), &dir.path().join("data"));
    let chunked = |parts: &[&[u8]]| {
        let mut request = b"POST /v1/acquire HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
        for part in parts {
            request.extend(format!("{:x}\r\n", part.len()).into_bytes());
            request.extend_from_slice(part);
            request.extend(b"\r\n");
        }
        request.extend(b"0\r\n\r\n");
        request
    };
    // In three pieces, split inside a string: one body.
    let mut tcp = TcpStream::connect(address(&server)).await.unwrap();
    let request = chunked(&[b"{\"poli", b"cy\":\"tokens\",\"key\"", b":\"k\"}"]);
    tcp.write_all(&request).await.unwrap();
    let (answer, _) = read_to_close(&mut tcp).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // 100 chunks of 1 KiB, past the 64 KiB limit.
    let kib = [b' '; 1024];
    let parts: Vec<&[u8]> = (0..100).map(|_| &kib[..]).collect();
    let mut tcp = TcpStream::connect(address(&server)).await.unwrap();
    let request = chunked(&parts);
    let (_, answer) = send_while_reading(&mut tcp, &request).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"], "too_large");
}
