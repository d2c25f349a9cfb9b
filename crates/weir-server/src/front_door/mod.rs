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
//! | `gubernator/` | Gubernator's v1 API: its gRPC service on a port of its own (`[gubernator]`), its HTTP gateway's routes on the HTTP port; a registered door |
//! | `door.rs` | [`FrontDoor`]: what a registered door gives the server |
//! | `door_listeners.rs` | the registered doors' listener flags on `weir serve` |
//! | `resp/` | the Redis protocol (RESP2 and RESP3): the handshake, `CL.THROTTLE`, `WEIR.*`, a file per command |
//!
//! A new protocol is a folder here and one line: its name in [`registered_doors!`]'s list
//! below. Its folder holds a [`FrontDoor`] (`door.rs`), and the name does the rest: the config
//! reads its table (`[name]`), `weir serve` takes its flag (`--name ADDR`, [`DoorListeners`]),
//! the exposure check guards its listener, [`open_registered`] binds and opens it, and the
//! listening line names it (`docs/architecture.md`, "Where things go"). The doors that came
//! before (HTTP, gRPC, RLS, RLQS, the Redis protocol) are started by `serve/mod.rs` itself.
//!
//! [`App`]: crate::app::App

pub mod door;
mod door_listeners;
pub mod grpc;
pub mod http;
pub mod resp;
pub mod rlqs;
pub mod rls;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::config::ConfigFile;
use crate::tls::Tls;
pub use door::FrontDoor;
use door::Opening;
pub use door_listeners::DoorListeners;
use http::OtherRoutes;

/// Declares each registered door's module and lists its `DOOR` in [`REGISTERED`], so that a
/// door is named once.
macro_rules! registered_doors {
    ($($door:ident),* $(,)?) => {
        $(pub mod $door;)*
        /// The doors the server starts by name, each a protocol's one line outside its folder.
        pub static REGISTERED: &[&dyn FrontDoor] = &[$(&$door::DOOR),*];
    };
}

registered_doors![gubernator];

/// The registered door named `name`.
pub fn registered(name: &str) -> Option<&'static dyn FrontDoor> {
    REGISTERED.iter().copied().find(|door| door.name() == name)
}

/// The registered doors, opened.
pub struct OpenDoors {
    /// Their routes on the HTTP port.
    pub routes: OtherRoutes,
    /// Their listeners' tasks, each until the drain.
    pub tasks: Vec<JoinHandle<()>>,
    /// Where each listener was bound, by door.
    pub listening: Vec<(&'static str, SocketAddr)>,
}

/// Opens every registered door over `app`, each with its table in `config`: its listener bound
/// first, so that an address in use stops the start, named, before any door serves.
pub fn open_registered(
    app: &Arc<App>,
    config: &ConfigFile,
    tls: Option<Arc<Tls>>,
) -> anyhow::Result<OpenDoors> {
    let empty = toml::Table::new();
    let mut listeners = Vec::new();
    for door in REGISTERED {
        let table = config.doors.table(door.name()).unwrap_or(&empty);
        let listener = door
            .listen(table)
            .map(|addr| {
                crate::connections::bind(addr, config.server.listen_backlog)
                    .with_context(|| format!("binding `{}`'s address {addr}", door.name()))
            })
            .transpose()?;
        listeners.push((*door, table, listener));
    }
    let mut open = OpenDoors {
        routes: OtherRoutes::none(),
        tasks: Vec::new(),
        listening: Vec::new(),
    };
    for (door, table, listener) in listeners {
        if let Some(listener) = &listener {
            open.listening.push((door.name(), listener.local_addr()?));
        }
        let opened = door.open(Opening {
            app,
            table,
            listener,
            server: &config.server,
            tls: tls.clone(),
        })?;
        if let Some(routes) = opened.routes {
            open.routes = open.routes.merge(routes);
        }
        open.tasks.extend(opened.task);
    }
    Ok(open)
}
