//! Shared acquire + release pairs when this node owns the bucket: the path with no hop.
//!
//! `cargo bench -p weir-cluster --bench local_owner -- [PAIRS]`
//!
//! One coordinator on a one-node ring, no node tier, so every admission is shared: a lease from
//! this node's own pool (`max_loan = 1`), or a unit of a loan from it (`max_loan = 16`); 100
//! buckets in turn. Prints nanoseconds per pair for five rounds of each, alternating.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::SystemClock;
use weir::policy::OnUnavailable;
use weir_cluster::admission::{TwoTier, TwoTierConfig};
use weir_cluster::in_memory::InMemory;
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};

fn main() {
    let pairs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("n1", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let node = |max_loan| {
            let owner = Arc::new(Owner::new(
                "n1",
                Arc::clone(&ring),
                Arc::new(SharedPool::new(1_000)),
            ));
            let config = TwoTierConfig {
                node_limit: 0,
                shared_limit: 1_000_000,
                lease_ttl: Duration::from_secs(30),
                on_unavailable: OnUnavailable::Open,
                acquire_timeout: Duration::from_secs(1),
                max_keys: 1_000,
                max_loan,
                learning_period: Duration::ZERO,
            };
            TwoTier::new(
                "n1",
                config,
                Arc::clone(&ring),
                Arc::new(InMemory::new()),
                owner,
                SystemClock::new(),
            )
        };
        let nodes = [(1, node(1)), (16, node(16))];
        let buckets: Vec<String> = (0..100).map(|i| format!("bucket-{i:03}")).collect();
        for round in 1..=5 {
            for (max_loan, node) in &nodes {
                let start = Instant::now();
                for i in 0..pairs {
                    let admission = node.acquire(&buckets[i % buckets.len()]).await.unwrap();
                    node.release(admission).await;
                }
                let per_pair = start.elapsed().as_nanos() as f64 / pairs as f64;
                println!(
                    "round {round}, max_loan {max_loan}: {per_pair:.1} ns per acquire + release"
                );
            }
        }
    });
}
