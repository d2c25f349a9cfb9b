//! `/metrics`: Prometheus text exposition.
//!
//! Policy counters are read from each policy's snapshot at scrape time by a collector, so the
//! request path never touches the metrics library. Labels are `policy`, `kind`, `outcome`,
//! `endpoint`, `code` — never a key: one series per key would grow without bound.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use weir::SystemClock;
use weir::policy::PolicySet;

use crate::cluster::ClusterMode;
use crate::leases::Leases;

mod cluster;
mod kept;
mod policies;
mod redis;
mod running;

pub(crate) use kept::KeptCollector;
pub(crate) use redis::RedisCollector;
pub(crate) use running::SourcesCollector;

/// Labels of the API's own request metrics. Every value is static, so counting a request
/// allocates nothing (see [`intern`]).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// `http`, `grpc` or `resp`.
    pub api: &'static str,
    /// The route (`/v1/acquire`), the RPC (`Acquire`) or the command (`CL.THROTTLE`).
    pub endpoint: &'static str,
    /// The status code (`ok` or `error` for a command).
    pub code: &'static str,
}

/// Labels of the request latency histogram.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// `http`, `grpc` or `resp`.
    pub api: &'static str,
    /// The route, the RPC or the command.
    pub endpoint: &'static str,
}

/// A label value as a `&'static str`: the first time a value is seen it is kept for good, so
/// the caller must only pass values from a small fixed set (routes as the router matched
/// them, status codes) — never a client's own words.
pub fn intern(value: &str) -> &'static str {
    static SEEN: std::sync::RwLock<std::collections::BTreeSet<&'static str>> =
        std::sync::RwLock::new(std::collections::BTreeSet::new());
    if let Some(found) = SEEN.read().unwrap_or_else(|p| p.into_inner()).get(value) {
        return found;
    }
    let mut seen = SEEN.write().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = seen.get(value) {
        return found;
    }
    let kept: &'static str = Box::leak(value.to_owned().into_boxed_str());
    seen.insert(kept);
    kept
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Tells this instance's entries in [`HANDLES`] from another's (tests run several servers
    /// in one process).
    id: u64,
    /// Locked only to register a protocol's series when it starts, and to render.
    registry: std::sync::RwLock<Registry>,
    requests: Family<EndpointLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    reloads: Family<ReloadLabel, Counter>,
    tls_reloads: Family<ReloadLabel, Counter>,
}

/// `{outcome}` of a config reload.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabel {
    /// `applied`, `unchanged` or `failed`.
    outcome: &'static str,
}

/// An API request's series, found once: its counter and its latency histogram.
#[derive(Debug, Clone)]
struct RequestSeries {
    requests: Counter,
    latency: Histogram,
}

/// Which series a `(metrics, api, endpoint, code)` is: the instance's id and the three label
/// values' addresses and lengths (the linker may start one string inside another). Every label
/// value is a `&'static str` from a small fixed set, so the same label is nearly always the
/// same address; when it is not, the cost is one more entry.
type SeriesKey = (u64, [(*const u8, usize); 3]);

/// The most series a thread remembers; past it, the least recently used is forgotten.
const MAX_REMEMBERED: usize = 128;

thread_local! {
    /// The series this thread has counted, the most recently used first. A request would
    /// otherwise find its series by hashing three strings under the families' locks each time,
    /// most of what counting costs.
    static HANDLES: std::cell::RefCell<Vec<(SeriesKey, RequestSeries)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0,
    ])
}

impl Metrics {
    /// Metrics for `policies` and `leases` (and cluster mode's counters, if on), with the
    /// collectors of the protocols' own counters.
    pub fn new(
        policies: Arc<PolicySet<SystemClock>>,
        leases: Arc<Leases>,
        cluster: Option<Arc<ClusterMode>>,
        protocols: Vec<Box<dyn Collector>>,
    ) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<EndpointLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "weir_api_requests",
            "API requests answered, by endpoint and status code",
            requests.clone(),
        );
        registry.register(
            "weir_api_request_duration_seconds",
            "Time to answer an API request (waiting for a turn included)",
            latency.clone(),
        );
        let reloads = Family::<ReloadLabel, Counter>::default();
        registry.register(
            "weir_config_reloads",
            "Config file reloads, by outcome: applied, unchanged (its policies as running), failed (the running config kept)",
            reloads.clone(),
        );
        // Each outcome exported from the start, at zero: an alert on a rate needs the series
        // before the first event.
        for outcome in ["applied", "unchanged", "failed"] {
            let _ = reloads.get_or_create(&ReloadLabel { outcome });
        }
        let tls_reloads = Family::<ReloadLabel, Counter>::default();
        registry.register(
            "weir_tls_reloads",
            "TLS certificate reloads, by outcome: applied, failed (the certificates in use kept)",
            tls_reloads.clone(),
        );
        for outcome in ["applied", "failed"] {
            let _ = tls_reloads.get_or_create(&ReloadLabel { outcome });
        }
        registry.register_collector(Box::new(running::TraceExportCollector));
        registry.register_collector(Box::new(running::ProcessCollector));
        registry.register_collector(Box::new(running::SuppressedLinesCollector));
        registry.register_collector(Box::new(running::BuildCollector {
            policies: Arc::clone(&policies),
        }));
        registry.register_collector(Box::new(policies::PolicyCollector { policies, leases }));
        if let Some(cluster) = cluster {
            registry.register(
                "weir_cluster_forward_duration_seconds",
                "Time for a cluster-scoped rate decision to come back from the bucket's owner (a waiting one's wait included)",
                cluster.forward_latency(),
            );
            registry.register_collector(Box::new(cluster::ClusterCollector { cluster }));
        }
        for collector in protocols {
            registry.register_collector(collector);
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Metrics {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registry: std::sync::RwLock::new(registry),
            requests,
            latency,
            reloads,
            tls_reloads,
        }
    }

    /// Counts one answered API request.
    pub fn observe(
        &self,
        api: &'static str,
        endpoint: &'static str,
        code: &'static str,
        took: Duration,
    ) {
        let at = |label: &str| (label.as_ptr(), label.len());
        let key = (self.id, [at(api), at(endpoint), at(code)]);
        let seconds = took.as_secs_f64();
        let count = |series: &RequestSeries| {
            series.requests.inc();
            series.latency.observe(seconds);
        };
        let counted = HANDLES.with_borrow_mut(|handles| {
            let Some(at) = handles.iter().position(|(k, _)| *k == key) else {
                return false;
            };
            // Most recently used first: a server's traffic is mostly one or two endpoints.
            handles[..=at].rotate_right(1);
            count(&handles[0].1);
            true
        });
        if !counted {
            let series = RequestSeries {
                requests: self
                    .requests
                    .get_or_create(&EndpointLabels {
                        api,
                        endpoint,
                        code,
                    })
                    .clone(),
                latency: self
                    .latency
                    .get_or_create(&LatencyLabels { api, endpoint })
                    .clone(),
            };
            count(&series);
            HANDLES.with_borrow_mut(|handles| {
                // The least recently used goes: a dropped instance's series among them.
                handles.truncate(MAX_REMEMBERED - 1);
                handles.insert(0, (key, series));
            });
        }
    }

    /// Counts a config reload: `applied`, `unchanged` or `failed`.
    pub fn count_reload(&self, outcome: &'static str) {
        self.reloads.get_or_create(&ReloadLabel { outcome }).inc();
    }

    /// Counts a TLS certificate reload: `applied` or `failed`.
    pub fn count_tls_reload(&self, outcome: &'static str) {
        self.tls_reloads
            .get_or_create(&ReloadLabel { outcome })
            .inc();
    }

    /// Adds a protocol's own series, when it starts: `metric` under `name` (without its
    /// `_total`) and `help`.
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric);
    }

    /// Adds a protocol's collector, when it starts: read at every scrape.
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .register_collector(collector);
    }

    /// The exposition, in Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

/// One metric family: a name, help, type, and its series.
pub(crate) fn family<S: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (S, M)>,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in series {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One metric without labels.
pub(crate) fn single<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    value: M,
) -> std::fmt::Result {
    value.encode(encoder.encode_descriptor(name, help, None, kind)?)
}
