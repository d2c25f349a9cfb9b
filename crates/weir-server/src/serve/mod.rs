//! `weir serve`: what a node starts, in order, and how it stops.
//!
//! [`serve`] reads as the list of what starts — the data dir's lock, the certificates, the
//! listeners, the cluster, the core, the protocols' front doors, the watchers — and then the
//! stop: not ready, handed over, drained, the kept buckets written. Each step is a function
//! below or the start of its own module; a protocol's is in its folder under `front_door/`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | `serve`: the starts in order and the graceful stop |
//! | `settings.rs` | the config with the command line's and the environment's overrides; the checks `weir check-config` shares |
//! | `grpc_listener.rs` | the gRPC listener: every service it carries, and grpc.health.v1 agreeing with `/readyz` |

mod grpc_listener;
mod settings;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use weir_cluster::secret::ClusterSecret;

use crate::app::{App, AppSettings};
use crate::cluster::ClusterMode;
use crate::config::{ConfigFile, ServerSettings};
use crate::connections::{self, HttpLimits};
use crate::termination::Termination;
use crate::tls::Tls;
use grpc_listener::GrpcHealth;
use weir::policy::Scope;

pub use settings::{Overrides, check_exposure, check_tls, load_config};

/// The longest a leaving node waits for its own ring to drop it and its buckets to be handed
/// over.
const STEP_DOWN_WITHIN: Duration = Duration::from_secs(3);
/// How long a leaving node goes on answering once its buckets are handed over, for the others'
/// rings to drop it too (a few gossip rounds).
const STEP_DOWN_SETTLE: Duration = Duration::from_millis(1000);

/// How often a cluster member advertises its config version and reads the others'.
const CONFIG_VERSION_EVERY: Duration = Duration::from_millis(500);

/// Runs a server until ctrl-c or SIGTERM; then stops accepting, answers waiting requests 503,
/// and returns. `source` is the config file `config` was read from, watched for changes to its
/// policies (see the `reload` module); `None` for the embedded default.
pub async fn serve(config: ConfigFile, source: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    check_exposure(&config)?;
    for (old, new) in &config.old_names {
        tracing::warn!(
            %old,
            %new,
            "the config names a setting by its old name: it is read as the new one; rename it"
        );
    }
    // Before the first bind: from the first accepted connection on, a stop signal drains.
    let mut termination = Termination::install()?;
    // SIGHUP too, for the same reason: its default action would end the process.
    let hangups = sighup()?;
    let server = &config.server;
    // The data dir is this process's for as long as it runs: a second node pointed at it
    // stops here, naming this one, before it binds anything.
    let _data_dir_lock = crate::durable::lock(
        &server.data_dir,
        &format!(
            "pid {}, node {}, http {}",
            std::process::id(),
            server.node_id,
            server.http
        ),
    )?;
    // Certificates: a missing or mismatched file stops the start, naming it, before anything
    // is bound.
    let tls = server
        .tls
        .clone()
        .map(Tls::load)
        .transpose()
        .context("loading the TLS certificates ([server.tls])")?
        .map(Arc::new);
    // Their own SIGHUP listeners beside the config's: all reload on one signal.
    let tls_hangups = tls.as_ref().map(|_| sighup()).transpose()?;
    let rls_hangups = config.rls.config.as_ref().map(|_| sighup()).transpose()?;
    let listeners = Listeners::bind(&config)?;
    let bound = listeners.bound;
    let cluster = join_cluster(server, tls.as_ref(), bound.grpc).await?;
    let app = start_core(&config, cluster.as_ref(), bound.grpc)?;
    let rls = crate::front_door::rls::start(&app, &config, rls_hangups).await?;
    // Bound before the other doors open: an address in use stops the start.
    let doors = crate::front_door::open_registered(&app, &config, tls.clone())?;
    let background = app.spawn_background(server.lease_sweep, server.report_interval);
    let keeping = app.spawn_keeping(server.durable_flush);

    // The front doors, each a task until the drain ends it.
    let health = GrpcHealth::start(cluster.as_ref(), rls.is_some()).await;
    let mut front_doors: Vec<JoinHandle<()>> = vec![
        crate::front_door::http::start(
            &app,
            listeners.http,
            http_limits(server),
            tls.clone(),
            // The registered doors' routes on the HTTP port.
            doors.routes,
        ),
        grpc_listener::start(
            &app,
            &config,
            listeners.grpc,
            &health,
            cluster.as_ref(),
            rls,
            tls.clone(),
        ),
    ];
    front_doors.extend(doors.tasks);
    front_doors.extend(listeners.resp.map(|listener| {
        crate::front_door::resp::start(&app, listener, server, &config.resp, tls.clone())
    }));

    crate::reload::watch(
        Arc::clone(&app),
        source.map(|path| (path, config.text.clone())),
        hangups,
    );
    if let (Some(tls), Some(hangups)) = (&tls, tls_hangups) {
        let app = Arc::clone(&app);
        crate::tls::watch(Arc::clone(tls), hangups, move |outcome| {
            app.metrics().count_tls_reload(outcome);
        });
    }
    app.health().set_ready(true);
    bound.announce(&app, &doors.listening);

    // Or, in cluster mode, until this member finds it must not run here (another cluster's
    // data dir): it never joined, so there is nothing to hand over.
    if let Some(why) = termination.recv_or_refused(cluster.as_deref()).await {
        app.health().set_ready(false);
        if let Some(cluster) = &cluster {
            cluster.stop().await;
        }
        anyhow::bail!(why);
    }
    tracing::info!(
        "shutting down: not ready; a cluster member hands over first, then no new connections, and waiting requests are answered 503"
    );
    app.health().set_ready(false);
    health.stop().await;
    // Handed over first, drained after: while this node still answers, its buckets move to
    // their next owners, and the others' rings follow (see the cluster's `leaving.rs`).
    if let Some(cluster) = &cluster {
        cluster.step_down(STEP_DOWN_WITHIN, STEP_DOWN_SETTLE).await;
    }
    app.health().begin_shutdown();
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        for front_door in front_doors.drain(..) {
            let _ = front_door.await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("connections still open after 10 s; closing them");
    }
    background.abort();
    // After the last request: the kept buckets as they are now, so a graceful restart loses
    // none of them.
    if let Some(keeping) = keeping {
        keeping.abort();
        let _ = keeping.await;
    }
    app.keep_buckets_at_stop().await;
    if let Some(cluster) = &cluster {
        cluster.stop().await;
    }
    // Every acknowledged policy change was written before it was acknowledged, and the kept
    // buckets just now; nothing else is kept across restarts (leases are not: their holders'
    // permits are this process's).
    tracing::info!("drained");
    Ok(())
}

/// A SIGHUP listener of its own (each watcher takes one; all are told of one signal).
fn sighup() -> anyhow::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("listening for SIGHUP")
}

/// The listeners, bound before anything is served: a port in use stops the start, named.
struct Listeners {
    http: TcpListener,
    grpc: TcpListener,
    resp: Option<TcpListener>,
    bound: Bound,
}

/// The addresses the listeners were bound to (port 0 becomes a port).
#[derive(Debug, Clone, Copy)]
struct Bound {
    http: SocketAddr,
    grpc: SocketAddr,
    resp: Option<SocketAddr>,
}

impl Listeners {
    fn bind(config: &ConfigFile) -> anyhow::Result<Self> {
        let server = &config.server;
        let http = connections::bind(server.http, server.listen_backlog)
            .with_context(|| format!("binding the HTTP address {}", server.http))?;
        let grpc = connections::bind(server.grpc, server.listen_backlog)
            .with_context(|| format!("binding the gRPC address {}", server.grpc))?;
        let resp = config
            .resp
            .listen
            .map(|addr| {
                connections::bind(addr, server.listen_backlog)
                    .with_context(|| format!("binding the Redis-protocol address {addr}"))
            })
            .transpose()?;
        Ok(Self {
            bound: Bound {
                http: http.local_addr()?,
                grpc: grpc.local_addr()?,
                resp: resp.as_ref().map(TcpListener::local_addr).transpose()?,
            },
            http,
            grpc,
            resp,
        })
    }
}

impl Bound {
    /// Logs that the node serves, and prints the line a supervisor (or a test) reads to learn
    /// the bound ports.
    /// `doors`: where the registered doors' listeners are, by door.
    fn announce(&self, app: &App, doors: &[(&'static str, SocketAddr)]) {
        let (http, grpc) = (self.http, self.grpc);
        tracing::info!(
            node = %app.node_id(),
            %http,
            %grpc,
            resp = ?self.resp,
            ?doors,
            policies = app.policies().policies().len(),
            "weir is serving"
        );
        let mut line = format!("listening http={http} grpc={grpc}");
        if let Some(resp) = self.resp {
            line.push_str(&format!(" resp={resp}"));
        }
        for (door, addr) in doors {
            line.push_str(&format!(" {door}={addr}"));
        }
        println!("{line}");
    }
}

/// Joins the cluster when `[server] gossip` is set: this member's gRPC address (over TLS when
/// the node has certificates) is where the others reach it.
async fn join_cluster(
    server: &ServerSettings,
    tls: Option<&Arc<Tls>>,
    grpc_addr: SocketAddr,
) -> anyhow::Result<Option<Arc<ClusterMode>>> {
    let Some(gossip) = server.gossip else {
        return Ok(None);
    };
    let peer_connector = tls.map(|tls| tls.peer_connector()).transpose()?;
    let cluster = ClusterMode::start(
        &server.data_dir,
        &server.node_id,
        &server.cluster_id,
        gossip,
        server.join.clone(),
        match tls {
            Some(_) => format!("https://{grpc_addr}"),
            None => format!("http://{grpc_addr}"),
        },
        server
            .cluster_secret
            .as_deref()
            .map(ClusterSecret::new)
            .transpose()?,
        peer_connector,
    )
    .await
    .with_context(|| format!("joining the cluster (gossip on {gossip})"))?;
    cluster
        .policy_log()
        .forget_unseen_after(Some(server.forget_after).filter(|after| !after.is_zero()));
    tokio::spawn(Arc::clone(&cluster).follow());
    tokio::spawn(Arc::clone(&cluster).report_joining());
    Ok(Some(cluster))
}

/// The core over the config's policies, and the tasks that keep it in step with the cluster.
fn start_core(
    config: &ConfigFile,
    cluster: Option<&Arc<ClusterMode>>,
    grpc_addr: SocketAddr,
) -> anyhow::Result<Arc<App>> {
    let server = &config.server;
    let app = App::new(AppSettings {
        node_id: server.node_id.clone(),
        grpc: grpc_addr,
        policies: config.policy.clone(),
        data_dir: server.data_dir.clone(),
        access: crate::app::Access {
            admin_token: server.admin_token.clone(),
            data_token: server.data_token.clone(),
            allowed_hosts: server.allowed_hosts.clone(),
        },
        max_cost: server.max_cost,
        body_timeout: server.body_timeout,
        cluster: cluster.cloned(),
        cell_max_keys: config.resp.max_keys,
        durable_after: Some(server.durable_after),
        redis: config.redis.clone(),
    })?;
    if cluster.is_none() {
        for policy in config.policy.iter().filter(|p| p.scope == Scope::Cluster) {
            tracing::warn!(
                policy = %policy.name,
                "scope = \"cluster\" without cluster mode: this node alone decides every bucket of the policy"
            );
        }
    }
    // The members compare the policies they run (`/v1/cluster`'s `config_differs`).
    tokio::spawn(Arc::clone(&app).share_config_version(CONFIG_VERSION_EVERY));
    tokio::spawn(Arc::clone(app.policy_admin()).follow_cluster_policies());
    tokio::spawn(Arc::clone(app.decider()).keep_assignments());
    Ok(app)
}

/// How the HTTP listener bounds its clients, from `[server]`.
fn http_limits(server: &ServerSettings) -> HttpLimits {
    HttpLimits {
        header_timeout: server.header_timeout,
        max_connections: server.max_connections,
    }
}
