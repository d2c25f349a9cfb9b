//! # weir-cluster
//!
//! Cluster mode: a cluster-wide concurrency ceiling of `node_limit × N + shared_limit` per
//! bucket, and cluster-wide rates. Each bucket's shared pool lives on one owner node, chosen by
//! a consistent-hash [`ring`]; the owner keeps the pool's leases in a [`pool`]. A cluster-scoped
//! rate policy's buckets have owners too, which decide every request ([`rates`]).
//!
//! The crate has two halves. The decision logic — [`ring`], [`pool`], [`owner`] (the ownership
//! fence), [`tenure`], [`census`] (a new owner asks instead of waiting), [`quorum`], [`loan`] (capacity lent to a node), [`admission`] (two
//! tiers, handoff) — does no I/O and reads
//! no clock of its own: time comes in as an argument or through a `Clock`, and it is tested on
//! a manual clock. The I/O shells around it are [`transport`] (the trait), [`in_memory`] (an in-memory
//! network), [`messages`] (what coordinators and owners say), [`grpc`] (the node-to-node protocol), [`batch`] (batching per owner),
//! [`membership`] (static, or gossip through chitchat; [`protocol`] the version a mixed cluster speaks) and [`secret`] (the proof and token
//! members carry); `weir serve` wires them together.

pub mod admission;
pub mod assignment;
pub mod batch;
pub mod census;
pub mod grpc;
pub mod in_memory;
pub mod loan;
pub mod membership;
pub mod messages;
pub mod owner;
pub mod pool;
pub mod protocol;
pub mod quorum;
pub mod rates;
pub mod ring;
pub mod secret;
pub mod tenure;
pub mod transport;
