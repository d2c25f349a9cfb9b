//! # weir-cluster
//!
//! Cluster mode's decision logic (seed 000): a cluster-wide concurrency ceiling of
//! `node_limit × N + shared_limit` per bucket. Each bucket's shared pool lives on one owner node,
//! chosen by a consistent-hash [`ring`]; the owner keeps the pool's leases in a [`pool`].
//! Nothing here does I/O or reads a clock: time comes in as an argument.
//!
//! Status: the ring, the owner-side pool, the coordinator's two-tier admission, the ownership
//! fence, lease handoff on ring changes, two transports (in-memory, gRPC) and membership
//! (static, and gossip through chitchat). Batching per owner and the wiring into `weir serve`
//! are still to come.

pub mod admission;
pub mod grpc;
pub mod membership;
pub mod owner;
pub mod pool;
pub mod ring;
pub mod transport;
