//! The server's configuration: the `[server]` table, the `[[policy]]` list, the `[rls]`
//! table (Envoy's rate limit service) and the `[rlqs]` one (its rate limit quota service),
//! from TOML.
//!
//! `weir serve` with no `--config` runs on the embedded default (`default.toml`). Bootstrap
//! settings given as flags (addresses, node id, data dir) override the file. Policies changed
//! over the API are kept in the data dir and laid over the file's at start (see `durable`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use weir_cluster::secret::ClusterSecret;

use crate::front_door::resp::settings::{OldSettings, RespTable};
use crate::front_door::rlqs::buckets::RlqsTable;
use crate::front_door::rls::settings::RlsTable;
pub use crate::listen_address::listen_address;
use crate::listen_address::serde as listen_serde;

pub use door_tables::DoorTables;
use mistakes::every_mistake;
use serde::{Deserialize, Serialize};
use weir::policy::{PolicyConfig, PolicyError};

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// A whole config file. A table no field here names is a registered front door's, or a
/// mistake (`DoorTables` tells which, as `deny_unknown_fields` would).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConfigFile {
    /// Bootstrap settings.
    #[serde(default)]
    pub server: ServerSettings,
    /// The policies.
    #[serde(default)]
    pub policy: Vec<PolicyConfig>,
    /// Envoy's rate limit service.
    #[serde(default, skip_serializing_if = "RlsTable::is_default")]
    pub rls: RlsTable,
    /// `[rlqs]`: Envoy's rate limit quota service, its bucket ids mapped to policies.
    #[serde(default, skip_serializing_if = "RlqsTable::is_default")]
    pub rlqs: RlqsTable,
    /// `[resp]`: the Redis protocol.
    #[serde(default, skip_serializing_if = "RespTable::is_default")]
    pub resp: RespTable,
    /// `[redis]`: the Redis that `scope = "redis"` policies keep their buckets in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<crate::redis_buckets::RedisSettings>,
    /// The registered front doors' tables, each read by its door.
    #[serde(flatten)]
    pub doors: DoorTables,
    /// The text this was parsed from (what a reload compares the file with).
    #[serde(skip)]
    pub text: String,
    /// Settings read under an old name, as `(old, new)` (each `table.field`): what to tell
    /// whoever runs it.
    #[serde(skip)]
    pub old_names: Vec<(String, String)>,
}

/// The `[server]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// This node's name (default `local`).
    #[serde(default = "default_node_id")]
    pub node_id: String,
    /// The HTTP API's address (default `127.0.0.1:8080`); a host name is resolved at start.
    #[serde(default = "default_http", deserialize_with = "listen_serde::one")]
    pub http: SocketAddr,
    /// The gRPC API's address (default `127.0.0.1:50051`).
    #[serde(default = "default_grpc", deserialize_with = "listen_serde::one")]
    pub grpc: SocketAddr,
    /// `resp.listen`'s old name, read and moved there (never written back).
    #[serde(
        rename = "resp",
        default,
        skip_serializing,
        deserialize_with = "listen_serde::some"
    )]
    pub old_resp: Option<SocketAddr>,
    /// `resp.max_keys`'s old name, read and moved there.
    #[serde(rename = "resp_max_keys", default, skip_serializing)]
    pub old_resp_max_keys: Option<usize>,
    /// Where policy changes made over the API are kept (default `./weir-data`).
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// The bearer token admin calls must carry (also `WEIR_ADMIN_TOKEN`). Required when
    /// listening beyond loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// How often the "policy P was throttled" log line may be written (default 10 s).
    #[serde(default = "default_report_interval", with = "weir::duration::serde")]
    pub report_interval: Duration,
    /// How often expired leases are reclaimed (default 1 s).
    #[serde(default = "default_lease_sweep", with = "weir::duration::serde")]
    pub lease_sweep: Duration,
    /// Rate buckets whose shape takes longer than this to refill from empty (a day's quota, a
    /// `CL.THROTTLE`-style hour) are kept in the data dir and taken on again at start, so a
    /// restart does not give them afresh (default 1 min; `0s`: every rate bucket).
    #[serde(default = "default_durable_after", with = "weir::duration::serde")]
    pub durable_after: Duration,
    /// How often the kept buckets a decision changed are written (default 1 s): what a crash
    /// can lose. A graceful stop writes them after its last request.
    #[serde(default = "default_durable_flush", with = "weir::duration::serde")]
    pub durable_flush: Duration,
    /// The most one request may cost, for policies without their own `max_cost`
    /// (default 1 000 000).
    #[serde(default = "default_max_cost")]
    pub max_cost: u64,
    /// Cluster mode: the UDP address to gossip on. Absent: a single node.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "listen_serde::some"
    )]
    pub gossip: Option<SocketAddr>,
    /// Cluster mode: gossip addresses of nodes to join through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub join: Vec<String>,
    /// Cluster mode: a voter of the policy log unseen by gossip this long is forgotten by the
    /// leader (default 10 min; `0s`: never): it no longer counts in the majority, so members
    /// lost for good do not leave the cluster unable to change its policies. Never one gossip
    /// sees alive, nor one whose removal would leave the live voters short of a majority; a
    /// member forgotten that comes back is made a voter again.
    #[serde(default = "default_forget_after", with = "weir::duration::serde")]
    pub forget_after: Duration,
    /// Cluster mode: the cluster's name; nodes of other clusters are ignored (default `weir`).
    #[serde(default = "default_cluster_id")]
    pub cluster_id: String,
    /// Cluster mode: the secret every member shares (also `WEIR_CLUSTER_SECRET`), at least 16
    /// characters. Gossip datagrams are sealed with it and node-to-node calls carry a token
    /// derived from it. Required when the gossip or gRPC address is beyond loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_secret: Option<String>,
    /// HTTP: how long a client has to send a request's headers, counted from when the server
    /// starts waiting for them — so also how long an idle keep-alive connection and one that
    /// never sends are kept (default 30 s).
    #[serde(default = "default_header_timeout", with = "weir::duration::serde")]
    pub header_timeout: Duration,
    /// `resp.idle_timeout`'s old name, read and moved there.
    #[serde(
        rename = "resp_idle_timeout",
        default,
        skip_serializing,
        deserialize_with = "some_duration"
    )]
    pub old_resp_idle_timeout: Option<Duration>,
    /// The bearer token data-plane calls must carry (also `WEIR_DATA_TOKEN`): acquire, release,
    /// renew and busy over HTTP and gRPC, and the Redis protocol's password. Absent: the data
    /// plane is open to whoever reaches it. The admin token is accepted in its place over HTTP
    /// and gRPC; the Redis port takes this one only, so a service that throttles through Redis
    /// never holds the credential that rewrites policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_token: Option<String>,
    /// HTTP: host names (or `host:port`) besides loopback's that a server without an admin
    /// token accepts state-changing requests for. Such a server listens on loopback only, and
    /// a `Host` check is what keeps a web page from reaching it through a visitor's browser
    /// (DNS rebinding).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// HTTP: how long a request's body may take to arrive (default 30 s); past it, 408.
    #[serde(default = "default_body_timeout", with = "weir::duration::serde")]
    pub body_timeout: Duration,
    /// The most connections served at once on each listener (default 10 000); more wait in
    /// the listen backlog until one closes.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The listen backlog of each listener (default 4096; the kernel may cap it, see
    /// `net.core.somaxconn`).
    #[serde(default = "default_listen_backlog")]
    pub listen_backlog: u32,
    /// `[server.tls]`: serve every listener over TLS (and, in cluster mode, call other nodes
    /// over it). Absent: plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
}

/// `[server.tls]`: the PEM files TLS is served from, reloaded when they change (see
/// [`crate::tls`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The certificate chain, this node's certificate first (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key: PKCS#8, PKCS#1 or SEC1 (`--tls-key`).
    pub key: PathBuf,
    /// Require client certificates signed by this CA on every listener: mutual TLS
    /// (`--tls-client-ca`). Absent: any client may connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// Cluster mode: the CA other nodes' certificates are verified by (default: `client_ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ca: Option<PathBuf>,
    /// Cluster mode: the name other nodes' certificates are verified for (default: the host
    /// of each node's address). One name every node's certificate carries suits nodes whose
    /// addresses are not known when certificates are made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_name: Option<String>,
}

fn default_node_id() -> String {
    "local".to_owned()
}
fn default_http() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_grpc() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 50051))
}
fn some_duration<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    weir::duration::serde::deserialize(deserializer).map(Some)
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("./weir-data")
}
fn default_report_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_lease_sweep() -> Duration {
    Duration::from_secs(1)
}
fn default_durable_after() -> Duration {
    Duration::from_secs(60)
}
fn default_durable_flush() -> Duration {
    Duration::from_secs(1)
}
fn default_max_cost() -> u64 {
    1_000_000
}
fn default_forget_after() -> Duration {
    Duration::from_secs(600)
}

fn default_cluster_id() -> String {
    "weir".to_owned()
}
fn default_header_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_body_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_max_connections() -> usize {
    10_000
}
fn default_listen_backlog() -> u32 {
    4096
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            node_id: default_node_id(),
            http: default_http(),
            grpc: default_grpc(),
            old_resp: None,
            old_resp_max_keys: None,
            data_dir: default_data_dir(),
            admin_token: None,
            report_interval: default_report_interval(),
            lease_sweep: default_lease_sweep(),
            durable_after: default_durable_after(),
            durable_flush: default_durable_flush(),
            max_cost: default_max_cost(),
            gossip: None,
            join: Vec::new(),
            forget_after: default_forget_after(),
            cluster_id: default_cluster_id(),
            cluster_secret: None,
            header_timeout: default_header_timeout(),
            old_resp_idle_timeout: None,
            data_token: None,
            allowed_hosts: Vec::new(),
            body_timeout: default_body_timeout(),
            max_connections: default_max_connections(),
            listen_backlog: default_listen_backlog(),
            tls: None,
        }
    }
}

/// Everything wrong with a config, each problem on its own.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigProblem {
    /// Not valid TOML, or fields of the wrong type or name.
    #[error("{0}")]
    Syntax(String),
    /// A policy that does not hold together.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// A `[server]` setting that does not hold together.
    #[error("`server.{field}` {problem}")]
    Server {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A `[redis]` setting that does not hold together.
    #[error("`redis.{field}` {problem}")]
    Redis {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// An `[rls]` setting that does not hold together.
    #[error("`rls.{field}` {problem}")]
    Rls {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// An `[[rlqs.bucket]]` rule that does not hold together.
    #[error("`rlqs.{field}` {problem}")]
    Rlqs {
        /// The field, as `bucket[i].name`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `[resp]` setting that does not hold together.
    #[error("`resp.{field}` {problem}")]
    Resp {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A registered front door's table that does not hold together, in the door's words.
    #[error("{0}")]
    FrontDoor(String),
    /// A mistake in the RLS rules files.
    #[error("{0}")]
    Rule(#[from] crate::front_door::rls::config::RuleError),
}

impl ConfigFile {
    /// Parses and checks a config; returns every problem found.
    pub fn parse(text: &str) -> Result<Self, Vec<ConfigProblem>> {
        let mut file: ConfigFile = match toml::from_str(text) {
            Ok(file) => file,
            Err(whole) => {
                return Err(Self::problems_one_by_one(text)
                    .unwrap_or_else(|| vec![ConfigProblem::Syntax(whole.to_string())]));
            }
        };
        let mut problems = file.take_old_names(text);
        problems.extend(file.problems());
        if problems.is_empty() {
            Ok(ConfigFile {
                text: text.to_owned(),
                ..file
            })
        } else {
            Err(problems)
        }
    }

    /// The problems of a file that is valid TOML but does not parse as a config: each policy
    /// parsed on its own, so that one policy's missing limiter or unknown field neither hides
    /// the other policies' problems nor goes without the policy's name. `None` if the TOML
    /// itself is invalid, or nothing is wrong one by one.
    fn problems_one_by_one(text: &str) -> Option<Vec<ConfigProblem>> {
        let mut table: toml::Table = toml::from_str(text).ok()?;
        let entries = match table.remove("policy") {
            Some(toml::Value::Array(entries)) => entries,
            Some(_) => return None,
            None => Vec::new(),
        };
        let mut problems = Vec::new();
        let (rest, mistakes) = every_mistake::<ConfigFile>(toml::Value::Table(table));
        problems.extend(mistakes.into_iter().map(ConfigProblem::Syntax));
        let mut rest = rest.unwrap_or_default();
        for (index, entry) in entries.into_iter().enumerate() {
            let name = entry
                .get("name")
                .and_then(|n| n.as_str())
                .map(str::to_owned);
            let (policy, mistakes) = every_mistake::<PolicyConfig>(entry);
            rest.policy.extend(policy);
            for message in mistakes {
                // The limiter's own check already names the policy.
                problems.push(ConfigProblem::Syntax(if message.starts_with("policy `") {
                    message
                } else {
                    let which = name.as_ref().map_or_else(
                        || format!("policy #{} (no name)", index + 1),
                        |name| format!("policy `{}`", name.escape_debug()),
                    );
                    format!("{which}: {message}")
                }));
            }
        }
        problems.extend(rest.take_old_names(text));
        problems.extend(rest.problems());
        (!problems.is_empty()).then_some(problems)
    }

    /// Moves settings read under their old names to where they are now (`old_names` records
    /// each); a setting given under both names is a problem. `text` tells which names the file
    /// gives.
    fn take_old_names(&mut self, text: &str) -> Vec<ConfigProblem> {
        let table: Option<toml::Table> = toml::from_str(text).ok();
        let in_resp = |field: &str| {
            table
                .as_ref()
                .and_then(|t| t.get("resp"))
                .and_then(|resp| resp.get(field))
                .is_some()
        };
        let server = &mut self.server;
        let old = OldSettings {
            listen: server.old_resp.take(),
            max_keys: server.old_resp_max_keys.take(),
            idle_timeout: server.old_resp_idle_timeout.take(),
        };
        match self.resp.take_old(old, &in_resp) {
            Ok(read) => {
                self.old_names.extend(
                    read.into_iter()
                        .map(|(old, new)| (format!("server.{old}"), format!("resp.{new}"))),
                );
                Vec::new()
            }
            Err(both) => both
                .into_iter()
                .map(|(field, problem)| ConfigProblem::Resp { field, problem })
                .collect(),
        }
    }

    /// Every problem with the config (empty: none).
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        let s = &self.server;
        if s.node_id.trim().is_empty() {
            problems.push(ConfigProblem::Server {
                field: "node_id",
                problem: "must not be empty".into(),
            });
        }
        if s.max_cost == 0 {
            problems.push(ConfigProblem::Server {
                field: "max_cost",
                problem: "must be at least 1".into(),
            });
        }
        for (field, value) in [
            ("max_connections", s.max_connections as u64),
            ("listen_backlog", u64::from(s.listen_backlog)),
        ] {
            if value == 0 {
                problems.push(ConfigProblem::Server {
                    field,
                    problem: "must be at least 1".into(),
                });
            }
        }
        for (field, value) in [
            ("report_interval", s.report_interval),
            ("lease_sweep", s.lease_sweep),
            ("durable_flush", s.durable_flush),
            ("header_timeout", s.header_timeout),
            ("body_timeout", s.body_timeout),
        ] {
            if value.is_zero() {
                problems.push(ConfigProblem::Server {
                    field,
                    problem: "must be greater than zero".into(),
                });
            }
        }
        if let Some(Err(error)) = s.cluster_secret.as_deref().map(ClusterSecret::new) {
            problems.push(ConfigProblem::Server {
                field: "cluster_secret",
                problem: error.to_string(),
            });
        }
        if !s.join.is_empty() && s.gossip.is_none() {
            problems.push(ConfigProblem::Server {
                field: "join",
                problem: "needs `server.gossip`: a node joins a cluster by gossiping".into(),
            });
        }
        for (field, value) in [
            ("max_keys", self.rls.max_keys),
            ("max_descriptors", self.rls.max_descriptors),
        ] {
            if value == 0 {
                problems.push(ConfigProblem::Rls {
                    field,
                    problem: "must be at least 1".into(),
                });
            }
        }
        let ratio = self.rls.near_limit_ratio;
        if !(ratio > 0.0 && ratio <= 1.0) {
            problems.push(ConfigProblem::Rls {
                field: "near_limit_ratio",
                problem: format!("must be greater than 0 and at most 1, got {ratio}"),
            });
        }
        let names: Vec<&str> = self.policy.iter().map(|p| p.name.as_str()).collect();
        problems.extend(
            self.rlqs
                .problems(&names)
                .into_iter()
                .map(|(field, problem)| ConfigProblem::Rlqs { field, problem }),
        );
        problems.extend(
            self.resp
                .problems()
                .into_iter()
                .map(|(field, problem)| ConfigProblem::Resp { field, problem }),
        );
        problems.extend(self.doors.problems().map(ConfigProblem::FrontDoor));
        if let Some(redis) = &self.redis {
            problems.extend(
                redis
                    .problems()
                    .into_iter()
                    .map(|(field, problem)| ConfigProblem::Redis { field, problem }),
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for policy in &self.policy {
            if policy.scope == weir::policy::Scope::Redis && self.redis.is_none() {
                problems.push(ConfigProblem::Policy(PolicyError {
                    policy: policy.name.clone(),
                    field: "scope".into(),
                    problem: "is `redis`, but no `[redis]` names a Redis".into(),
                }));
            }
            if let Some(why) = crate::reserved::reserved_name(&policy.name) {
                problems.push(ConfigProblem::Policy(PolicyError {
                    policy: policy.name.clone(),
                    field: "name".into(),
                    problem: format!("is reserved: {why}"),
                }));
            }
            problems.extend(policy.problems().into_iter().map(ConfigProblem::Policy));
            if !names.insert(policy.name.as_str()) {
                problems.push(ConfigProblem::Policy(PolicyError {
                    policy: policy.name.clone(),
                    field: "name".into(),
                    problem: "is used by more than one policy".into(),
                }));
            }
        }
        problems
    }
}

mod door_tables;
mod mistakes;
#[cfg(test)]
mod tests;
