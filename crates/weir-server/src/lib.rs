//! # weir-server
//!
//! The server's library: everything a service written in any language needs to use
//! Weir over the network — an HTTP API (axum), a gRPC API (tonic) and the Redis protocol over
//! the same operations,
//! policies changed live and kept durably in a data dir, Prometheus metrics, and "who is
//! throttled" (`weir top`).
//!
//! - [`config`]: the TOML config and its embedded default;
//! - [`app`]: the application core, the operations whatever the protocol;
//! - [`front_door`]: a module per protocol over it (HTTP, gRPC, the Redis protocol);
//! - [`cells`]: redis-cell's `CL.THROTTLE`, over keys clients name as they go;
//! - [`durable`]: API changes kept across restarts and crashes;
//! - [`leases`]: concurrency admissions held until released or expired;
//! - [`cluster`]: cluster mode (gossip, the owner service, two-tier admission);
//! - [`rls`]: Envoy's rate limit service, its YAML rules counted by Weir policies;
//! - [`metrics`]: the `/metrics` exposition;
//! - [`serve`]: bring-up, background tasks and graceful shutdown;
//! - [`reload`]: the config file's policies re-applied live when it changes, or on SIGHUP;
//! - [`tls`]: TLS on every listener and between nodes, certificates reloaded live;
//! - [`traces`]: optional OpenTelemetry traces of admissions and calls between nodes;
//! - [`top`], [`client`]: the `weir top` and `weir config` commands.
//!
//! The `weir` binary itself is the `weir-cli` crate; `weir bench` is the `weir-bench` crate.

pub mod app;
pub mod cells;
pub mod client;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod durable;
pub mod error;
pub mod front_door;
pub mod leases;
pub mod metrics;
pub mod reload;
pub mod rls;
pub mod serve;
pub mod tls;
pub mod top;
pub mod traces;

/// The gRPC types and services (from the `weir-api` crate).
pub use weir_api::grpc as proto;
