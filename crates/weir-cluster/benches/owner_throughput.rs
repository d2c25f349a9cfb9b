//! Shared acquire + release throughput against one owner over gRPC on loopback, one call per
//! request against batched per owner, in one run.
//!
//! `cargo bench -p weir-cluster --bench owner_throughput -- [SECONDS] [TASKS]`
//!
//! TASKS coordinator tasks each loop: acquire a shared lease (100 buckets in turn), release it.
//! Both sides share the machine's cores, as any loopback benchmark does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use weir::{Clock, SystemClock};
use weir_cluster::batch::Batching;
use weir_cluster::grpc::{ClusterService, GrpcTransport};
use weir_cluster::owner::Owner;
use weir_cluster::pool::{Grant, SharedPool};
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::transport::{LeaseRequest, Transport, TransportExt};

const BUCKETS: usize = 100;

async fn serve(pool: Arc<SharedPool>) -> String {
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("owner", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let owner = Arc::new(Owner::new("owner", ring, pool));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = ClusterService::new(owner, SystemClock::new()).into_server(None);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                // As `weir serve` does: no Nagle, or HTTP/2 frames wait for delayed ACKs.
                |accepted| accepted.inspect(|tcp| drop(tcp.set_nodelay(true))),
            ))
            .await;
    });
    url
}

/// Runs `tasks` loops of acquire + release for `seconds`; returns pairs per second.
async fn measure<T: Transport + 'static>(transport: Arc<T>, tasks: usize, seconds: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clock = SystemClock::new();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (transport, done, stop, clock) = (
            Arc::clone(&transport),
            Arc::clone(&done),
            Arc::clone(&stop),
            clock.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let bucket = format!("bucket-{}", i % BUCKETS);
                i += 1;
                let request = LeaseRequest::one(
                    &bucket,
                    u64::MAX,
                    "coordinator",
                    std::time::Duration::from_secs(30),
                    clock.now(),
                );
                if let Ok(Grant::Granted { id, .. }) = transport.acquire("owner", request).await {
                    let _ = transport.release("owner", &bucket, id).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let pairs = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        let _ = handle.await;
    }
    pairs as f64 / elapsed
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let tasks: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = Arc::new(SharedPool::new(10_000));
        let url = serve(Arc::clone(&pool)).await;
        let grpc = Arc::new(GrpcTransport::new(SystemClock::new()));
        grpc.set_addresses(HashMap::from([("owner".to_owned(), url)]));
        let batched = Arc::new(Batching::new(Arc::clone(&grpc)));
        println!("shared acquire + release against one owner, {tasks} tasks, {seconds}s each");
        for round in 1..=2 {
            let single = measure(Arc::clone(&grpc), tasks, seconds).await;
            let batch = measure(Arc::clone(&batched), tasks, seconds).await;
            println!(
                "round {round}: one call per request {single:>9.0} pairs/s, batched per owner {batch:>9.0} pairs/s ({:.2}×)",
                batch / single
            );
        }
        // Batched releases land on their own tasks; give them a moment, then check none leaked.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = SystemClock::new().now();
        let held: usize = (0..BUCKETS)
            .map(|b| pool.in_use(&format!("bucket-{b}"), now))
            .sum();
        println!("leases still held on the owner after the runs: {held}");
    });
}
