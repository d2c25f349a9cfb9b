//! The front doors: one module per protocol, each over the one application core ([`App`]).
//!
//! A protocol lives in one place: its folder here holds its wire code, its settings, its
//! counters (registered on `/metrics` when it starts) and its start. A front door parses its
//! protocol's requests into the core's inputs, asks the one decision interface
//! ([`Decider`](crate::decide::Decider), through `App::decider()`) or the core's other
//! services, and writes the answer back in its protocol's shape — no check, decision or change
//! of state is made here, so every protocol behaves alike. The wire types of Weir's own API
//! (gRPC messages, HTTP bodies) live in the `weir-api` crate, shared with clients.
//!
//! | here | protocol |
//! |---|---|
//! | `http/` | the HTTP API (axum): JSON in and out; the live page at `/ui` |
//! | `grpc.rs` | the gRPC API (tonic): unary calls and the bidirectional acquire stream |
//! | `rls/` | Envoy's rate limit service (tonic), on the gRPC listener: its YAML rules, their live set and reloads |
//! | `rlqs/` | Envoy's rate limit quota service (tonic), on the gRPC listener; `[rlqs]` |
//! | `gubernator/` | Gubernator's v1 API: its gRPC service on a port of its own (`[gubernator]`), its HTTP gateway's routes on the HTTP port |
//! | `resp/` | the Redis protocol (RESP2 and RESP3): the handshake, `CL.THROTTLE`, `WEIR.*`, a file per command |
//!
//! A new protocol is a folder here with its `start`, and the line in `serve/mod.rs`'s list of
//! front doors that calls it (`docs/architecture.md`, "Where things go").
//!
//! [`App`]: crate::app::App

pub mod grpc;
pub mod gubernator;
pub mod http;
pub mod resp;
pub mod rlqs;
pub mod rls;
