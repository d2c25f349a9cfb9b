//! Buckets kept in Redis (`scope = "redis"`): for teams whose counters live in Redis, and for
//! stateless nodes — any number of Weir nodes sharing one Redis share every bucket, as the
//! reference Envoy rate limit server's deployments do.
//!
//! A decision is a key's turn in a script run in Redis (`script.rs`); decisions that arrive
//! while others are in flight share a run (`batch.rs`), so under load Redis spends one script
//! call on many decisions. The client is the `redis` crate's: a connection manager that reconnects
//! by itself for a standalone Redis, the async cluster client (slots, redirections, failover)
//! for a Redis Cluster, and for a Redis that Sentinel watches a connection to the master the
//! sentinels name, asked again after any failure. A decision Redis does not answer within `timeout` — Redis down, a
//! master failing over — is decided by `on_unavailable`: admitted (`open`, counted as
//! `fail_open`) or refused (`closed`), as for an owner a cluster node cannot reach.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the `[redis]` settings, the connection, one decision |
//! | `batch.rs` | decisions queued and sent together, one script call a batch |
//! | `script.rs` | the Lua script and its arguments for each shape |
//! | `errors.rs` | failures told apart (outage or answer), counted and logged by kind |
//! | `sentinel.rs` | `[redis.sentinel]`: the sentinels, the master's name and login, a client over them |
//! | `tls.rs` | `[redis.tls]`: the CA a `rediss://` Redis is verified by, this node's client certificate |

mod batch;
mod errors;
mod script;
mod sentinel;
mod tls;

pub use errors::{RedisErrorKind, RedisErrors};
pub use sentinel::SentinelSettings;
pub use tls::{RedisTlsError, RedisTlsSettings};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, oneshot};
use weir::keyed::Shape;

use batch::{Batches, Pending};

/// `[redis]`: where `scope = "redis"` policies keep their buckets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// A standalone Redis: `redis://[:password@]host:port[/db]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A Redis Cluster: some of its nodes' URLs (the rest are found from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster: Vec<String>,
    /// A Redis watched by Sentinel: the master's name and the sentinels' URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelSettings>,
    /// Every rate policy's buckets in Redis, whatever its `scope` (the RLS rules' too).
    #[serde(default)]
    pub every_policy: bool,
    /// A decision Redis cannot make: `open` admits it (default), `closed` refuses it.
    #[serde(default)]
    pub on_unavailable: Unavailable,
    /// How long a decision may wait for Redis before `on_unavailable` decides (default 250 ms).
    #[serde(default = "default_timeout", with = "weir::duration::serde")]
    pub timeout: Duration,
    /// Every bucket's Redis key starts with this (default `weir:`).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// The most decisions sent in one script call (default 100): decisions that arrive while
    /// others are in flight leave together, up to this many.
    #[serde(default = "default_batch_limit")]
    pub batch_limit: usize,
    /// The most script calls out at once (default 4): a decision that finds fewer leaves at
    /// once, alone if nothing else is queued.
    #[serde(default = "default_batches_in_flight")]
    pub batches_in_flight: usize,
    /// `[redis.tls]`: for `rediss://` URLs, the CA Redis is verified by and this node's client
    /// certificate (absent: the system's roots, no client certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RedisTlsSettings>,
}

fn default_timeout() -> Duration {
    Duration::from_millis(250)
}

fn default_prefix() -> String {
    "weir:".to_owned()
}

fn default_batch_limit() -> usize {
    100
}

fn default_batches_in_flight() -> usize {
    4
}

/// The most `batch_limit` may be: a script call's keys and arguments are held in Redis at once.
const MAX_BATCH_LIMIT: usize = 10_000;

/// What a decision Redis cannot make does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// Admit it.
    #[default]
    Open,
    /// Refuse it.
    Closed,
}

impl RedisSettings {
    /// What is wrong with the settings, each as `(field, problem)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let named = [
            self.url.is_some(),
            !self.cluster.is_empty(),
            self.sentinel.is_some(),
        ];
        match named.iter().filter(|&&named| named).count() {
            0 => problems.push((
                "url",
                "is needed (or `redis.cluster` for a Redis Cluster, `redis.sentinel` for one Sentinel watches)"
                    .to_owned(),
            )),
            1 => {}
            _ => problems.push((
                "url",
                "`redis.cluster` and `redis.sentinel`: more than one names a Redis; give one"
                    .to_owned(),
            )),
        }
        let sentinels = self.sentinel.iter().flat_map(|s| &s.nodes);
        if self.sentinel.as_ref().is_some_and(|s| s.nodes.is_empty()) {
            problems.push((
                "sentinel",
                "must name at least one sentinel in `nodes`".to_owned(),
            ));
        }
        for url in self.url.iter().chain(&self.cluster).chain(sentinels) {
            if let Err(error) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
                problems.push(("url", format!("`{url}` is not a Redis URL: {error}")));
            }
        }
        if self.timeout.is_zero() {
            problems.push(("timeout", "must be more than 0s".to_owned()));
        }
        if !(1..=MAX_BATCH_LIMIT).contains(&self.batch_limit) {
            problems.push((
                "batch_limit",
                format!(
                    "must be from 1 to {MAX_BATCH_LIMIT} (1 sends every decision alone), not {}",
                    self.batch_limit
                ),
            ));
        }
        if self.batches_in_flight == 0 {
            problems.push(("batches_in_flight", "must be at least 1".to_owned()));
        }
        if let Some(tls) = &self.tls {
            let sentinel_urls = self.sentinel.iter().flat_map(|s| &s.nodes);
            problems.extend(tls.problems().into_iter().map(|problem| ("tls", problem)));
            for url in self.url.iter().chain(&self.cluster).chain(sentinel_urls) {
                if !url.starts_with("rediss://") {
                    problems.push((
                        "tls",
                        format!("applies to `rediss://` URLs, and `{url}` is not one: write it `rediss://…`, or leave `[redis.tls]` out"),
                    ));
                }
            }
        }
        problems
    }
}

/// Why the Redis client could not be made when the node started.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// A `[redis.tls]` file could not be read.
    #[error(transparent)]
    Tls(#[from] RedisTlsError),
    /// The client refused the settings (a certificate or key it cannot parse, say).
    #[error("[redis]: {0}")]
    Client(#[from] redis::RedisError),
}

/// The client for the Redis the settings name, made before any connection is.
#[derive(Clone)]
enum Client {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    /// The settings, and the certificates the sentinels and the master are reached with: a
    /// sentinel client is made again for every connection.
    Sentinel(SentinelSettings, Option<redis::TlsCertificates>),
}

impl Client {
    fn of(settings: &RedisSettings) -> Result<Client, RedisSetupError> {
        let certificates = settings.tls.as_ref().map(|tls| tls.load()).transpose()?;
        Ok(match (&settings.url, &settings.sentinel) {
            (Some(url), _) => Client::Single(match certificates {
                Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates)?,
                None => redis::Client::open(url.as_str())?,
            }),
            (None, Some(sentinel)) => {
                // Made once now so that what it refuses stops the start.
                sentinel.client(certificates.as_ref())?;
                Client::Sentinel(sentinel.clone(), certificates)
            }
            (None, None) => {
                let mut builder =
                    redis::cluster::ClusterClientBuilder::new(settings.cluster.clone());
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                Client::Cluster(builder.build()?)
            }
        })
    }
}

/// A bucket's decision, as Redis made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisDecision {
    /// Admitted.
    pub admitted: bool,
    /// What the bucket has left.
    pub remaining: u64,
    /// Until the bucket is whole again (a window ends).
    pub reset_after: Duration,
    /// Until a refused request could go (zero when admitted).
    pub retry_after: Duration,
    /// A window's count just after, past its limit when refused hits count (`None`: a
    /// bucket, whose spent is its capacity less what remains).
    pub count: Option<u64>,
}

/// Why Redis could not decide.
#[derive(Debug, thiserror::Error)]
pub enum RedisUnavailable {
    /// No answer within the timeout.
    #[error("Redis did not answer within {0:?}")]
    TimedOut(Duration),
    /// Redis, or the way to it, failed (shared by the decisions of a call that failed whole).
    #[error("Redis: {0}")]
    Failed(Arc<redis::RedisError>),
    /// The shape is not one Redis keeps.
    #[error("a bucket of this shape is not kept in Redis")]
    Shape,
}

impl RedisUnavailable {
    /// Its kind (none for a shape Redis does not keep: nothing was asked).
    pub fn kind(&self) -> Option<RedisErrorKind> {
        match self {
            RedisUnavailable::TimedOut(_) => Some(RedisErrorKind::Timeout),
            RedisUnavailable::Failed(error) => Some(RedisErrorKind::of(error)),
            RedisUnavailable::Shape => None,
        }
    }
}

/// A connection, made at the first decision and remade after a failure to connect.
#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// To the master the sentinels named when it was made: dropped at its first failure, so
    /// the next decision asks them again (a failover names another).
    Sentinel(MultiplexedConnection),
}

/// Counters of the decisions made in Redis, for `/metrics`.
#[derive(Debug, Default)]
pub struct RedisCounters {
    /// Admitted by Redis.
    pub admitted: AtomicU64,
    /// Refused by Redis.
    pub refused: AtomicU64,
    /// Redis could not decide; admitted by `on_unavailable = "open"`.
    pub fail_open: AtomicU64,
    /// Redis could not decide; refused by `on_unavailable = "closed"`.
    pub fail_closed: AtomicU64,
    /// Redis answered with an error (out of memory, a key of another type…): refused.
    pub error: AtomicU64,
}

/// How a call reaches Redis: the client, the connection it made, the script, the time a call
/// may take.
struct Connector {
    client: Client,
    link: Mutex<Option<Link>>,
    script: redis::Script,
    timeout: Duration,
}

/// The Redis that `scope = "redis"` policies keep their buckets in.
pub struct RedisBuckets {
    settings: RedisSettings,
    connector: Arc<Connector>,
    batches: Arc<Batches>,
    /// What the decisions did.
    pub counters: RedisCounters,
    /// What failed, by kind.
    pub errors: RedisErrors,
}

impl std::fmt::Debug for RedisBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuckets")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RedisBuckets {
    /// The Redis of `settings`; connected at the first decision (a Redis down at start is a
    /// Redis unavailable, not a node that cannot start). An error only for settings no
    /// connection could be made with: a `[redis.tls]` file that cannot be read or parsed.
    pub fn new(settings: RedisSettings) -> Result<Self, RedisSetupError> {
        Ok(RedisBuckets {
            connector: Arc::new(Connector {
                client: Client::of(&settings)?,
                link: Mutex::new(None),
                script: redis::Script::new(script::SOURCE),
                timeout: settings.timeout,
            }),
            batches: Arc::new(Batches::new(
                settings.batch_limit,
                settings.batches_in_flight,
            )),
            settings,
            counters: RedisCounters::default(),
            errors: RedisErrors::default(),
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// Script calls sent to Redis so far: one a batch (one a decision in a Redis Cluster).
    pub fn script_calls(&self) -> u64 {
        self.batches.calls()
    }

    /// The Redis key of `policy`'s bucket of `key` (in `kind`'s own buckets, if it has them).
    fn key_of(&self, policy: &str, kind: Option<&str>, key: &str) -> String {
        // Unit separators: no policy or kind name holds one, so no two buckets share a key.
        format!(
            "{}{policy}\u{1f}{}\u{1f}{key}",
            self.settings.prefix,
            kind.unwrap_or_default()
        )
    }

    /// Decides `cost` of `policy`'s bucket of `key` (of shape `shape`; `kind` if it is the
    /// kind's own) in Redis.
    pub async fn decide(
        &self,
        policy: &str,
        kind: Option<&str>,
        key: &str,
        shape: Shape,
        cost: u64,
    ) -> Result<RedisDecision, RedisUnavailable> {
        let arguments = script::arguments(shape, cost).ok_or(RedisUnavailable::Shape)?;
        let timeout = self.settings.timeout;
        let (answer, answered) = oneshot::channel();
        self.batches.send(
            &self.connector,
            Pending {
                key: self.key_of(policy, kind, key),
                arguments,
                answer,
            },
        );
        // The sender bounds its call by the same timeout; this one also covers the wait in
        // the queue.
        let answered = match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) | Err(_) => Err(RedisUnavailable::TimedOut(timeout)),
        };
        let (admitted, remaining, reset_after, retry_after, count) = match answered {
            Ok(reply) => reply,
            Err(error) => {
                if let Some(kind) = error.kind() {
                    self.errors.saw(kind, &error);
                }
                return Err(error);
            }
        };
        self.errors.answered();
        let counter = match admitted {
            1 => &self.counters.admitted,
            _ => &self.counters.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(RedisDecision {
            admitted: admitted == 1,
            remaining,
            reset_after: Duration::from_micros(reset_after),
            retry_after: Duration::from_micros(retry_after),
            count: u64::try_from(count).ok(),
        })
    }
}

impl Connector {
    /// The connection, made now if there is none.
    async fn link(&self) -> Result<Link, redis::RedisError> {
        let mut link = self.link.lock().await;
        if let Some(link) = &*link {
            return Ok(link.clone());
        }
        let made = match &self.client {
            // One attempt: a failed one is tried again at the next decision, and meanwhile
            // its error is counted as what it is (a wrong password as `auth`), not as a
            // timeout while the client retries on its own.
            Client::Single(client) => Link::Single(
                client
                    .get_connection_manager_with_config(
                        redis::aio::ConnectionManagerConfig::new().set_number_of_retries(0),
                    )
                    .await?,
            ),
            Client::Sentinel(sentinel, certificates) => Link::Sentinel(
                sentinel
                    .client(certificates.as_ref())?
                    .get_async_connection()
                    .await?,
            ),
            Client::Cluster(client) => Link::Cluster(client.get_async_connection().await?),
        };
        *link = Some(made.clone());
        Ok(made)
    }

    /// Drops the connection: the next call makes another.
    async fn forget_link(&self) {
        *self.link.lock().await = None;
    }
}

#[cfg(test)]
mod tests;
