//! The application core: what the server does, whatever the protocol.
//!
//! The protocols' front doors only translate requests and answers, and this module names none
//! of them; every check, every decision and every change of state happens here, once. A file per job:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the [`App`] itself: its parts, adaptive signals, `/v1/cluster` |
//! | `health.rs` | readiness, what a ready node does not do as it should, shutdown |
//! | `admission.rs` | admitting one request: a rate wherever its bucket lives (`crate::decide`), a concurrency lease here or through the shared pool |
//! | `leasing.rs` | releasing, renewing and reclaiming leases |
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
mod drift;
mod health;
mod kept_buckets;
mod leasing;
mod policy_admin;
mod reloading;
mod stats;
mod throttles;

pub use crate::decide::{NoQuota, QuotaBook};
pub use admission::{AcquireInput, AcquireOutcome, AdmissionTier};
pub use auth::Access;
pub use cluster_stats::ClusterStatsView;
pub use health::Health;
pub use kept_buckets::KeptBuckets;
pub use policy_admin::PolicyAdmin;
pub use reloading::Reloaded;
pub use stats::StatsView;
pub use throttles::{ThrottleQuery, ThrottleRow};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use weir_api::http::{ClusterCounters, ClusterMember, ClusterView, RingSummary};

use anyhow::Context;
use weir::policy::{PolicyConfig, PolicySet};
use weir::{Clock, SystemClock};

use crate::cluster::ClusterMode;
use crate::decide::{Decider, DeciderParts};
use crate::durable;
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
    /// The policies' changes: API, reloads, the cluster's log.
    admin: Arc<PolicyAdmin>,
    leases: Arc<Leases>,
    access: auth::Access,
    max_cost: u64,
    body_timeout: Duration,
    metrics: Metrics,
    health: Health,
    clock: SystemClock,
    cluster: Option<Arc<ClusterMode>>,
    /// Where each bucket is decided, one way for every protocol.
    decider: Arc<Decider>,
    /// `CL.THROTTLE`'s keys.
    cells: Arc<Cells>,
    /// The buckets kept across restarts, if any are.
    kept: Option<Arc<KeptBuckets>>,
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
        let file_policies = settings.policies.clone();
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
            .map(crate::redis_buckets::RedisBuckets::new)
            .transpose()?
            .map(Arc::new);
        let quota = Arc::new(QuotaBook::default());
        let health = Health::new(settings.cluster.clone(), kept.clone(), redis.clone());
        let decider = Arc::new(Decider::new(DeciderParts {
            policies: Arc::clone(&policies),
            cluster: settings.cluster.clone(),
            redis: redis.clone(),
            kept_slower_than: kept.as_ref().map(|kept| kept.slower_than()),
            lent: Arc::clone(&quota),
            shutdown: health.subscribe(),
        }));
        let metrics = Metrics::new(
            Arc::clone(&policies),
            Arc::clone(&leases),
            settings.cluster.clone(),
            store_collectors(kept.as_ref(), redis.as_ref()),
        );
        let admin = Arc::new(PolicyAdmin::new(policy_admin::PolicyAdminParts {
            policies: Arc::clone(&policies),
            data_dir: settings.data_dir,
            overlay,
            file_policies,
            leases: Arc::clone(&leases),
            cluster: settings.cluster.clone(),
            kept: kept.clone(),
            decider: Arc::clone(&decider),
            has_redis: redis.is_some(),
        }));
        let sources = Arc::clone(&admin);
        metrics.register_collector(Box::new(crate::metrics::SourcesCollector(Box::new(
            move || sources.source_counts(),
        ))));
        Ok(Arc::new(App {
            node_id: settings.node_id,
            grpc: settings.grpc,
            policies,
            admin,
            leases,
            access: settings.access,
            max_cost: settings.max_cost,
            body_timeout: settings.body_timeout,
            metrics,
            health,
            clock,
            cluster: settings.cluster,
            decider,
            cells,
            kept,
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

    /// The policies' changes: reads with tags, API writes, reloads, the cluster's log, busy
    /// signals.
    pub fn policy_admin(&self) -> &Arc<PolicyAdmin> {
        &self.admin
    }

    /// Whether this node is ready, and its shutdown.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The credentials and host names requests are checked by.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// How long an HTTP request's body may take to arrive.
    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
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
                cannot_run: self.admin.cannot_run(),
                ..cluster.describe()
            };
        }
        ClusterView {
            mode: "single node".to_owned(),
            members: vec![ClusterMember {
                id: self.node_id.clone(),
                grpc: self.grpc.to_string(),
                state: "alive".to_owned(),
                unseen_for_ms: None,
                votes: false,
                protocol: crate::cluster::PROTOCOL,
                owner: true,
                config_version: Some(self.admin.config_version()),
                build: Some(crate::BUILD.to_owned()),
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
            config_drift: Vec::new(),
            policy_log: None,
            cannot_run: Vec::new(),
        }
    }

    /// In cluster mode, advertises this node's config version and its policy log's identity
    /// and reads the members', every `every`, until the process ends; logs drift between the
    /// members' policies when it starts, changes and ends (`drift.rs`).
    pub async fn share_config_version(self: Arc<Self>, every: Duration) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut drift = drift::DriftLog::default();
        loop {
            ticks.tick().await;
            cluster
                .share_config_version(self.admin.config_version())
                .await;
            drift.observe(&self, std::time::Instant::now()).await;
            cluster.share_log_identity().await;
            cluster.share_abilities(self.admin.abilities()).await;
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
