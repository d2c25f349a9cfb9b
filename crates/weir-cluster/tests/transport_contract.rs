//! One contract, every cluster transport: the in-memory one, gRPC on loopback, and each behind
//! the batching wrapper. Whatever carries a coordinator's calls, an owner's answers must mean
//! the same: grants up to the limit then full, "not the owner" for a bucket it does not own,
//! "settling" for a fenced request too early, a release that frees a place, renewals of live
//! leases only, adoption that counts, batches answered in order, an unknown node unreachable,
//! and loans (several units in one lease) grown, renewed, given back in part, moved away to
//! another owner (counted on while this one still owns the bucket) and adopted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use weir::{Clock, SystemClock};
use weir_cluster::batch::Batching;
use weir_cluster::grpc::{ClusterService, GrpcTransport};
use weir_cluster::in_memory::InMemory;
use weir_cluster::owner::Owner;
use weir_cluster::pool::{Grant, SharedPool};
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::transport::{
    Adoption, Ask, Fence, LeaseRequest, Renewal, Transport, TransportError, TransportExt,
};

const TTL: Duration = Duration::from_secs(30);

/// The callee, `n2`, owning some buckets of a two-node ring.
struct Callee {
    owner: Arc<Owner>,
    pool: Arc<SharedPool>,
    /// A bucket n2 owns, and one it does not.
    mine: String,
    theirs: String,
    /// Another bucket n2 owns, for loans.
    mine_too: String,
}

fn callee() -> Callee {
    let ring = Ring::new(
        [Member::owner("n1", 1), Member::owner("n2", 1)],
        DEFAULT_VNODES,
        1,
    );
    let owned_by = |id: &str, skip: usize| {
        (0..1000)
            .map(|i| format!("bucket-{i}"))
            .filter(|b| ring.owner_of(b) == Some(id))
            .nth(skip)
            .expect("a bucket")
    };
    let (mine, theirs, mine_too) = (owned_by("n2", 0), owned_by("n1", 0), owned_by("n2", 1));
    let pool = Arc::new(SharedPool::new(100));
    let owner = Arc::new(Owner::new(
        "n2",
        Arc::new(SharedRing::new(ring)),
        Arc::clone(&pool),
    ));
    Callee {
        owner,
        pool,
        mine,
        theirs,
        mine_too,
    }
}

fn request(bucket: &str, limit: u64) -> LeaseRequest {
    LeaseRequest::one(bucket, limit, "n1", TTL, SystemClock::new().now())
}

/// Acquires until the pool has `count` live leases of `bucket` (a batched release lands
/// asynchronously; bounded).
async fn until_in_use(pool: &SharedPool, bucket: &str, count: usize) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while pool.in_use(bucket, SystemClock::new().now()) != count {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{bucket} never had {count} live leases"));
}

/// The contract, over `transport`, whose node `n2` is `callee`.
async fn contract(transport: &impl Transport, callee: &Callee) {
    let (mine, theirs) = (callee.mine.as_str(), callee.theirs.as_str());
    // Grants up to the limit, then full.
    let first = transport.acquire("n2", request(mine, 2)).await;
    let Ok(Grant::Granted { id: first, .. }) = first else {
        panic!("{first:?}");
    };
    let second = transport.acquire("n2", request(mine, 2)).await;
    assert!(matches!(second, Ok(Grant::Granted { .. })), "{second:?}");
    assert_eq!(
        transport.acquire("n2", request(mine, 2)).await,
        Ok(Grant::Full)
    );
    // Not the owner.
    assert_eq!(
        transport.acquire("n2", request(theirs, 2)).await,
        Err(TransportError::NotOwner("n2".into()))
    );
    // Fenced too early: settling, with the time to wait.
    let fenced = LeaseRequest {
        fence: Fence::Closed,
        ..request(mine, 10)
    };
    match transport.acquire("n2", fenced).await {
        Err(TransportError::Settling { owner, wait }) => {
            assert_eq!(owner, "n2");
            assert!(!wait.is_zero() && wait <= TTL, "{wait:?}");
        }
        other => panic!("{other:?}"),
    }
    // Renewal: a live lease yes, an unknown one no.
    let now = SystemClock::new().now();
    assert_eq!(
        transport
            .renew(
                "n2",
                Renewal {
                    bucket: (mine).into(),
                    lease: first,
                    ttl: TTL,
                    now,
                    fenced: false
                }
            )
            .await,
        Ok(true)
    );
    assert_eq!(
        transport
            .renew(
                "n2",
                Renewal {
                    bucket: (mine).into(),
                    lease: u64::MAX,
                    ttl: TTL,
                    now,
                    fenced: false
                }
            )
            .await,
        Ok(false)
    );
    // A release frees a place.
    transport.release("n2", mine, first).await.unwrap();
    until_in_use(&callee.pool, mine, 1).await;
    assert!(matches!(
        transport.acquire("n2", request(mine, 2)).await,
        Ok(Grant::Granted { .. })
    ));
    // An adopted lease counts against the limit.
    let expires_at = weir::clock::after(SystemClock::new().now(), TTL);
    transport
        .adopt(
            "n2",
            Adoption {
                bucket: (mine).into(),
                holder: ("n1").into(),
                expires_at,
                units: 1,
                lent: false,
            },
        )
        .await
        .expect("adopted");
    until_in_use(&callee.pool, mine, 3).await;
    assert_eq!(
        transport.acquire("n2", request(mine, 3)).await,
        Ok(Grant::Full)
    );
    assert_eq!(
        transport
            .adopt(
                "n2",
                Adoption {
                    bucket: (theirs).into(),
                    holder: ("n1").into(),
                    expires_at,
                    units: 1,
                    lent: false
                }
            )
            .await,
        Err(TransportError::NotOwner("n2".into())),
        "adopted only by the bucket's owner"
    );
    // A batch: one answer per request, in order.
    let answers = transport
        .acquire_batch(
            "n2",
            vec![request(mine, 4), request(mine, 4), request(theirs, 4)],
        )
        .await;
    assert!(
        matches!(answers[0], Ok(Grant::Granted { .. })),
        "{answers:?}"
    );
    assert_eq!(answers[1], Ok(Grant::Full));
    assert_eq!(answers[2], Err(TransportError::NotOwner("n2".into())));
    // A node nobody knows.
    assert_eq!(
        transport.acquire("n9", request(mine, 2)).await,
        Err(TransportError::Unreachable("n9".into()))
    );
    loans(transport, callee).await;
}

/// The id of a grant.
fn grant_id(answer: Result<Grant, TransportError>) -> u64 {
    match answer {
        Ok(Grant::Granted { id, .. }) => id,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A loan: several units in one lease, grown, renewed, given back in part, handed over whole.
async fn loans<T: Transport>(transport: &T, callee: &Callee) {
    let bucket = callee.mine_too.clone();
    let in_use = |expected| until_in_use(&callee.pool, &bucket, expected);
    in_use(0).await;
    let ask = |units| LeaseRequest {
        ask: Ask::borrow(units),
        ..request(&bucket, 40)
    };
    // A quarter of the 40 free at most: 10 of the 12 asked.
    let Ok(Grant::Granted {
        id, units, keep, ..
    }) = transport.acquire("n2", ask(12)).await
    else {
        panic!("a loan");
    };
    assert_eq!(
        (units, keep),
        (10, 7),
        "a quarter of 40, then of the 30 left"
    );
    in_use(10).await;
    // The holder's one loan grows in place: the same id, 30 free, 4 asked.
    let grown = transport.acquire("n2", ask(4)).await;
    assert!(
        matches!(grown, Ok(Grant::Granted { id: same, units: 4, .. }) if same == id),
        "{grown:?}"
    );
    in_use(14).await;
    // Renewed: nothing added.
    let renewed = transport.acquire("n2", ask(0)).await;
    assert!(
        matches!(renewed, Ok(Grant::Renewed { id: same, keep: 6, .. }) if same == id),
        "{renewed:?}"
    );
    // A plain lease beside it is a lease of its own.
    let plain = transport.acquire("n2", request(&bucket, 40)).await;
    assert!(
        matches!(plain, Ok(Grant::Granted { id: other, units: 1, .. }) if other != id),
        "{plain:?}"
    );
    in_use(15).await;
    let plain = grant_id(plain);
    // Handed to another owner while n2's own ring still names n2: it may still grant, so the
    // lease stays counted here until it expires.
    transport.moved_away("n2", &bucket, plain, 0).await.unwrap();
    in_use(15).await;
    transport.release("n2", &bucket, plain).await.unwrap();
    // Five units given back; the loan goes on with nine.
    transport.give_back("n2", &bucket, id, 5).await.unwrap();
    in_use(9).await;
    // A loan handed over with three of its units idle: those come back, the rest stays.
    transport.moved_away("n2", &bucket, id, 3).await.unwrap();
    in_use(6).await;
    // A loan handed over whole counts all its units, and is the holder's loan there.
    let expires_at = weir::clock::after(SystemClock::new().now(), TTL);
    transport.release("n2", &bucket, id).await.unwrap();
    in_use(0).await;
    let adopted = transport
        .adopt(
            "n2",
            Adoption {
                bucket: (&bucket).into(),
                holder: ("n1").into(),
                expires_at,
                units: 6,
                lent: true,
            },
        )
        .await
        .expect("adopted");
    in_use(6).await;
    let grown = transport.acquire("n2", ask(1)).await;
    assert!(
        matches!(grown, Ok(Grant::Granted { id: same, units: 1, .. }) if same == adopted),
        "{grown:?}"
    );
    transport.release("n2", &bucket, adopted).await.unwrap();
    in_use(0).await;
}

fn in_memory(callee: &Callee) -> InMemory {
    let network = InMemory::new();
    network.add("n2", Arc::clone(&callee.owner));
    network
}

/// Serves the callee over gRPC on loopback; a transport that knows its address.
async fn grpc(callee: &Callee) -> (GrpcTransport<SystemClock>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service =
        ClusterService::new(Arc::clone(&callee.owner), SystemClock::new()).into_server(None);
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    let transport = GrpcTransport::new(SystemClock::new());
    transport.set_addresses(HashMap::from([("n2".to_owned(), url)]));
    (transport, server)
}

#[tokio::test]
async fn in_memory_keeps_the_contract() {
    let callee = callee();
    contract(&in_memory(&callee), &callee).await;
}

#[tokio::test]
async fn batched_in_memory_keeps_the_contract() {
    let callee = callee();
    contract(&Batching::new(Arc::new(in_memory(&callee))), &callee).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_keeps_the_contract() {
    let callee = callee();
    let (transport, server) = grpc(&callee).await;
    contract(&transport, &callee).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_grpc_keeps_the_contract() {
    let callee = callee();
    let (transport, server) = grpc(&callee).await;
    contract(&Batching::new(Arc::new(transport)), &callee).await;
    server.abort();
}
