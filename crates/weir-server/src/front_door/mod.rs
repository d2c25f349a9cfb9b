//! The front doors: one module per protocol, each over the one application core ([`App`]).
//!
//! A protocol lives in one place: its file or folder here holds its wire code, its config and
//! its metrics; what it asks decided is an `App` method in `app/<topic>.rs`. A front door parses
//! its protocol's requests into the core's inputs, calls the core, and writes the core's answer
//! back in its protocol's shape — nothing more: no check, decision or change of state is made
//! here, so every protocol behaves alike. The wire types of Weir's own API (gRPC messages, HTTP
//! bodies) live in the `weir-api` crate, shared with clients.
//!
//! | here | protocol | decided in |
//! |---|---|---|
//! | `http.rs` | the HTTP API (axum): JSON in and out | `app/admission.rs`, `leasing.rs`, `policy_admin.rs`, `stats.rs`, `throttles.rs` |
//! | `grpc.rs` | the gRPC API (tonic): unary calls and the bidirectional acquire stream | the same |
//! | `rls/` | Envoy's rate limit service (tonic), on the gRPC listener; its YAML rules | `app/rls/` |
//! | `rlqs/` | Envoy's rate limit quota service (tonic), on the gRPC listener; `[rlqs]` | `app/quota.rs` |
//! | `resp/` | the Redis protocol (RESP2 and RESP3): the handshake, `CL.THROTTLE`, `WEIR.*` | `app/cells.rs`, `app/admission.rs` |
//! | `ui.rs`, `ui/` | the live page at `/ui` (HTML over the HTTP API), on the HTTP listener | — |
//!
//! A new protocol is a file or folder here, its decisions as `App` methods, and a listener in
//! `serve.rs`.
//!
//! [`App`]: crate::app::App

pub mod grpc;
pub mod http;
pub mod resp;
pub mod rlqs;
pub mod rls;
