//! The front doors: one module per protocol, each over the one application core ([`App`]).
//!
//! The wire types themselves (gRPC messages, HTTP bodies) live in the `weir-api` crate, shared
//! with clients. A front door parses its protocol's requests into the core's inputs, calls the core, and
//! writes the core's answer back in its protocol's shape — nothing more: no check, decision or
//! change of state is made here, so every protocol behaves alike. A new protocol is a new file
//! here and a listener in `serve.rs`.
//!
//! | file | protocol |
//! |---|---|
//! | `http.rs` | the HTTP API (axum): JSON in and out |
//! | `grpc.rs` | the gRPC API (tonic): unary calls and the bidirectional acquire stream |
//! | `rls.rs` | Envoy's rate limit service (tonic), on the same gRPC listener |
//! | `ui.rs`, `ui/` | the live page at `/ui` (HTML over the HTTP API), on the HTTP listener |
//! | `resp/` | the Redis protocol (RESP2 and RESP3): the handshake, `CL.THROTTLE`, `WEIR.*` |
//!
//! [`App`]: crate::app::App

pub mod grpc;
pub mod http;
pub mod resp;
pub mod rls;
pub mod ui;
