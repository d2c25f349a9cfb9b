//! # weir-server
//!
//! The server's library: everything a service written in any language needs to use
//! Weir over the network — an HTTP API (axum), a gRPC API (tonic), Envoy's rate limit service
//! and the Redis protocol over the same operations, policies changed live and kept durably in
//! a data dir, Prometheus metrics, cluster mode, and "who is throttled" (`weir top`).
//!
//! Its public surface is a facade: what the `weir` binary (the `weir-cli` crate), `weir bench`
//! (the `weir-bench` crate) and the integration tests use — loading and checking a config
//! ([`load_config`], [`check_exposure`], [`check_tls`]), running a node ([`serve`]), `weir top`
//! and `weir config` ([`top`], [`Client`]), an in-process [`App`] for the bench, and the RLS
//! rules ([`rls`]). Inside, the modules are:
//!
//! - `config`: the TOML config and its embedded default;
//! - `app`: the application core, a facade over the node's state that names no protocol;
//! - `decide`: one way a bucket is decided — here, by the cluster's owner, or in Redis —
//!   whichever protocol asks;
//! - `front_door`: a folder per protocol over them — its wire code, config and metrics;
//! - `durable`: API changes kept across restarts and crashes;
//! - `bucket_file`: the file slowly refilling buckets are kept in across restarts;
//! - `data_file`: opening the data dir's redb files, a damaged one refused by name;
//! - `leases`: concurrency admissions held until released or expired;
//! - `redis_buckets`: buckets kept in Redis (`scope = "redis"`), for stateless nodes;
//! - `cluster`: cluster mode (gossip, the owner service, two-tier admission);
//! - `metrics`: the `/metrics` exposition;
//! - `serve`: what a node starts, in order, and its graceful stop; `termination`: the stop signals;
//! - `reload`, `watch`: the config file's policies re-applied live when it changes, or on SIGHUP;
//! - `tls`: TLS on every listener and between nodes, certificates reloaded live;
//! - `traces`: optional OpenTelemetry traces of admissions and calls between nodes;
//! - `log_gate`: lines an outsider or a lasting fault could repeat, logged once a minute a kind;
//! - `top`, `client`: the `weir top` and `weir config` commands;
//! - `reserved`, `etag`, `suggest`: names the protocols keep, policies' entity tags, "did you mean".
//!
//! `docs/architecture.md` maps every file (`weir-cli`'s `tests/map.rs` holds it to the tree).

mod app;
mod bucket_file;
mod client;
mod cluster;
mod config;
mod connections;
mod data_file;
mod decide;
mod durable;
mod error;
mod etag;
mod front_door;
mod leases;
mod listen_address;
mod log_gate;
mod metrics;
mod policy_log;
mod redis_buckets;
mod reload;
mod reserved;
mod serve;
mod suggest;
mod termination;
mod tls;
mod top;
mod traces;
mod watch;

// The facade: what the `weir` binary, `weir bench` and the integration tests use.
pub use app::{AcquireInput, AcquireOutcome, AdmissionTier, App, AppSettings};
pub use client::{Client, ClientTls};
pub use cluster::PROTOCOL as CLUSTER_PROTOCOL;

/// The Weir release this build is (its package version): what `/v1/cluster` shows each member
/// running, and what `CHANGELOG.md` lists.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");
pub use config::{ConfigFile, DEFAULT_CONFIG, listen_address};
pub use front_door::DoorListeners;
pub use front_door::grpc::MAX_PENDING_PER_STREAM;
pub use log_gate::ForeignLines;
pub use serve::{Overrides, check_exposure, check_tls, load_config, serve};
pub use top::{TopOptions, run as top};
pub use traces::Traces;

/// The gRPC types and services (from the `weir-api` crate).
pub use weir_api::grpc as proto;

/// Envoy's rate limit service as `check-config`, the bench and the tests reach it: the rules
/// read and compiled, the policies they count through, and the decision itself.
pub mod rls {
    pub use crate::front_door::rls::config::Limit;
    pub use crate::front_door::rls::rules::{Lookup, Tree};
    pub use crate::front_door::rls::{
        Code, CurrentLimit, Descriptor, RequestError, Rls, RlsSettings, RlsTable, RulesConfig,
        SameDomain, Unit, policies_of,
    };
}
