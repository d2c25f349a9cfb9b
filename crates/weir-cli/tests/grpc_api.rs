//! The gRPC API of a real `weir serve`, unary and streaming.

mod support;

use support::Server;
use tokio_stream::StreamExt;
use tonic::Code;
use weir_server::proto::weir_client::WeirClient;
use weir_server::proto::{
    AcquireRequest, BusyRequest, ReleaseRequest, RenewRequest, ThrottlesRequest,
};

const CONFIG: &str = r#"
[[policy]]
name = "tokens"
on_exhausted = "reject"
token_bucket = { rate = 1, burst = 2 }

[[policy]]
name = "inflight"
on_exhausted = "reject"
concurrency = { node_limit = 1 }

[[policy]]
name = "adaptive"
adaptive = { top_k = 1 }

[[policy]]
name = "queue"
on_exhausted = "wait"
max_wait = "60s"
concurrency = { node_limit = 1, lease_ttl = "60s" }
"#;

/// Reads `/metrics` until `series` shows `value` (bounded: 10 s).
async fn until_metric(server: &Server, series: &str, value: u64) {
    let wanted = format!("{series} {value}\n");
    let started = std::time::Instant::now();
    loop {
        let text = reqwest::get(format!("{}/metrics", server.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains(&wanted) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{series} never reached {value}"
        );
        tokio::task::yield_now().await;
    }
}

fn acquire(policy: &str, key: &str, id: u64) -> AcquireRequest {
    AcquireRequest {
        policy: policy.into(),
        key: key.into(),
        id,
        ..Default::default()
    }
}

#[tokio::test]
async fn unary_calls_mirror_the_http_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let mut client = WeirClient::connect(server.grpc.clone()).await.unwrap();

    for _ in 0..2 {
        let answer = client
            .acquire(acquire("tokens", "a", 0))
            .await
            .unwrap()
            .into_inner();
        assert!(answer.admitted);
        assert_eq!(answer.tier, "node");
    }
    let refused = client
        .acquire(acquire("tokens", "a", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.admitted);
    assert!(refused.retry_after_ms.unwrap() <= 1000);
    assert!(refused.reason.starts_with("policy `tokens`"));

    let held = client
        .acquire(acquire("inflight", "g", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.admitted && !held.lease.is_empty());
    let renewed = client
        .renew(RenewRequest {
            lease: held.lease.clone(),
            ttl_ms: Some(10_000),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(renewed.expires_in_ms > 9_000);
    assert!(
        client
            .release(ReleaseRequest {
                lease: held.lease.clone()
            })
            .await
            .unwrap()
            .into_inner()
            .released
    );
    let again = client
        .release(ReleaseRequest { lease: held.lease })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound);

    let unknown = client.acquire(acquire("nope", "a", 0)).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let invalid = client.acquire(acquire("tokens", "", 0)).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().contains("`key`"));

    let busy = client
        .busy(BusyRequest {
            policy: "tokens".into(),
            kind: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition);
    let busy = client
        .busy(BusyRequest {
            policy: "adaptive".into(),
            kind: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!busy.tightened, "no traffic yet: nothing to tighten");

    let rows = client
        .throttles(ThrottlesRequest {
            policy: "tokens".into(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .rows;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].key.as_str(), rows[0].qps_limit), ("a", Some(1.0)));
}

#[tokio::test]
async fn the_stream_answers_every_request_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let mut client = WeirClient::connect(server.grpc.clone()).await.unwrap();
    // 100 keys × 3 requests on a burst-2 bucket: 200 admitted, 100 refused, plus one invalid.
    let mut requests: Vec<AcquireRequest> = (0..300u64)
        .map(|i| acquire("tokens", &format!("k{}", i % 100), i))
        .collect();
    requests.push(acquire("tokens", "", 300));
    let answers: Vec<_> = client
        .acquire_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner()
        .collect::<Vec<_>>()
        .await;
    let answers: Vec<_> = answers.into_iter().map(|a| a.unwrap()).collect();
    assert_eq!(answers.len(), 301);
    let mut ids: Vec<u64> = answers.iter().map(|a| a.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..=300).collect::<Vec<_>>());
    assert_eq!(answers.iter().filter(|a| a.admitted).count(), 200);
    let invalid = answers.iter().find(|a| a.id == 300).unwrap();
    assert!(
        invalid.error.contains("`key` must not be empty"),
        "{}",
        invalid.error
    );
}

/// Sends raw bytes as a request body: the wire as a broken or hostile client writes it.
#[derive(Debug, Clone, Default)]
struct RawBytes;

impl tonic::codec::Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> Self::Encoder {
        RawBytes
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytes
    }
}

impl tonic::codec::Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = bytes::Buf::copy_to_bytes(buf, bytes::Buf::remaining(buf));
        Ok(Some(bytes.to_vec()))
    }
}

/// Bytes that are not an `AcquireRequest` are the caller's fault: `INVALID_ARGUMENT`, saying
/// what did not decode — not `INTERNAL`, which clients retry as a server fault.
#[tokio::test]
async fn a_malformed_message_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    // Field 1 (`policy`, a string) announced 100 bytes long, with 2 there.
    let garbage = vec![0x0a, 100, b'x', b'y'];
    let status = grpc
        .unary(
            tonic::Request::new(garbage),
            http::uri::PathAndQuery::from_static("/weir.v1.Weir/Acquire"),
            RawBytes,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("does not decode"), "{status:?}");
    // The node is unharmed: a good request right after is answered.
    let mut client = WeirClient::connect(server.grpc.clone()).await.unwrap();
    assert!(
        client
            .acquire(acquire("tokens", "a", 0))
            .await
            .unwrap()
            .into_inner()
            .admitted
    );
}

/// A client and an `AcquireStream` on it kept open: requests go in through the sender.
async fn open_stream(
    server: &Server,
) -> (
    WeirClient<tonic::transport::Channel>,
    tokio::sync::mpsc::Sender<AcquireRequest>,
    tonic::Streaming<weir_server::proto::AcquireResponse>,
) {
    let mut client = WeirClient::connect(server.grpc.clone()).await.unwrap();
    let (requests, queued) = tokio::sync::mpsc::channel(64);
    let answers = client
        .acquire_stream(tokio_stream::wrappers::ReceiverStream::new(queued))
        .await
        .unwrap()
        .into_inner();
    (client, requests, answers)
}

/// A stream's waiting acquires end with the stream: cancelled, they stop waiting, and none is
/// admitted later for the caller that left (which would hold a permit nobody releases).
#[tokio::test]
async fn a_cancelled_stream_takes_its_waiters_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let (mut client, requests, mut answers) = open_stream(&server).await;
    requests.send(acquire("queue", "q", 0)).await.unwrap();
    let first = answers.next().await.unwrap().unwrap();
    assert!(first.admitted, "{first:?}");
    for id in 1..=50 {
        requests.send(acquire("queue", "q", id)).await.unwrap();
    }
    until_metric(&server, "weir_waiters{policy=\"queue\"}", 50).await;
    drop(answers);
    drop(requests);
    until_metric(&server, "weir_waiters{policy=\"queue\"}", 0).await;
    // The permit comes free: nobody from the cancelled stream may take it.
    client
        .release(ReleaseRequest { lease: first.lease })
        .await
        .unwrap();
    until_metric(&server, "weir_leases_active", 0).await;
    until_metric(&server, "weir_in_flight{policy=\"queue\"}", 0).await;
}

/// One stream cannot queue without bound: past the cap, an in-band error says so.
#[tokio::test]
async fn a_stream_has_a_bounded_number_of_pending_acquires() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let (_client, requests, mut answers) = open_stream(&server).await;
    let cap = weir_server::MAX_PENDING_PER_STREAM as u64;
    // One is admitted; `cap` more wait; the one after them is refused.
    for id in 0..=cap + 1 {
        requests.send(acquire("queue", "q", id)).await.unwrap();
    }
    // The answers that come: one admission, and a refusal for what did not fit (the rest
    // wait). Tasks race to the limiter, so which id is admitted is not fixed.
    let first = answers.next().await.unwrap().unwrap();
    let second = answers.next().await.unwrap().unwrap();
    let (admitted, refused) = if first.admitted {
        (first, second)
    } else {
        (second, first)
    };
    assert!(
        admitted.admitted && admitted.error.is_empty(),
        "{admitted:?}"
    );
    assert!(!refused.admitted && refused.id >= cap, "{refused:?}");
    assert!(
        refused.error.contains("1024 acquires pending"),
        "{}",
        refused.error
    );
}
