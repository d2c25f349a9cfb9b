//! Two-tier admission over the real gRPC transport, between two nodes on loopback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use weir::SystemClock;
use weir::policy::OnUnavailable;
use weir_cluster::admission::{Tier, TwoTier, TwoTierConfig};
use weir_cluster::grpc::{ClusterService, GrpcTransport};
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::secret::ClusterSecret;

fn ring(ids: &[&str]) -> Ring {
    Ring::new(
        ids.iter().map(|id| Member::owner(*id, 1)),
        DEFAULT_VNODES,
        1,
    )
}

/// A lease request from n1 for `bucket`, unfenced, now.
fn lease_request(bucket: &str, limit: u64) -> weir_cluster::transport::LeaseRequest {
    weir_cluster::transport::LeaseRequest::one(
        bucket,
        limit,
        "n1",
        std::time::Duration::from_secs(30),
        weir::Clock::now(&SystemClock::new()),
    )
}

/// Serves `owner` on an ephemeral loopback port; returns its URL and the server task.
async fn serve(owner: Arc<Owner>) -> (String, tokio::task::JoinHandle<()>) {
    serve_with(owner, None).await
}

/// Like [`serve`], refusing calls without `secret`'s token.
async fn serve_with(
    owner: Arc<Owner>,
    secret: Option<&ClusterSecret>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = ClusterService::new(owner, SystemClock::new()).into_server(secret);
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    (url, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_cross_the_wire_and_move_with_the_bucket() {
    let shared_ring = Arc::new(SharedRing::new(ring(&["n1", "n2"])));
    let bucket = (0..1000)
        .map(|i| format!("bucket-{i}"))
        .find(|b| shared_ring.owner_of(b).as_deref() == Some("n2"))
        .unwrap();
    let n1_pool = Arc::new(SharedPool::new(100));
    let n2_pool = Arc::new(SharedPool::new(100));
    // n2 keeps its own view of the ring.
    let n2_ring = Arc::new(SharedRing::new(ring(&["n1", "n2"])));
    let (n2_url, n2_server) = serve(Arc::new(Owner::new(
        "n2",
        Arc::clone(&n2_ring),
        Arc::clone(&n2_pool),
    )))
    .await;

    let transport = Arc::new(GrpcTransport::new(SystemClock::new()));
    transport.set_addresses(HashMap::from([("n2".to_owned(), n2_url)]));
    let n1 = TwoTier::new(
        "n1",
        TwoTierConfig {
            node_limit: 1,
            shared_limit: 2,
            lease_ttl: Duration::from_secs(30),
            // Unfenced: a fenced request would wait one TTL for n2's tenure (checked below).
            on_unavailable: OnUnavailable::Open,
            acquire_timeout: Duration::from_secs(2),
            max_keys: 100,
            max_loan: 1,
            learning_period: Duration::ZERO,
        },
        Arc::clone(&shared_ring),
        transport,
        Arc::new(Owner::new(
            "n1",
            Arc::clone(&shared_ring),
            Arc::clone(&n1_pool),
        )),
        SystemClock::new(),
    );

    let node = n1.acquire(&bucket).await.unwrap();
    let first = n1.acquire(&bucket).await.unwrap();
    let second = n1.acquire(&bucket).await.unwrap();
    assert_eq!(
        (node.tier, first.tier, second.tier),
        (Tier::Node, Tier::Shared, Tier::Shared)
    );
    assert_eq!(n2_pool.in_use(&bucket, 0), 2, "granted on n2, over gRPC");
    let refused = n1.acquire(&bucket).await.unwrap_err();
    assert_eq!(
        refused.reason.to_string(),
        "reached its per-node limit of 1 and its shared limit of 2"
    );
    n1.release(first).await;
    assert_eq!(n2_pool.in_use(&bucket, 0), 1, "released on n2");

    // n2 leaves the ring: the live lease moves to n1 and is released on n2.
    shared_ring.publish(ring(&["n1"]));
    n2_ring.publish(ring(&["n1"]));
    assert_eq!(n1.rehome().await, 1);
    assert_eq!(n2_pool.in_use(&bucket, 0), 0);
    assert_eq!(n1_pool.in_use(&bucket, 0), 1);
    n1.release(second).await;
    assert_eq!(n1_pool.in_use(&bucket, 0), 0, "released where it now lives");

    // Back to two nodes, with n2 down: the shared limit cannot be checked, and the request
    // fails open.
    shared_ring.publish(ring(&["n1", "n2"]));
    n2_server.abort();
    let _ = n2_server.await;
    assert_eq!(n1.acquire(&bucket).await.unwrap().tier, Tier::FailOpen);
    drop(node);
}

/// Batches cross the wire in one call each way: a grant per request in order (a full bucket
/// answers full, a bucket the callee does not own answers not-owner), and one call releases
/// them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_leases_is_one_call_with_an_answer_per_request() {
    use weir::Clock;
    use weir_cluster::pool::Grant;
    use weir_cluster::transport::{Fence, LeaseRequest, TransportError, TransportExt};

    let ring_view = Arc::new(SharedRing::new(ring(&["n1", "n2"])));
    let owned_by = |owner: &str| {
        (0..1000)
            .map(|i| format!("bucket-{i}"))
            .find(|b| ring_view.owner_of(b).as_deref() == Some(owner))
            .unwrap()
    };
    let (mine, theirs) = (owned_by("n2"), owned_by("n1"));
    let pool = Arc::new(SharedPool::new(100));
    let (url, server) = serve(Arc::new(Owner::new(
        "n2",
        Arc::clone(&ring_view),
        Arc::clone(&pool),
    )))
    .await;
    let transport = GrpcTransport::new(SystemClock::new());
    transport.set_addresses(HashMap::from([("n2".to_owned(), url)]));
    let now = SystemClock::new().now();
    let request =
        |bucket: &str| LeaseRequest::one(bucket, 2, "n1", std::time::Duration::from_secs(30), now);
    let answers = transport
        .acquire_batch(
            "n2",
            vec![
                request(&mine),
                request(&mine),
                request(&mine),
                request(&theirs),
                LeaseRequest {
                    fence: Fence::Closed,
                    ..request(&mine)
                },
            ],
        )
        .await;
    assert_eq!(answers.len(), 5);
    let ids: Vec<u64> = answers[..2]
        .iter()
        .map(|a| match a {
            Ok(Grant::Granted { id, expires_at, .. }) => {
                assert!(*expires_at > now);
                *id
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(answers[2], Ok(Grant::Full));
    assert_eq!(answers[3], Err(TransportError::NotOwner("n2".to_owned())));
    // n2 has just started: a fenced request waits for one TTL of tenure, and says how long.
    match &answers[4] {
        Err(TransportError::Settling { owner, wait }) => {
            assert_eq!(owner, "n2");
            assert!(
                *wait > std::time::Duration::from_secs(29)
                    && *wait <= std::time::Duration::from_secs(30),
                "{wait:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(pool.in_use(&mine, now), 2);
    transport
        .release_batch("n2", ids.iter().map(|&id| (mine.clone(), id)).collect())
        .await
        .unwrap();
    assert_eq!(pool.in_use(&mine, now), 0);
    server.abort();
}

/// A node that comes back at another address (a restart) is reached there: the channel to the
/// old address is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_at_a_new_address_is_reached_there() {
    use weir::Clock;
    use weir_cluster::pool::Grant;
    use weir_cluster::transport::TransportExt;

    let view = Arc::new(SharedRing::new(ring(&["n2"])));
    let (first_pool, second_pool) = (Arc::new(SharedPool::new(10)), Arc::new(SharedPool::new(10)));
    let (first, first_server) = serve(Arc::new(Owner::new(
        "n2",
        Arc::clone(&view),
        Arc::clone(&first_pool),
    )))
    .await;
    let (second, second_server) = serve(Arc::new(Owner::new(
        "n2",
        Arc::clone(&view),
        Arc::clone(&second_pool),
    )))
    .await;
    let transport = GrpcTransport::new(SystemClock::new());
    let request = || lease_request("b", 10);
    let now = SystemClock::new().now();
    transport.set_addresses(HashMap::from([("n2".to_owned(), first)]));
    let granted = transport.acquire("n2", request()).await;
    assert!(matches!(granted, Ok(Grant::Granted { .. })), "{granted:?}");
    transport.set_addresses(HashMap::from([("n2".to_owned(), second)]));
    let granted = transport.acquire("n2", request()).await;
    assert!(matches!(granted, Ok(Grant::Granted { .. })), "{granted:?}");
    assert_eq!(
        (first_pool.in_use("b", now), second_pool.in_use("b", now)),
        (1, 1)
    );
    first_server.abort();
    second_server.abort();
}

/// With a cluster secret, an owner answers only calls carrying its token: a node with no
/// secret or another one is refused, one with the same secret is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_with_a_secret_answers_only_calls_that_carry_it() {
    use weir::Clock;
    use weir_cluster::pool::Grant;
    use weir_cluster::transport::{TransportError, TransportExt};

    let ours = ClusterSecret::new("a secret of the weir cluster").unwrap();
    let theirs = ClusterSecret::new("another secret, another one").unwrap();
    let view = Arc::new(SharedRing::new(ring(&["n2"])));
    let pool = Arc::new(SharedPool::new(10));
    let (url, server) = serve_with(
        Arc::new(Owner::new("n2", Arc::clone(&view), Arc::clone(&pool))),
        Some(&ours),
    )
    .await;
    let request = || lease_request("b", 10);
    for secret in [None, Some(&theirs)] {
        let transport = GrpcTransport::new(SystemClock::new()).with_secret(secret);
        transport.set_addresses(HashMap::from([("n2".to_owned(), url.clone())]));
        assert_eq!(
            transport.acquire("n2", request()).await,
            Err(TransportError::Unreachable("n2".to_owned()))
        );
    }
    assert_eq!(
        pool.in_use("b", SystemClock::new().now()),
        0,
        "nothing granted"
    );
    let transport = GrpcTransport::new(SystemClock::new()).with_secret(Some(&ours));
    transport.set_addresses(HashMap::from([("n2".to_owned(), url)]));
    let granted = transport.acquire("n2", request()).await;
    assert!(matches!(granted, Ok(Grant::Granted { .. })), "{granted:?}");
    server.abort();
}
