//! What the server does, whatever the protocol: the operations behind the HTTP and gRPC APIs.
//!
//! `http` and `grpc` only translate requests and answers; every check, every decision and every
//! change of state happens here, once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Mutex as AsyncMutex, watch};
use weir::lease::LeaseId;
use weir::policy::{
    Policy, PolicyConfig, PolicySet, RejectReason, Rejection, Request, ThrottledRow,
};
use weir::{Clock, SystemClock};

use crate::cluster::ClusterMode;
use crate::durable::{self, Overlay};
use crate::error::ApiError;
use crate::leases::{Held, Hold, Leases};
use crate::metrics::Metrics;

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// How many throttled keys a listing returns by default.
pub const DEFAULT_THROTTLE_ROWS: usize = 100;

/// An acquisition, as either API received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireInput {
    /// The policy's name.
    pub policy: String,
    /// The bucket key.
    pub key: String,
    /// The kind (empty: none).
    pub kind: String,
    /// The cost (absent: 1).
    pub cost: Option<u64>,
    /// The longest the caller waits.
    pub max_wait_ms: Option<u64>,
}

/// How an acquisition ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// Admitted.
    Admitted {
        /// How long it waited.
        waited: Duration,
        /// The lease to release (concurrency policies), with its time to live.
        lease: Option<(String, Duration)>,
        /// Admitted only because the policy monitors.
        would_throttle: bool,
        /// The limit of the policy's buckets, for the RateLimit header fields.
        limit: Option<f64>,
        /// Which tier admitted it: `node`, or in cluster mode `shared`, `fail_open`,
        /// `local_share`.
        tier: &'static str,
    },
    /// Refused.
    Refused {
        /// When asking again could succeed, if known.
        retry_after: Option<Duration>,
        /// Why, in a sentence.
        reason: String,
        /// The limit of the policy's buckets.
        limit: Option<f64>,
    },
}

/// One "who is throttled" row: a policy's row, and the node that holds the key back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThrottleRow {
    /// The node that holds the key back.
    pub node_id: String,
    /// The key, its policy, limit and rates.
    #[serde(flatten)]
    pub row: ThrottledRow,
}

/// Filters and order of a throttle listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThrottleQuery {
    /// Only this policy.
    pub policy: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    /// Sort column: `current_qps` (default), `qps_limit`, `in_flight`, `waiters`, `key`,
    /// `policy`, `kind`.
    pub sort: Option<String>,
    /// `desc` (default for numbers) or `asc` (default for names).
    pub order: Option<String>,
    /// At most this many rows (default 100).
    pub limit: Option<usize>,
}

/// A policy and its entity tag.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedPolicy {
    /// The policy.
    pub config: PolicyConfig,
    /// Changes whenever the policy does.
    pub etag: String,
}

/// The server's state and operations.
pub struct App {
    node_id: String,
    http: SocketAddr,
    grpc: SocketAddr,
    policies: Arc<PolicySet<SystemClock>>,
    data_dir: PathBuf,
    /// The overlay in force; the lock also serialises admin changes.
    overlay: AsyncMutex<Overlay>,
    leases: Arc<Leases>,
    admin_token: Option<String>,
    max_cost: u64,
    body_timeout: Duration,
    metrics: Metrics,
    shutdown: watch::Sender<bool>,
    ready: AtomicBool,
    clock: SystemClock,
    cluster: Option<Arc<ClusterMode>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("node_id", &self.node_id)
            .finish()
    }
}

/// How to build an [`App`].
#[derive(Debug, Clone)]
pub struct AppSettings {
    /// This node's name.
    pub node_id: String,
    /// The HTTP address (for `/v1/cluster`).
    pub http: SocketAddr,
    /// The gRPC address (for `/v1/cluster`).
    pub grpc: SocketAddr,
    /// The config file's policies.
    pub policies: Vec<PolicyConfig>,
    /// Where API changes are kept.
    pub data_dir: PathBuf,
    /// The admin token, if any.
    pub admin_token: Option<String>,
    /// The default most one request may cost.
    pub max_cost: u64,
    /// How long an HTTP request's body may take to arrive.
    pub body_timeout: Duration,
    /// Cluster mode, when this node is part of a cluster.
    pub cluster: Option<Arc<ClusterMode>>,
}

/// The most a lease of a deleted policy is renewed by (the config's default `lease_ttl`).
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// A stable tag of a policy's content (FNV-1a over its JSON form).
pub fn etag_of(config: &PolicyConfig) -> String {
    let bytes = serde_json::to_vec(config).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("\"{hash:016x}\"")
}

impl App {
    /// Loads the data dir's overlay over `settings.policies` and builds every policy.
    pub fn new(settings: AppSettings) -> anyhow::Result<Arc<Self>> {
        let overlay = durable::load(&settings.data_dir)?;
        // Decisions need no disk; changes do. Say so now, not at the first PUT.
        if let Err(e) = durable::check_writable(&settings.data_dir) {
            tracing::warn!(
                "the data dir cannot be written ({e}): policy changes over the API will be refused until it can"
            );
        }
        let configs = overlay.apply(settings.policies);
        let policies = PolicySet::new(configs, SystemClock::new()).map_err(|problems| {
            let list: Vec<String> = problems.iter().map(|p| format!("  - {p}")).collect();
            anyhow::anyhow!(
                "the policies (config file and data dir together) are not valid:\n{}",
                list.join("\n")
            )
        })?;
        let policies = Arc::new(policies);
        let leases = Arc::new(Leases::new());
        let metrics = Metrics::new(
            Arc::clone(&policies),
            Arc::clone(&leases),
            settings.cluster.clone(),
        );
        Ok(Arc::new(App {
            node_id: settings.node_id,
            http: settings.http,
            grpc: settings.grpc,
            policies,
            data_dir: settings.data_dir,
            overlay: AsyncMutex::new(overlay),
            leases,
            admin_token: settings.admin_token,
            max_cost: settings.max_cost,
            body_timeout: settings.body_timeout,
            metrics,
            shutdown: watch::channel(false).0,
            ready: AtomicBool::new(false),
            clock: SystemClock::new(),
            cluster: settings.cluster,
        }))
    }

    /// This node's name.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The policies in force.
    pub fn policies(&self) -> &PolicySet<SystemClock> {
        &self.policies
    }

    /// Marks the server ready (listeners bound) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// How long an HTTP request's body may take to arrive.
    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
    }

    /// Whether the server is ready to serve.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !*self.shutdown.borrow()
    }

    /// Starts shutting down: waiting requests are answered 503.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves when shutdown begins.
    pub async fn shutting_down(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Checks an admin call's `Authorization` header value.
    pub fn check_admin(&self, authorization: Option<&str>) -> Result<(), ApiError> {
        let Some(token) = &self.admin_token else {
            return Ok(());
        };
        // RFC 9110: the scheme is case-insensitive, and spaces may separate it from the token.
        let given = authorization
            .and_then(|h| h.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim_start())
            .ok_or_else(ApiError::unauthenticated)?;
        // Compare without an early exit, so the time taken says nothing about the token.
        let matches = given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if matches {
            Ok(())
        } else {
            Err(ApiError::forbidden())
        }
    }

    /// Admits (or refuses) one request; waits if the policy says so, unless shutdown begins.
    pub async fn acquire(&self, input: AcquireInput) -> Result<AcquireOutcome, ApiError> {
        if input.key.is_empty() {
            return Err(ApiError::invalid("`key` must not be empty"));
        }
        if input.key.len() > MAX_KEY_BYTES {
            return Err(ApiError::invalid(format!(
                "`key` is {} bytes long; the most is {MAX_KEY_BYTES}",
                input.key.len()
            )));
        }
        let policy = self
            .policies
            .get(&input.policy)
            .ok_or_else(|| ApiError::unknown_policy(&input.policy))?;
        // Only what the decision needs: the config itself is not copied per request.
        let (max_cost, lease_ttl, shares) = policy.with_config(|config| {
            let concurrency = config.concurrency.as_ref();
            (
                config.max_cost.unwrap_or(self.max_cost),
                concurrency.map(|c| c.lease_ttl),
                concurrency.is_some_and(|c| c.shared_limit > 0)
                    && config.mode == weir::policy::Mode::Enforce,
            )
        });
        let cost = input.cost.unwrap_or(1);
        if cost == 0 || cost > max_cost {
            return Err(ApiError::invalid(format!(
                "`cost` must be between 1 and {max_cost} for policy `{}`, got {cost}",
                input.policy
            )));
        }
        let mut request = Request::new(&input.key).kind(&input.kind).cost(cost);
        if let Some(ms) = input.max_wait_ms {
            request = request.max_wait(Duration::from_millis(ms));
        }
        let limit = policy.limit_for(&input.kind);
        let decided = tokio::select! {
            decided = policy.acquire(&request) => decided,
            () = self.shutting_down() => return Err(ApiError::shutting_down()),
        };
        match decided {
            Ok(admission) => {
                let waited = admission.waited();
                let would_throttle = admission.would_throttle();
                let lease = match lease_ttl {
                    Some(ttl) if admission.applied() => {
                        Some(self.hold(&input.policy, Hold::Node(admission), ttl))
                    }
                    // A rate limiter's admission is done as soon as it is answered.
                    _ => None,
                };
                Ok(AcquireOutcome::Admitted {
                    waited,
                    lease,
                    would_throttle,
                    limit,
                    tier: "node",
                })
            }
            // A full node tier of a concurrency policy with a shared limit: in cluster mode,
            // ask the bucket's owner for a shared lease.
            Err(Rejection {
                reason: RejectReason::Limited { retry_after: None },
                ..
            }) if shares && self.cluster.is_some() => {
                Ok(self.acquire_shared(&policy, &input, limit).await)
            }
            Err(rejection) => Ok(AcquireOutcome::Refused {
                retry_after: rejection.retry_after(),
                reason: rejection.to_string(),
                limit,
            }),
        }
    }

    /// The shared tier: a lease from the bucket's owner, for a request the node tier refused.
    async fn acquire_shared(
        &self,
        policy: &Policy<SystemClock>,
        input: &AcquireInput,
        limit: Option<f64>,
    ) -> AcquireOutcome {
        let cluster = self.cluster.as_ref().expect("only asked in cluster mode");
        let config = policy.config();
        let concurrency = config
            .concurrency
            .as_ref()
            .expect("only asked for concurrency policies");
        let coordinator = cluster.coordinator(&input.policy, concurrency, config.max_keys);
        match coordinator.acquire(&input.key).await {
            Ok(admission) => {
                let tier = crate::cluster::tier_name(admission.tier);
                let lease = self.hold(
                    &input.policy,
                    Hold::Shared(admission, coordinator),
                    concurrency.lease_ttl,
                );
                AcquireOutcome::Admitted {
                    waited: Duration::ZERO,
                    lease: Some(lease),
                    would_throttle: false,
                    limit,
                    tier,
                }
            }
            Err(refusal) => {
                // The coordinator is shared-only; a full bucket here is full on both tiers.
                let reason = if concurrency.node_limit > 0 && refusal.full {
                    format!(
                        "reached its per-node limit of {} and its shared limit of {}",
                        concurrency.node_limit, concurrency.shared_limit
                    )
                } else {
                    refusal.reason.clone()
                };
                AcquireOutcome::Refused {
                    retry_after: refusal.retry_after,
                    reason: format!(
                        "policy `{}`: bucket `{}` {reason}",
                        input.policy, refusal.bucket
                    ),
                    limit,
                }
            }
        }
    }

    /// Holds an admission as a lease; returns its id and time to live.
    fn hold(&self, policy: &str, admission: Hold, ttl: Duration) -> (String, Duration) {
        let held = Held {
            policy: policy.to_owned(),
            admission,
        };
        let (id, _) = self.leases.insert(
            held,
            u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            self.clock.now(),
        );
        (id.to_string(), ttl)
    }

    fn lease_id(text: &str) -> Result<LeaseId, ApiError> {
        text.parse::<LeaseId>()
            .map_err(|e| ApiError::invalid(format!("`lease`: {e}")))
    }

    /// Releases a lease.
    pub fn release(&self, lease: &str) -> Result<(), ApiError> {
        let id = Self::lease_id(lease)?;
        if self.leases.release(id) {
            Ok(())
        } else {
            Err(ApiError::unknown_lease())
        }
    }

    /// Extends a lease by `ttl_ms` (default and most: its policy's `lease_ttl`); returns the
    /// time left. A longer `ttl_ms` is cut to the policy's `lease_ttl`: a holder cannot pin
    /// capacity beyond what the operator configured. A shared lease is renewed on its owner
    /// first; if it is gone there, so is the lease.
    pub async fn renew(&self, lease: &str, ttl_ms: Option<u64>) -> Result<Duration, ApiError> {
        let id = Self::lease_id(lease)?;
        if ttl_ms == Some(0) {
            return Err(ApiError::invalid("`ttl_ms` must be greater than zero"));
        }
        let policy = self
            .leases
            .policy_of(id)
            .ok_or_else(ApiError::unknown_lease)?;
        // A policy deleted since keeps its leases until they end; they renew by the default.
        let most = self
            .policies
            .get(&policy)
            .and_then(|p| p.config().concurrency.map(|c| c.lease_ttl))
            .unwrap_or(DEFAULT_LEASE_TTL);
        let ttl = ttl_ms.map_or(most, |ms| Duration::from_millis(ms).min(most));
        let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        if let Some((coordinator, shared)) = self.leases.shared_of(id) {
            if !coordinator.renew(shared, ttl_ns).await {
                self.leases.release(id);
                return Err(ApiError::unknown_lease());
            }
        }
        let now = self.clock.now();
        self.leases
            .renew(id, ttl_ns, now)
            .map(|expires| Duration::from_nanos(expires - now))
            .ok_or_else(ApiError::unknown_lease)
    }

    /// Reclaims expired leases; returns how many.
    pub fn sweep_leases(&self) -> usize {
        if let Some(cluster) = &self.cluster {
            // The owner's pool and the coordinators' lists of shared leases expire alike.
            cluster.sweep();
        }
        self.leases.sweep(self.clock.now())
    }

    /// A downstream reported "busy" for an adaptive policy; true if limits were tightened.
    pub fn busy(&self, policy: &str) -> Result<bool, ApiError> {
        let found = self
            .policies
            .get(policy)
            .ok_or_else(|| ApiError::unknown_policy(policy))?;
        found.busy().ok_or_else(|| {
            ApiError::conflict(format!(
                "policy `{policy}` is not adaptive: only an `adaptive` policy takes busy signals"
            ))
        })
    }

    /// Advances every adaptive policy by `ms`.
    pub fn tick(&self, ms: u64) {
        for policy in self.policies.policies() {
            policy.tick(ms);
        }
    }

    /// Logs "policy P was throttled in the last N s" for every policy that was.
    pub fn report(&self) {
        for policy in self.policies.policies() {
            if let Some(report) = policy.report() {
                tracing::warn!(target: "weir::report", "{report}");
            }
        }
    }

    /// The keys held back, filtered and sorted.
    pub fn throttles(&self, query: &ThrottleQuery) -> Result<Vec<ThrottleRow>, ApiError> {
        if let Some(node) = &query.node {
            if *node != self.node_id {
                return Ok(Vec::new());
            }
        }
        let limit = query.limit.unwrap_or(DEFAULT_THROTTLE_ROWS);
        let policies = match &query.policy {
            Some(name) => vec![
                self.policies
                    .get(name)
                    .ok_or_else(|| ApiError::unknown_policy(name))?,
            ],
            None => self.policies.policies(),
        };
        let mut rows: Vec<ThrottleRow> = policies
            .iter()
            .flat_map(|p| p.throttled_keys(limit))
            .map(|row| ThrottleRow {
                node_id: self.node_id.clone(),
                row,
            })
            .collect();
        sort_rows(&mut rows, query.sort.as_deref(), query.order.as_deref())?;
        rows.truncate(limit);
        Ok(rows)
    }

    /// The keys held back on every live node (this one, and each peer over gRPC, all asked at
    /// once over channels kept between calls), filtered and sorted. A peer that does not answer
    /// within a second is left out.
    pub async fn cluster_throttles(
        &self,
        query: &ThrottleQuery,
    ) -> Result<Vec<ThrottleRow>, ApiError> {
        let Some(cluster) = &self.cluster else {
            return self.throttles(query);
        };
        let local_query = ThrottleQuery {
            node: None,
            sort: None,
            order: None,
            ..query.clone()
        };
        let mut rows = self.throttles(&local_query)?;
        let limit = query.limit.unwrap_or(DEFAULT_THROTTLE_ROWS);
        let request = crate::proto::ThrottlesRequest {
            policy: query.policy.clone().unwrap_or_default(),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        let mut asking = tokio::task::JoinSet::new();
        for (peer, channel) in cluster.peers() {
            let request = request.clone();
            asking.spawn(async move {
                let mut client = crate::proto::weir_client::WeirClient::new(channel);
                let asked = tokio::time::timeout(Duration::from_secs(1), client.throttles(request));
                (peer, asked.await)
            });
        }
        while let Some(answered) = asking.join_next().await {
            let Ok((peer, asked)) = answered else {
                continue;
            };
            let Ok(Ok(answer)) = asked else {
                tracing::warn!(%peer, "no throttle rows from a peer within 1 s");
                continue;
            };
            rows.extend(answer.into_inner().rows.into_iter().map(|r| ThrottleRow {
                node_id: r.node_id,
                row: ThrottledRow {
                    policy: r.policy,
                    key: r.key,
                    kind: r.kind,
                    qps_limit: r.qps_limit,
                    current_qps: r.current_qps,
                    in_flight: r.in_flight,
                    waiters: r.waiters,
                },
            }));
        }
        if let Some(node) = &query.node {
            rows.retain(|r| r.node_id == *node);
        }
        sort_rows(&mut rows, query.sort.as_deref(), query.order.as_deref())?;
        rows.truncate(limit);
        Ok(rows)
    }

    /// One policy with its tag.
    pub fn policy(&self, name: &str) -> Result<TaggedPolicy, ApiError> {
        let config = self
            .policies
            .get(name)
            .ok_or_else(|| ApiError::unknown_policy(name))?
            .config();
        Ok(TaggedPolicy {
            etag: etag_of(&config),
            config,
        })
    }

    /// Every policy with its tag, in name order.
    pub fn all_policies(&self) -> Vec<TaggedPolicy> {
        self.policies
            .policies()
            .iter()
            .map(|p| {
                let config = p.config();
                TaggedPolicy {
                    etag: etag_of(&config),
                    config,
                }
            })
            .collect()
    }

    fn check_if_match(&self, name: &str, if_match: Option<&str>) -> Result<(), ApiError> {
        let Some(expected) = if_match else {
            return Ok(());
        };
        let current = self.policies.get(name).map(|p| etag_of(&p.config()));
        match (expected.trim(), current) {
            ("*", Some(_)) => Ok(()),
            (tag, Some(current)) if tag == current => Ok(()),
            (_, current) => Err(ApiError::precondition_failed(format!(
                "If-Match {expected} does not match policy `{name}` (its tag is {})",
                current.as_deref().unwrap_or("absent: no such policy")
            ))),
        }
    }

    /// Creates or replaces a policy: validated, written to the data dir, then applied. Returns
    /// whether it was created, and its new tag.
    pub async fn put_policy(
        &self,
        name: &str,
        mut config: PolicyConfig,
        if_match: Option<&str>,
    ) -> Result<(bool, TaggedPolicy), ApiError> {
        if config.name.is_empty() {
            config.name = name.to_owned();
        } else if config.name != name {
            return Err(ApiError::invalid(format!(
                "the body names policy `{}` but the URL names `{name}`",
                config.name
            )));
        }
        if let Err(e) = config.validate() {
            return Err(ApiError::invalid(e.to_string()));
        }
        let mut overlay = self.overlay.lock().await;
        self.check_if_match(name, if_match)?;
        let next = overlay.with_upsert(config.clone());
        self.persist(&next).await?;
        let created = self
            .policies
            .upsert(config.clone())
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        *overlay = next;
        Ok((
            created,
            TaggedPolicy {
                etag: etag_of(&config),
                config,
            },
        ))
    }

    /// Deletes a policy: written to the data dir, then applied.
    pub async fn delete_policy(&self, name: &str, if_match: Option<&str>) -> Result<(), ApiError> {
        let mut overlay = self.overlay.lock().await;
        if self.policies.get(name).is_none() {
            return Err(ApiError::unknown_policy(name));
        }
        self.check_if_match(name, if_match)?;
        let next = overlay.with_delete(name);
        self.persist(&next).await?;
        self.policies.remove(name);
        *overlay = next;
        Ok(())
    }

    async fn persist(&self, overlay: &Overlay) -> Result<(), ApiError> {
        let dir = self.data_dir.clone();
        let overlay = overlay.clone();
        tokio::task::spawn_blocking(move || durable::store(&dir, &overlay))
            .await
            .map_err(|e| ApiError::internal(format!("writing the data dir: {e}")))?
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// This node, as `/v1/cluster` shows it.
    pub fn cluster(&self) -> serde_json::Value {
        if let Some(cluster) = &self.cluster {
            return cluster.describe();
        }
        serde_json::json!({
            "members": [{
                "id": self.node_id,
                "http": self.http.to_string(),
                "grpc": self.grpc.to_string(),
                "state": "alive",
                "version": env!("CARGO_PKG_VERSION"),
            }],
            "ring": { "members": 1, "mode": "single node" },
        })
    }
}

/// Sorts throttle rows by a column; an unknown column is an error that lists the known ones.
fn sort_rows(
    rows: &mut [ThrottleRow],
    sort: Option<&str>,
    order: Option<&str>,
) -> Result<(), ApiError> {
    let column = sort.unwrap_or("current_qps");
    let numeric = matches!(
        column,
        "current_qps" | "qps_limit" | "in_flight" | "waiters"
    );
    let descending = match order {
        None => numeric,
        Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`order` must be `asc` or `desc`, got `{other}`"
            )));
        }
    };
    let by: fn(&ThrottleRow, &ThrottleRow) -> std::cmp::Ordering = match column {
        "current_qps" => |a, b| a.row.current_qps.total_cmp(&b.row.current_qps),
        "qps_limit" => |a, b| {
            let limit = |r: &ThrottleRow| r.row.qps_limit.unwrap_or(f64::INFINITY);
            limit(a).total_cmp(&limit(b))
        },
        "in_flight" => |a, b| a.row.in_flight.cmp(&b.row.in_flight),
        "waiters" => |a, b| a.row.waiters.cmp(&b.row.waiters),
        "key" => |a, b| a.row.key.cmp(&b.row.key),
        "policy" => |a, b| a.row.policy.cmp(&b.row.policy),
        "kind" => |a, b| a.row.kind.cmp(&b.row.kind),
        other => {
            return Err(ApiError::invalid(format!(
                "`sort` must be one of current_qps, qps_limit, in_flight, waiters, key, policy, kind; got `{other}`"
            )));
        }
    };
    rows.sort_by(|a, b| {
        let ordering =
            by(a, b).then_with(|| (&a.row.policy, &a.row.key).cmp(&(&b.row.policy, &b.row.key)));
        if descending {
            ordering.reverse()
        } else {
            ordering
        }
    });
    Ok(())
}
