//! # weir-cluster
//!
//! Cluster mode's decision logic (seed 000): a cluster-wide concurrency ceiling of
//! `node_limit × N + shared_limit` per bucket. Each bucket's shared pool lives on one owner node,
//! chosen by a consistent-hash [`ring`]; the owner keeps the pool's leases in a [`pool`].
//! Nothing here does I/O or reads a clock: time comes in as an argument.
//!
//! Status: the ring and the owner-side pool. Membership (gossip), the coordinator's two-tier
//! admission and the transports are still to come.

pub mod pool;
pub mod ring;
