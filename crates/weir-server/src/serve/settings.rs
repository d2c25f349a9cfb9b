//! What `weir serve` starts from: the config file with the command line's and the
//! environment's overrides, and the checks `weir check-config` shares with it (an address
//! beyond loopback has its token, the certificates load).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use weir_cluster::secret::ClusterSecret;

use crate::config::{ConfigFile, DEFAULT_CONFIG, TlsSettings};
use crate::tls::Tls;

/// Settings given on the command line; they override the config file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--http`.
    pub http: Option<SocketAddr>,
    /// `--grpc`.
    pub grpc: Option<SocketAddr>,
    /// `--resp`: the Redis-protocol listener.
    pub resp: Option<SocketAddr>,
    /// The registered front doors' listeners (`--NAME ADDR`), by door.
    pub doors: crate::front_door::DoorListeners,
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
    if let Some(resp) = overrides.resp {
        config.resp.listen = Some(resp);
    }
    let server = &mut config.server;
    if let Some(http) = overrides.http {
        server.http = http;
    }
    if let Some(grpc) = overrides.grpc {
        server.grpc = grpc;
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
    for (door, addr) in &overrides.doors.0 {
        config.doors.set_listen(door, *addr);
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
    let data_token = (
        "a data token",
        data_chars,
        "`data_token` in [server] or WEIR_DATA_TOKEN",
    );
    let admin_token = (
        "an admin token",
        admin_chars,
        "`admin_token` in [server] or WEIR_ADMIN_TOKEN",
    );
    // Each listener: its name, its address, the token that guards it, what it lays open, and
    // how its clients give the token.
    let mut listeners = vec![
        (
            "http",
            config.server.http,
            admin_token,
            "could change or delete policies (PUT and DELETE /v1/policies), besides acquiring",
            "",
        ),
        (
            "grpc",
            config.server.grpc,
            admin_token,
            "could acquire and release leases on any policy, and the HTTP port beside it would be open to policy changes",
            "",
        ),
    ];
    listeners.extend(config.resp.listen.map(|addr| {
        (
            "resp",
            addr,
            data_token,
            "could spend or inspect any key's quota (CL.THROTTLE, WEIR.ACQUIRE) and take and release leases; the Redis port has no admin commands",
            " (clients give it as their Redis password)",
        )
    }));
    for (door, addr) in config.doors.listening() {
        let exposure = door.exposure();
        listeners.push((
            door.name(),
            addr,
            data_token,
            exposure.exposes,
            exposure.token_as,
        ));
    }
    for (name, addr, (token, chars, setting), exposes, given_as) in listeners {
        if addr.ip().is_loopback() {
            continue;
        }
        let setting = format!("{setting}{given_as}");
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

/// Loads the TLS files `[server.tls]` and `[redis.tls]` name, as `weir serve` will; in cluster
/// mode checks there is a CA to verify other nodes by. `weir check-config` calls it, so that a
/// file that passes the check is one the server starts with.
pub fn check_tls(config: &ConfigFile) -> anyhow::Result<()> {
    if let Some(redis) = &config.redis {
        crate::redis_buckets::RedisBuckets::new(redis.clone())?;
    }
    let Some(settings) = &config.server.tls else {
        return Ok(());
    };
    let tls = Arc::new(Tls::load(settings.clone()).context("[server.tls]")?);
    if config.server.gossip.is_some() {
        tls.peer_connector()?;
    }
    Ok(())
}
