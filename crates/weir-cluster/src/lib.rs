//! # weir-cluster
//!
//! Cluster mode's decision logic (seed 000): a cluster-wide concurrency ceiling of
//! `node_limit × N + shared_limit` per bucket. Each bucket's shared pool lives on one owner node,
//! chosen by a consistent-hash [`ring`]; the owner keeps the pool's leases in a [`pool`].
//! The decision logic (ring, pool, owner fence and tenure, two-tier admission) does no I/O and reads no
//! clock of its own: time comes in as an argument or through a `Clock`. The shells around it
//! are [`transport`] (in-memory, and [`grpc`]), [`batch`] (batching per owner) and
//! [`membership`] (static, and gossip through chitchat; members prove they know the cluster's
//! [`secret`]); `weir serve` wires them together.

pub mod admission;
pub mod batch;
pub mod grpc;
pub mod membership;
pub mod owner;
pub mod pool;
pub mod quorum;
pub mod ring;
pub mod secret;
pub mod tenure;
pub mod transport;
