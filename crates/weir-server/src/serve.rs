//! `weir serve`: bind, serve both APIs, run the background tasks, shut down gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use weir_cluster::rates::RateOwner;
use weir_cluster::secret::ClusterSecret;

use crate::app::{App, AppSettings};
use crate::cluster::ClusterMode;
use crate::config::{ConfigFile, DEFAULT_CONFIG, TlsSettings};
use crate::connections::{self, HttpLimits};
use crate::front_door::grpc::WeirService;
use crate::front_door::rlqs::RlqsService;
use crate::front_door::rls::RlsService;
use crate::proto::weir_server::WeirServer;
use crate::termination::Termination;
use crate::tls::Tls;
use weir::policy::Scope;
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Settings given on the command line; they override the config file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--http`.
    pub http: Option<SocketAddr>,
    /// `--grpc`.
    pub grpc: Option<SocketAddr>,
    /// `--resp`: the Redis-protocol listener.
    pub resp: Option<SocketAddr>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--node-id`.
    pub node_id: Option<String>,
    /// `--gossip`.
    pub gossip: Option<SocketAddr>,
    /// `--join` (repeatable).
    pub join: Vec<String>,
    /// `--rls-config`: the RLS rules (a YAML file or a directory of them).
    pub rls_config: Option<PathBuf>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--tls-client-ca`.
    pub tls_client_ca: Option<PathBuf>,
}

/// Loads the config (the file, or the embedded default) and applies the overrides,
/// `WEIR_ADMIN_TOKEN` and `WEIR_CLUSTER_SECRET`.
pub fn load_config(path: Option<&PathBuf>, overrides: &Overrides) -> anyhow::Result<ConfigFile> {
    let (text, origin) = match path {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the config file {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (DEFAULT_CONFIG.to_owned(), "the embedded default".to_owned()),
    };
    let mut config = ConfigFile::parse(&text).map_err(|problems| {
        let list: Vec<String> = problems.iter().map(|p| format!("  - {p}")).collect();
        anyhow::anyhow!("{origin} is not a valid config:\n{}", list.join("\n"))
    })?;
    let server = &mut config.server;
    if let Some(http) = overrides.http {
        server.http = http;
    }
    if let Some(grpc) = overrides.grpc {
        server.grpc = grpc;
    }
    if let Some(resp) = overrides.resp {
        server.resp = Some(resp);
    }
    if let Some(dir) = &overrides.data_dir {
        server.data_dir = dir.clone();
    }
    if let Some(id) = &overrides.node_id {
        server.node_id = id.clone();
    }
    if let Some(gossip) = overrides.gossip {
        server.gossip = Some(gossip);
    }
    if !overrides.join.is_empty() {
        server.join = overrides.join.clone();
    }
    if let Some(rules) = &overrides.rls_config {
        config.rls.config = Some(rules.clone());
    }
    let server = &mut config.server;
    match (&mut server.tls, &overrides.tls_cert, &overrides.tls_key) {
        (Some(tls), cert, key) => {
            if let Some(cert) = cert {
                tls.cert = cert.clone();
            }
            if let Some(key) = key {
                tls.key = key.clone();
            }
        }
        (None, Some(cert), Some(key)) => {
            server.tls = Some(TlsSettings {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: None,
                peer_ca: None,
                peer_name: None,
            });
        }
        (None, Some(_), None) | (None, None, Some(_)) => {
            anyhow::bail!("--tls-cert and --tls-key (WEIR_TLS_CERT, WEIR_TLS_KEY) go together")
        }
        (None, None, None) => {}
    }
    if let Some(ca) = &overrides.tls_client_ca {
        let Some(tls) = &mut server.tls else {
            anyhow::bail!(
                "--tls-client-ca (WEIR_TLS_CLIENT_CA) needs TLS: give --tls-cert and --tls-key too"
            );
        };
        tls.client_ca = Some(ca.clone());
    }
    if !server.join.is_empty() && server.gossip.is_none() {
        anyhow::bail!("--join needs --gossip ADDR: a node joins a cluster by gossiping");
    }
    if let Ok(token) = std::env::var("WEIR_ADMIN_TOKEN")
        && !token.trim().is_empty()
    {
        server.admin_token = Some(token);
    }
    if let Ok(token) = std::env::var("WEIR_DATA_TOKEN")
        && !token.trim().is_empty()
    {
        server.data_token = Some(token);
    }
    if let Ok(secret) = std::env::var("WEIR_CLUSTER_SECRET")
        && !secret.trim().is_empty()
    {
        server.cluster_secret = Some(secret);
    }
    if let Some(Err(error)) = server.cluster_secret.as_deref().map(ClusterSecret::new) {
        anyhow::bail!("cluster_secret (or WEIR_CLUSTER_SECRET): {error}");
    }
    // A token of blanks is no token: it would be compared as given, and guessed at once.
    for token in [&mut server.admin_token, &mut server.data_token] {
        if token.as_ref().is_some_and(|t| t.trim().is_empty()) {
            *token = None;
        }
    }
    Ok(config)
}

/// The longest a leaving node waits for its own ring to drop it and its buckets to be handed
/// over.
const STEP_DOWN_WITHIN: Duration = Duration::from_secs(3);
/// How long a leaving node goes on answering once its buckets are handed over, for the others'
/// rings to drop it too (a few gossip rounds).
const STEP_DOWN_SETTLE: Duration = Duration::from_millis(1000);

/// How often a cluster member advertises its config version and reads the others'.
const CONFIG_VERSION_EVERY: Duration = Duration::from_millis(500);

/// The fewest characters an admin token must have to guard an address beyond loopback.
const MIN_PUBLIC_TOKEN_CHARS: usize = 16;

/// Refuses an address beyond loopback without the credential that guards what it exposes, and
/// a cluster node beyond loopback without a cluster secret: the HTTP and gRPC ports need an
/// admin token of at least 16 characters (HTTP's admin calls change and delete policies), the
/// Redis port a data token as long (its clients spend any key's quota and take leases; it has
/// no admin commands). `weir serve` calls it before binding anything; `weir check-config` calls
/// it too, so a file that passes the check is one the server starts with.
pub fn check_exposure(config: &ConfigFile) -> anyhow::Result<()> {
    let chars = |token: &Option<String>| token.as_deref().map_or(0, |t| t.trim().chars().count());
    let admin_chars = chars(&config.server.admin_token);
    let data_chars = chars(&config.server.data_token);
    let listeners = [
        Some(("http", config.server.http)),
        Some(("grpc", config.server.grpc)),
        config.server.resp.map(|addr| ("resp", addr)),
    ];
    for (name, addr) in listeners.into_iter().flatten() {
        if addr.ip().is_loopback() {
            continue;
        }
        let (token, chars, exposes, setting) = match name {
            "resp" => (
                "a data token",
                data_chars,
                "could spend or inspect any key's quota (CL.THROTTLE, WEIR.ACQUIRE) and take and release leases; the Redis port has no admin commands",
                "`data_token` in [server] or WEIR_DATA_TOKEN (clients give it as their Redis password)",
            ),
            "http" => (
                "an admin token",
                admin_chars,
                "could change or delete policies (PUT and DELETE /v1/policies), besides acquiring",
                "`admin_token` in [server] or WEIR_ADMIN_TOKEN",
            ),
            _ => (
                "an admin token",
                admin_chars,
                "could acquire and release leases on any policy, and the HTTP port beside it would be open to policy changes",
                "`admin_token` in [server] or WEIR_ADMIN_TOKEN",
            ),
        };
        if chars == 0 {
            anyhow::bail!(
                "refusing to listen on {addr} (`{name}`) without {token}: anyone who can reach it {exposes}. Set {setting}, or listen on 127.0.0.1"
            );
        }
        if chars < MIN_PUBLIC_TOKEN_CHARS {
            anyhow::bail!(
                "refusing to listen on {addr} (`{name}`) with {token} of {chars} characters: beyond loopback it must have at least {MIN_PUBLIC_TOKEN_CHARS} (e.g. `openssl rand -hex 16`)"
            );
        }
    }
    // A cluster's gossip lets anyone who reaches it join the ring, and its node-to-node calls
    // (on the gRPC address) take and release shared leases: beyond loopback, only members
    // who know the secret may.
    if let Some(gossip) = config.server.gossip {
        let exposed = [("gossip", gossip), ("grpc", config.server.grpc)]
            .into_iter()
            .find(|(_, addr)| !addr.ip().is_loopback());
        if let (Some((name, addr)), None) = (exposed, &config.server.cluster_secret) {
            anyhow::bail!(
                "refusing to run a cluster node on {addr} (`{name}`) without a cluster secret: anyone who can reach it could join the ring or take shared leases. Set `cluster_secret` in [server] or WEIR_CLUSTER_SECRET (the same on every node, at least 16 characters), or keep `gossip` and `grpc` on 127.0.0.1"
            );
        }
    }
    Ok(())
}

/// Loads the TLS files `[server.tls]` names, as `weir serve` will; in cluster mode checks there
/// is a CA to verify other nodes by. `weir check-config` calls it, so that a file that passes
/// the check is one the server starts with.
pub fn check_tls(config: &ConfigFile) -> anyhow::Result<()> {
    let Some(settings) = &config.server.tls else {
        return Ok(());
    };
    let tls = Arc::new(Tls::load(settings.clone()).context("[server.tls]")?);
    if config.server.gossip.is_some() {
        tls.peer_connector()?;
    }
    Ok(())
}

/// Runs a server until ctrl-c or SIGTERM; then stops accepting, answers waiting requests 503,
/// and returns. `source` is the config file `config` was read from, watched for changes to its
/// policies (see the `reload` module); `None` for the embedded default.
pub async fn serve(config: ConfigFile, source: Option<PathBuf>) -> anyhow::Result<()> {
    check_exposure(&config)?;
    // Before the first bind: from the first accepted connection on, a stop signal drains.
    let mut termination = Termination::install()?;
    // SIGHUP too, for the same reason: its default action would end the process.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("listening for SIGHUP")?;
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
    let peer_connector = match (&tls, server.gossip) {
        (Some(tls), Some(_)) => Some(tls.peer_connector()?),
        _ => None,
    };
    // Its own SIGHUP listener beside the config's: both reload on one signal.
    let tls_hangups = tls
        .as_ref()
        .map(|_| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()))
        .transpose()
        .context("listening for SIGHUP")?;
    let rls_hangups = config
        .rls
        .config
        .as_ref()
        .map(|_| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()))
        .transpose()
        .context("listening for SIGHUP")?;
    let http_listener = connections::bind(server.http, server.listen_backlog)
        .with_context(|| format!("binding the HTTP address {}", server.http))?;
    let grpc_listener = connections::bind(server.grpc, server.listen_backlog)
        .with_context(|| format!("binding the gRPC address {}", server.grpc))?;
    let resp_listener = server
        .resp
        .map(|addr| {
            connections::bind(addr, server.listen_backlog)
                .with_context(|| format!("binding the Redis-protocol address {addr}"))
        })
        .transpose()?;
    let http_addr = http_listener.local_addr()?;
    let grpc_addr = grpc_listener.local_addr()?;
    let resp_addr = resp_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let cluster = match server.gossip {
        Some(gossip) => Some(
            ClusterMode::start(
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
            .with_context(|| format!("joining the cluster (gossip on {gossip})"))?,
        ),
        None => None,
    };
    if let Some(cluster) = &cluster {
        tokio::spawn(Arc::clone(cluster).follow());
        tokio::spawn(Arc::clone(cluster).report_joining());
    }
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
        cluster: cluster.clone(),
        cell_max_keys: server.resp_max_keys,
        durable_after: Some(server.durable_after),
        redis: config.redis.clone(),
    })?;
    let rls = crate::front_door::rls::start(&app, &config, rls_hangups).await?;

    if cluster.is_none() {
        for policy in config.policy.iter().filter(|p| p.scope == Scope::Cluster) {
            tracing::warn!(
                policy = %policy.name,
                "scope = \"cluster\" without cluster mode: this node alone decides every bucket of the policy"
            );
        }
    }
    let background = app.spawn_background(server.lease_sweep, server.report_interval);
    let keeping = app.spawn_keeping(server.durable_flush);
    // The members compare the policies they run (`/v1/cluster`'s `config_differs`).
    tokio::spawn(Arc::clone(&app).share_config_version(CONFIG_VERSION_EVERY));
    tokio::spawn(Arc::clone(&app).follow_cluster_policies());
    tokio::spawn(Arc::clone(app.decider()).keep_assignments());

    let http = {
        let app = Arc::clone(&app);
        let router = crate::front_door::http::router(Arc::clone(&app));
        let limits = HttpLimits {
            header_timeout: server.header_timeout,
            max_connections: server.max_connections,
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            connections::serve_http(http_listener, router, limits, tls, async move {
                app.shutting_down().await
            })
            .await
        })
    };
    // grpc.health.v1 as proxies and orchestrators probe it, agreeing with `/readyz`: the server
    // ("") and each service SERVING while this node serves — in cluster mode once it has
    // joined — and NOT_SERVING from the stop signal on.
    let (health, health_service) = tonic_health::server::health_reporter();
    let mut served = vec![
        <WeirServer<WeirService> as tonic::server::NamedService>::NAME,
        <RateLimitQuotaServiceServer<RlqsService> as tonic::server::NamedService>::NAME,
    ];
    if rls.is_some() {
        served.push(<RateLimitServiceServer<RlsService> as tonic::server::NamedService>::NAME);
    }
    let unjoined = cluster.as_ref().filter(|c| !c.has_joined());
    let status = match unjoined {
        Some(_) => tonic_health::ServingStatus::NotServing,
        None => tonic_health::ServingStatus::Serving,
    };
    for name in std::iter::once("").chain(served.iter().copied()) {
        health.set_service_status(name, status).await;
    }
    // Set after the statuses above, so that a join coming at once is not overwritten.
    let joining = unjoined.map(|cluster| {
        let cluster = Arc::clone(cluster);
        let health = health.clone();
        let served = served.clone();
        tokio::spawn(async move {
            cluster.joined().await;
            for name in std::iter::once("").chain(served) {
                health
                    .set_service_status(name, tonic_health::ServingStatus::Serving)
                    .await;
            }
        })
    });
    let grpc = {
        let app = Arc::clone(&app);
        let tls = tls.clone();
        let first_bytes_timeout = server.header_timeout;
        let max_pending = server.max_connections;
        let owner_service = cluster
            .as_ref()
            .map(|c| c.service(Arc::clone(app.decider()) as Arc<dyn RateOwner>));
        let policy_log_service = cluster.as_ref().map(|c| c.policy_log_service());
        // Offered only with rules: a proxy pointed at a node without them sees UNIMPLEMENTED
        // (an error it counts and reports), not a silent "OK" for everything.
        let rls_service =
            rls.map(|rules| RateLimitServiceServer::new(RlsService::new(Arc::clone(&app), rules)));
        // Always offered: a bucket id naming a `policy` and a `key` needs no rule.
        let rlqs_service = crate::front_door::rlqs::service(&app, config.rlqs.clone());
        tokio::spawn(async move {
            let router = tonic::transport::Server::builder()
                // A peer that stops answering pings is dropped, not kept for ever.
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(20)))
                .add_service(health_service)
                .add_service(WeirServer::new(WeirService::new(Arc::clone(&app))))
                .add_optional_service(owner_service)
                .add_optional_service(policy_log_service)
                .add_optional_service(rls_service)
                .add_service(rlqs_service);
            let shutdown = {
                let app = Arc::clone(&app);
                async move { app.shutting_down().await }
            };
            let incoming = connections::accept_grpc(
                grpc_listener,
                tls,
                first_bytes_timeout,
                max_pending,
                async move { app.shutting_down().await },
            );
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        })
    };
    let resp = resp_listener.map(|listener| {
        tokio::spawn(crate::front_door::resp::serve(
            listener,
            Arc::clone(&app),
            server.max_connections,
            crate::front_door::resp::ConnectionLimits {
                auth_timeout: server.header_timeout,
                command_timeout: server.header_timeout,
                idle_timeout: Some(server.resp_idle_timeout).filter(|t| !t.is_zero()),
            },
            tls.clone(),
        ))
    });
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
    app.set_ready(true);
    tracing::info!(
        node = %app.node_id(),
        http = %http_addr,
        grpc = %grpc_addr,
        resp = ?resp_addr,
        policies = app.policies().policies().len(),
        "weir is serving"
    );
    // A line a supervisor (or a test) can read to learn the bound ports.
    match resp_addr {
        Some(resp_addr) => println!("listening http={http_addr} grpc={grpc_addr} resp={resp_addr}"),
        None => println!("listening http={http_addr} grpc={grpc_addr}"),
    }

    // Or, in cluster mode, until this member finds it must not run here (another cluster's
    // data dir): it never joined, so there is nothing to hand over.
    if let Some(why) = termination.recv_or_refused(cluster.as_deref()).await {
        app.set_ready(false);
        if let Some(cluster) = &cluster {
            cluster.stop().await;
        }
        anyhow::bail!(why);
    }
    tracing::info!("shutting down: no new connections; waiting requests are answered 503");
    app.set_ready(false);
    // A join still awaited must not say SERVING after the drain has begun: stopped, and
    // waited for, in case it was writing SERVING on another thread.
    if let Some(joining) = joining {
        joining.abort();
        let _ = joining.await;
    }
    for name in std::iter::once("").chain(served) {
        health
            .set_service_status(name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    // Handed over first, drained after: while this node still answers, its buckets move to
    // their next owners, and the others' rings follow (see the cluster's `leaving.rs`).
    if let Some(cluster) = &cluster {
        cluster.step_down(STEP_DOWN_WITHIN, STEP_DOWN_SETTLE).await;
    }
    app.begin_shutdown();
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        let _ = http.await;
        let _ = grpc.await;
        if let Some(resp) = resp {
            let _ = resp.await;
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
