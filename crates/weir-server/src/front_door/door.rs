//! What a protocol served beside Weir's own APIs gives the server, so that one line in
//! [`REGISTERED`](super::REGISTERED) is all it takes to be configured, guarded, started and
//! announced.
//!
//! A registered door has a name, and the name is everything outside its folder: its table in
//! the config (`[name]`), its listener's flag and variable (`--name ADDR`, `WEIR_NAME`), the
//! refusal to listen beyond loopback without a data token, and `name=ADDR` on the line a
//! starting node prints. Its table is read by the door itself, so the config knows only that
//! the table is there; the server binds the address the table names (an address in use stops
//! the start, named, before the door opens) and hands the door its listener.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::config::ServerSettings;
use crate::front_door::http::OtherRoutes;
use crate::tls::Tls;

/// A protocol the server starts by name.
pub trait FrontDoor: Sync {
    /// Its name: the config table `[name]`, the flag `--name`, and `name=ADDR` on the listening
    /// line. Lower case, as flags are.
    fn name(&self) -> &'static str;

    /// The variable its flag is read from too (`WEIR_NAME`).
    fn env(&self) -> &'static str;

    /// The flag's help: what listens there.
    fn listener_help(&self) -> &'static str;

    /// What anyone who reaches its listener could do, and how its clients give the data token
    /// that guards it beyond loopback.
    fn exposure(&self) -> Exposure;

    /// What is wrong with its table, each a sentence naming the setting (empty: nothing). An
    /// absent table reads as the empty one.
    fn problems(&self, table: &toml::Table) -> Vec<String>;

    /// Where its table says its listener is, if it has one.
    fn listen(&self, table: &toml::Table) -> Option<SocketAddr>;

    /// Opens it over `opening`: its routes on the HTTP port, its listener's task.
    fn open(&self, opening: Opening<'_>) -> anyhow::Result<Opened>;
}

/// What a door's listener lays open beyond loopback.
#[derive(Debug, Clone, Copy)]
pub struct Exposure {
    /// What anyone who reaches it could do ("could spend or reset any … bucket").
    pub exposes: &'static str,
    /// How its clients send the data token ("as `authorization: Bearer <token>` metadata").
    pub token_as: &'static str,
}

/// What a door is opened with.
pub struct Opening<'a> {
    /// The core it asks.
    pub app: &'a Arc<App>,
    /// Its table (empty when the config has none).
    pub table: &'a toml::Table,
    /// Its listener, bound where [`FrontDoor::listen`] said, if it said.
    pub listener: Option<TcpListener>,
    /// The server's settings: the bounds every listener keeps (header timeout, connections).
    pub server: &'a ServerSettings,
    /// The node's certificates, when it serves TLS.
    pub tls: Option<Arc<Tls>>,
}

/// What an opened door serves.
#[derive(Default)]
pub struct Opened {
    /// Its routes on the HTTP port, if it has any.
    pub routes: Option<OtherRoutes>,
    /// Its listener's task, until the drain, if it has a listener.
    pub task: Option<JoinHandle<()>>,
}
