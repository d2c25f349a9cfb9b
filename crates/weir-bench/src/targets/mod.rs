//! What a run measures: one trait, and a file per kind of target.
//!
//! A target is one client's connection (or handle) to a server. The client loops in
//! [`run`](crate::run) only ever call [`Target::acquire`] and [`Target::release`]; everything a
//! protocol needs (a stream to open, a lease id to carry, a script to run) stays in its file.
//! A new target is a new file here implementing the trait, a [`TargetSpec`](crate::run::TargetSpec)
//! variant, one line in `run::run` and its entry in [`TARGETS`] (the names `--target` takes).
//!
//! | file | target |
//! |---|---|
//! | `in_process.rs` | the library in this process, on a config's policies |
//! | `http.rs` | a server's HTTP API |
//! | `grpc.rs` | a server's gRPC API, unary calls |
//! | `grpc_stream.rs` | a server's gRPC API, one bidirectional stream per client |
//! | `redis.rs` | the Redis baseline: a Lua script enforcing the policy's limiter |
//! | `resp.rs` | the Redis protocol: `WEIR.ACQUIRE`, `CL.THROTTLE` (Weir or redis-cell), or redis-cell's decision in Lua |
//! | `rls.rs` | Envoy's rate limit service (`ShouldRateLimit`), and the reference server's Redis data path |
//! | `round_robin.rs` | several servers of one kind, asked in turn |
//! | `registry.rs` | every target by its `--target` name, built from the command line's options |

mod grpc;
mod grpc_stream;
mod http;
mod in_process;
mod redis;
mod registry;
mod resp;
mod rls;
mod round_robin;

use std::future::Future;

use weir_api::http::AcquireBody;

pub use grpc::Grpc;
pub use grpc_stream::GrpcStream;
pub use http::Http;
pub use in_process::InProcess;
pub use registry::{NamedTarget, TARGETS, TargetOptions, spec};
pub use resp::{CellShape, Resp, RespCommand};
pub use rls::{RedisFixedWindow, Rls, RlsLoad};
pub use round_robin::RoundRobin;

use crate::report::RequestOutcome;

/// An answer: how the request ended and, if it holds one, the lease to give back; or an error
/// that is not a limiter's refusal, with its message.
pub type Answer = Result<(RequestOutcome, Option<String>), String>;

/// One client's way to a server.
///
/// A clone is what a held lease's release task takes: it must be able to give the lease back
/// on its own (a stream-based target's clone releases over unary calls).
pub trait Target: Clone + Send + Sync + 'static {
    /// Asks once.
    fn acquire(&mut self, request: AcquireBody) -> impl Future<Output = Answer> + Send;

    /// Gives a lease back (best effort: one that is not given back expires by its TTL).
    fn release(&mut self, lease: String) -> impl Future<Output = ()> + Send;

    /// This target as client number `client` uses it (a round robin starts at a server of its
    /// own, so that clients spread from their first request).
    fn for_client(self, client: usize) -> Self {
        let _ = client;
        self
    }
}
