//! The application core: what the server does, whatever the protocol.
//!
//! The protocols' front doors only translate requests and answers, and this module names none
//! of them; every check, every decision and every change of state happens here, once. A file per job:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the [`App`] itself: settings, readiness, shutdown, adaptive signals, `/v1/cluster` |
//! | `admission.rs` | admitting one request: a rate wherever its bucket lives (`crate::decide`), a concurrency lease here or through the shared pool |
//! | `leasing.rs` | releasing, renewing and reclaiming leases |
//! | `quota.rs` | shares of buckets assigned to data planes (RLQS) |
//! | `policy_admin.rs` | reading and changing policies with entity tags, durably |
//! | `cluster_policies.rs` | in a cluster, those changes made through the policy log and applied as it commits them |
//! | `background.rs` | the lease sweeper, the adaptive ticker and the periodic report |
//! | `kept_buckets.rs` | buckets that refill slowly (a day's quota) kept in the data dir across restarts |
//! | `reloading.rs` | a reloaded config file's policies and RLS rules applied, the difference only |
//! | `throttles.rs` | who is throttled, here and across the cluster |
//! | `stats.rs` | every policy's counters and gauges at once, as JSON (`/v1/stats`, the live page's) |
//! | `cluster_stats.rs` | every member's counters and their totals (`/v1/stats?scope=cluster`) |
//! | `auth.rs` | the admin token check |

mod admission;
mod auth;
mod background;
pub mod cells;
mod cluster_policies;
mod cluster_stats;
mod kept_buckets;
mod leasing;
mod policy_admin;
mod quota;
mod reloading;
mod stats;
mod throttles;

pub use crate::decide::{NoQuota, QuotaBook};
pub use admission::{AcquireInput, AcquireOutcome, AdmissionTier};
pub use auth::Access;
pub use cluster_stats::ClusterStatsView;
pub use kept_buckets::KeptBuckets;
pub use reloading::Reloaded;
pub use stats::StatsView;
pub use throttles::{ThrottleQuery, ThrottleRow};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_api::http::{ClusterCounters, ClusterMember, ClusterView, RingSummary};

use anyhow::Context;
use tokio::sync::{Mutex as AsyncMutex, watch};
use weir::policy::{PolicyConfig, PolicySet};
use weir::{Clock, SystemClock};

use crate::cluster::ClusterMode;
use crate::decide::{Decider, DeciderParts};
use crate::durable::{self, Overlay};
use crate::error::ApiError;
use crate::leases::Leases;
use crate::metrics::Metrics;
use cells::{CellError, Cells, Throttle, Verdict};

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The server's state and operations.
pub struct App {
    node_id: String,
    grpc: SocketAddr,
    policies: Arc<PolicySet<SystemClock>>,
    data_dir: PathBuf,
    /// The overlay in force; the lock also serialises admin changes.
    overlay: AsyncMutex<Overlay>,
    /// The config file's policies as last read: what the overlay is laid over.
    file_policies: std::sync::Mutex<Vec<PolicyConfig>>,
    leases: Arc<Leases>,
    access: auth::Access,
    max_cost: u64,
    body_timeout: Duration,
    metrics: Metrics,
    shutdown: watch::Sender<bool>,
    ready: AtomicBool,
    clock: SystemClock,
    cluster: Option<Arc<ClusterMode>>,
    /// Where each bucket is decided, one way for every protocol.
    decider: Arc<Decider>,
    /// `CL.THROTTLE`'s keys.
    cells: Arc<Cells>,
    /// The buckets kept across restarts, if any are.
    kept: Option<Arc<KeptBuckets>>,
    /// The Redis `scope = "redis"` policies keep their buckets in, if one is configured.
    redis: Option<Arc<crate::redis_buckets::RedisBuckets>>,
    /// When each adaptive policy last took a busy signal.
    last_busy: std::sync::Mutex<std::collections::HashMap<String, std::time::SystemTime>>,
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
    /// The gRPC address (for `/v1/cluster`).
    pub grpc: SocketAddr,
    /// The config file's policies.
    pub policies: Vec<PolicyConfig>,
    /// Where API changes are kept.
    pub data_dir: PathBuf,
    /// The credentials and host names requests are checked by.
    pub access: auth::Access,
    /// The default most one request may cost.
    pub max_cost: u64,
    /// How long an HTTP request's body may take to arrive.
    pub body_timeout: Duration,
    /// Cluster mode, when this node is part of a cluster.
    pub cluster: Option<Arc<ClusterMode>>,
    /// The most keys `CL.THROTTLE` keeps at once.
    pub cell_max_keys: usize,
    /// Rate buckets that take longer than this to refill are kept in the data dir across
    /// restarts (`None`: none are).
    pub durable_after: Option<Duration>,
    /// `[redis]`: where `scope = "redis"` policies keep their buckets.
    pub redis: Option<crate::redis_buckets::RedisSettings>,
}

#[cfg(test)]
impl AppSettings {
    /// A unit test's app: one node, no policies, its state kept in `dir`.
    pub(crate) fn for_test(dir: &std::path::Path) -> Self {
        AppSettings {
            node_id: "test".to_owned(),
            grpc: "127.0.0.1:0".parse().unwrap(),
            policies: Vec::new(),
            data_dir: dir.to_owned(),
            access: auth::Access::default(),
            max_cost: 1_000_000,
            body_timeout: Duration::from_secs(30),
            cluster: None,
            cell_max_keys: 1000,
            durable_after: None,
            redis: None,
        }
    }
}

/// The most a lease of a deleted policy is renewed by (the config's default `lease_ttl`).
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

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
        let file_policies = std::sync::Mutex::new(settings.policies.clone());
        let configs = overlay.apply(settings.policies);
        let policies = PolicySet::new(configs, SystemClock::new()).map_err(|error| {
            anyhow::anyhow!(
                "the policies (config file and data dir together) are not valid: {error}"
            )
        })?;
        let policies = Arc::new(policies);
        let leases = Arc::new(Leases::new());
        let cells = Arc::new(Cells::new(settings.cell_max_keys));
        let clock = SystemClock::new();
        // Before the node is ready: a day's quota spent before a restart is spent after it.
        let kept = settings
            .durable_after
            .map(|slower_than| {
                KeptBuckets::open(
                    &settings.data_dir,
                    slower_than,
                    &policies,
                    (&cells, i64::try_from(clock.now()).unwrap_or(i64::MAX)),
                )
            })
            .transpose()
            .with_context(|| {
                format!(
                    "reading the kept buckets in {}",
                    settings.data_dir.display()
                )
            })?
            .map(Arc::new);
        let redis = settings
            .redis
            .map(|settings| Arc::new(crate::redis_buckets::RedisBuckets::new(settings)));
        let quota = Arc::new(QuotaBook::default());
        let shutdown = watch::channel(false).0;
        let decider = Arc::new(Decider::new(DeciderParts {
            policies: Arc::clone(&policies),
            cluster: settings.cluster.clone(),
            redis: redis.clone(),
            kept_slower_than: kept.as_ref().map(|kept| kept.slower_than()),
            lent: Arc::clone(&quota),
            shutdown: shutdown.subscribe(),
        }));
        let metrics = Metrics::new(
            Arc::clone(&policies),
            Arc::clone(&leases),
            settings.cluster.clone(),
            store_collectors(kept.as_ref(), redis.as_ref()),
        );
        Ok(Arc::new(App {
            node_id: settings.node_id,
            grpc: settings.grpc,
            policies,
            data_dir: settings.data_dir,
            overlay: AsyncMutex::new(overlay),
            file_policies,
            leases,
            access: settings.access,
            max_cost: settings.max_cost,
            body_timeout: settings.body_timeout,
            metrics,
            shutdown,
            ready: AtomicBool::new(false),
            clock,
            cluster: settings.cluster,
            decider,
            cells,
            kept,
            redis,
            last_busy: Default::default(),
        }))
    }

    /// This node's name.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Where each bucket is decided: what every protocol asks for a rate's decision, and the
    /// owner's side of cluster-scoped rates.
    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Cluster mode, when this node is part of a cluster.
    pub fn cluster_mode(&self) -> Option<&Arc<ClusterMode>> {
        self.cluster.as_ref()
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

    /// Whether the server is ready to serve: started, not shutting down, and in cluster mode
    /// joined to its cluster.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
            && !*self.shutdown.borrow()
            && self.cluster.as_ref().is_none_or(|c| c.has_joined())
    }

    /// Why the server is not ready, if it is not: starting, shutting down, or in cluster mode
    /// still joining (with the seeds it tried and what to check).
    pub fn not_ready_because(&self) -> Option<String> {
        if *self.shutdown.borrow() {
            return Some("shutting down: draining its connections".to_owned());
        }
        if !self.ready.load(Ordering::Acquire) {
            return Some("starting up".to_owned());
        }
        self.cluster.as_ref().and_then(|c| c.joining())
    }

    /// What a ready node does not do as it should, for `/readyz`: its kept buckets not
    /// written, its Redis unreachable.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(error) = self.kept.as_ref().and_then(|kept| kept.failing()) {
            warnings.push(format!(
                "the kept buckets are not being written ({error}): the quotas spent since the last write would start whole after a restart"
            ));
        }
        if let Some((at, error)) = self
            .redis
            .as_ref()
            .and_then(|redis| redis.errors.unreachable())
        {
            warnings.push(format!(
                "the Redis of `scope = \"redis\"` policies is unreachable ({error}, {} s ago): their decisions follow `on_unavailable`",
                at.elapsed().as_secs()
            ));
        }
        warnings
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

    /// Decides redis-cell's `CL.THROTTLE` for `key` now (see the `app::cells` module). Traced as an
    /// `admission` span of the `CL.THROTTLE` pseudo-policy (see the `traces` module).
    pub fn throttle_cell(&self, key: &[u8], throttle: &Throttle) -> Result<Verdict, CellError> {
        let span = tracing::trace_span!(
            target: "weir::admission",
            "admission",
            policy = "CL.THROTTLE",
            key = %String::from_utf8_lossy(key),
            cost = throttle.quantity,
            decision = tracing::field::Empty,
        );
        let verdict = self.cells.throttle(key, throttle, self.cell_now());
        if !span.is_disabled() {
            span.record(
                "decision",
                match &verdict {
                    Ok(v) if v.limited => "refused",
                    Ok(_) => "admitted",
                    Err(_) => "error",
                },
            );
        }
        verdict
    }

    /// `CL.THROTTLE`'s keys and counters.
    pub fn cells(&self) -> &Arc<Cells> {
        &self.cells
    }

    /// The clock `CL.THROTTLE` decides on, in signed nanoseconds.
    fn cell_now(&self) -> i64 {
        i64::try_from(self.clock.now()).unwrap_or(i64::MAX)
    }

    /// A downstream reported "busy" for an adaptive policy; true if limits were tightened.
    pub fn busy(&self, policy: &str) -> Result<bool, ApiError> {
        let found = self
            .policies
            .get(policy)
            .ok_or_else(|| ApiError::unknown_policy(policy))?;
        let tightened = found.busy().ok_or_else(|| {
            ApiError::conflict(format!(
                "policy `{policy}` is not adaptive: only an `adaptive` policy takes busy signals"
            ))
        })?;
        self.last_busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(policy.to_owned(), std::time::SystemTime::now());
        Ok(tightened)
    }

    /// Removes a policy with all it held: its leases are released (a lease belongs to its
    /// policy's life, so one made again under the name starts with nothing in flight) and its
    /// last busy signal is forgotten.
    fn remove_policy(&self, policy: &str) {
        self.policies.remove(policy);
        let released = self.leases.release_policy(policy);
        if released > 0 {
            tracing::info!(policy, released, "policy removed: its leases are released");
        }
        self.last_busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(policy);
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
                tracing::info!(target: "weir::report", "{report}");
            }
        }
    }

    /// This node, as `/v1/cluster` shows it.
    pub fn cluster(&self) -> ClusterView {
        if let Some(cluster) = &self.cluster {
            return ClusterView {
                cannot_run: self.cannot_run(),
                ..cluster.describe()
            };
        }
        ClusterView {
            mode: "single node".to_owned(),
            members: vec![ClusterMember {
                id: self.node_id.clone(),
                grpc: self.grpc.to_string(),
                state: "alive".to_owned(),
                protocol: crate::cluster::PROTOCOL,
                owner: true,
                config_version: Some(self.config_version()),
            }],
            ring: RingSummary {
                members: 1,
                vnodes: weir_cluster::ring::DEFAULT_VNODES,
                unchanged_for_ms: 0,
                handed_over: true,
            },
            counters: ClusterCounters::default(),
            lent: Default::default(),
            config_differs: Vec::new(),
            policy_log: None,
            cannot_run: Vec::new(),
        }
    }

    /// The policies in force this node cannot run: a `scope = "redis"` policy (the cluster
    /// committed it) on a node without `[redis]`.
    pub fn cannot_run(&self) -> Vec<String> {
        if self.redis.is_some() {
            return Vec::new();
        }
        self.policies
            .policies()
            .into_iter()
            .filter(|policy| policy.with_config(|c| c.scope == weir::policy::Scope::Redis))
            .map(|policy| policy.name().to_owned())
            .collect()
    }

    /// What this node can run that not every member may: `redis` with a `[redis]` store.
    fn abilities(&self) -> &'static str {
        match self.redis {
            Some(_) => "redis",
            None => "",
        }
    }

    /// The version of the policies this node runs: a hash of them all, by name and entity tag
    /// (`weir_config_info{hash}`), the same on every node that runs the same policies.
    pub fn config_version(&self) -> String {
        crate::etag::version_of(&self.policies)
    }

    /// In cluster mode, advertises this node's config version and its policy log's identity
    /// and reads the members', every `every`, until the process ends.
    pub async fn share_config_version(self: Arc<Self>, every: Duration) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            cluster.share_config_version(self.config_version()).await;
            cluster.share_log_identity().await;
            cluster.share_abilities(self.abilities()).await;
        }
    }
}

/// The collectors of the stores' counters on `/metrics`: the kept buckets', if buckets are
/// kept; the Redis store's, if policies keep their buckets in Redis. A protocol's own
/// counters are registered by its front door when it starts.
fn store_collectors(
    kept: Option<&Arc<KeptBuckets>>,
    redis: Option<&Arc<crate::redis_buckets::RedisBuckets>>,
) -> Vec<Box<dyn prometheus_client::collector::Collector>> {
    let mut collectors: Vec<Box<dyn prometheus_client::collector::Collector>> = Vec::new();
    if let Some(kept) = kept {
        collectors.push(Box::new(crate::metrics::KeptCollector::new(Arc::clone(
            kept,
        ))));
    }
    if let Some(redis) = redis {
        collectors.push(Box::new(crate::metrics::RedisCollector::new(Arc::clone(
            redis,
        ))));
    }
    collectors
}
