//! Gubernator's v1 API: its gRPC service `pb.gubernator.V1` on a listener of its own, and its
//! HTTP gateway's routes on Weir's HTTP port, for clients written against Gubernator.
//!
//! Each request's `name` and `unique_key` name a bucket, made by the first request that names
//! it, with the algorithm, limit, duration and burst that request sends (and reshaped when a
//! later one sends others, as Gubernator does). The answers are Gubernator's, case for case:
//! its functional tests, translated, are this folder's tests. `docs/gubernator.md` is the
//! migration guide and lists where Weir answers otherwise.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the door's state, [`DOOR`]: the door as the server registers it |
//! | `settings.rs` | [`GubernatorTable`], `[gubernator]` |
//! | `wire.rs` | the v1 messages, field for field |
//! | `service.rs` | the gRPC service, routed by method |
//! | `gateway.rs` | the HTTP gateway's routes and JSON |
//! | `hit.rs` | a request and an answer in Weir's words |
//! | `token_bucket.rs` | `TOKEN_BUCKET` |
//! | `leaky_bucket.rs` | `LEAKY_BUCKET` |
//! | `gregorian.rs` | `DURATION_IS_GREGORIAN`'s calendar ends |
//! | `buckets.rs` | the table of buckets, one per name and key |
//! | `metrics.rs` | its counters on `/metrics` |

mod buckets;
mod gateway;
mod gregorian;
mod hit;
mod leaky_bucket;
mod metrics;
mod service;
mod settings;
mod token_bucket;
pub mod wire;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use crate::app::App;
use crate::front_door::door::{Exposure, FrontDoor, Opened, Opening};
use crate::tls::Tls;
use buckets::Buckets;
pub use service::V1Server;
pub use settings::GubernatorTable;
use wire::{GetRateLimitsReq, GetRateLimitsResp, HealthCheckResp, PeerHealthResp};

/// The most requests one `GetRateLimits` may carry, as Gubernator's.
pub const MAX_BATCH: usize = 1000;

/// What `HealthCheck` says of a node that serves.
const HEALTHY: &str = "healthy";

/// Gubernator's API on this node: its buckets, and what its health check reports.
#[derive(Debug)]
pub struct Gubernator {
    app: Arc<App>,
    buckets: Buckets,
    /// The gRPC service's address, once bound (what `HealthCheck` advertises).
    advertised: OnceLock<SocketAddr>,
}

impl Gubernator {
    /// The door over `app`, with `settings`' bounds; its counters registered on `/metrics`.
    pub fn new(app: &Arc<App>, settings: &GubernatorTable) -> Arc<Self> {
        let door = Arc::new(Gubernator {
            app: Arc::clone(app),
            buckets: Buckets::new(settings.max_keys),
            advertised: OnceLock::new(),
        });
        app.metrics()
            .register_collector(Box::new(metrics::GubernatorCollector::new(Arc::clone(
                &door,
            ))));
        door
    }

    /// Answers a batch: one response per request, in order; past [`MAX_BATCH`], none.
    pub fn get_rate_limits(
        &self,
        batch: &GetRateLimitsReq,
    ) -> Result<GetRateLimitsResp, tonic::Status> {
        if batch.requests.len() > MAX_BATCH {
            return Err(tonic::Status::out_of_range(format!(
                "Requests.RateLimits list too large; max size is '{MAX_BATCH}'"
            )));
        }
        let now = epoch_millis();
        Ok(GetRateLimitsResp {
            responses: batch
                .requests
                .iter()
                .map(|request| self.buckets.answer(request, now))
                .collect(),
        })
    }

    /// This node as Gubernator's health check shows it: healthy while it is ready, one peer
    /// (itself: its buckets are its own).
    pub fn health_check(&self) -> HealthCheckResp {
        let address = self
            .advertised
            .get()
            .map(ToString::to_string)
            .unwrap_or_default();
        let (status, message) = if self.app.health().is_ready() {
            (HEALTHY, String::new())
        } else {
            (
                "unhealthy",
                "this node is not ready (starting or shutting down)".to_owned(),
            )
        };
        HealthCheckResp {
            status: status.to_owned(),
            message,
            peer_count: 1,
            advertise_address: address.clone(),
            local_peers: vec![PeerHealthResp {
                grpc_address: address,
                data_center: String::new(),
            }],
            region_peers: Vec::new(),
        }
    }
}

/// The server's clock in epoch milliseconds: what a request without `created_at` is counted at.
fn epoch_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// The door, as the server's list of registered doors names it.
pub static DOOR: GubernatorDoor = GubernatorDoor;

/// Gubernator's API as a registered front door: `[gubernator]`, `--gubernator`, its gateway on
/// the HTTP port whether or not its gRPC service listens.
#[derive(Debug)]
pub struct GubernatorDoor;

impl FrontDoor for GubernatorDoor {
    fn name(&self) -> &'static str {
        "gubernator"
    }

    fn env(&self) -> &'static str {
        "WEIR_GUBERNATOR"
    }

    fn listener_help(&self) -> &'static str {
        "Gubernator's v1 API over gRPC (`pb.gubernator.V1`); its HTTP gateway is on the HTTP port"
    }

    fn exposure(&self) -> Exposure {
        Exposure {
            exposes: "could spend or reset any Gubernator bucket (GetRateLimits)",
            token_as: " (clients send it as `authorization: Bearer <token>` metadata)",
        }
    }

    fn problems(&self, table: &toml::Table) -> Vec<String> {
        match GubernatorTable::read(table) {
            Ok(_) => Vec::new(),
            Err(problem) => vec![problem],
        }
    }

    fn listen(&self, table: &toml::Table) -> Option<SocketAddr> {
        GubernatorTable::read(table).ok()?.listen
    }

    fn open(&self, opening: Opening<'_>) -> anyhow::Result<Opened> {
        let settings = GubernatorTable::read(opening.table).map_err(anyhow::Error::msg)?;
        let door = Gubernator::new(opening.app, &settings);
        let task = match opening.listener {
            Some(listener) => Some(serve(&door, listener, opening.server, opening.tls)?),
            None => None,
        };
        Ok(Opened {
            routes: Some(gateway::routes(door)),
            task,
        })
    }
}

/// Serves the gRPC service on `listener` until the drain.
fn serve(
    door: &Arc<Gubernator>,
    listener: tokio::net::TcpListener,
    server: &crate::config::ServerSettings,
    tls: Option<Arc<Tls>>,
) -> anyhow::Result<JoinHandle<()>> {
    let bound = listener.local_addr()?;
    let _ = door.advertised.set(bound);
    tracing::info!(%bound, "Gubernator's v1 API is served");
    let app = Arc::clone(&door.app);
    let router = crate::connections::grpc_server().add_service(V1Server::new(Arc::clone(door)));
    let bounds = (server.header_timeout, server.max_connections);
    let shutting_down = move || {
        let app = Arc::clone(&app);
        async move { app.health().shutting_down().await }
    };
    Ok(tokio::spawn(async move {
        crate::connections::serve_grpc(
            router,
            listener,
            tls,
            bounds,
            shutting_down,
            "Gubernator's gRPC listener",
        )
        .await;
    }))
}
