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
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use weir::SystemClock;
use weir::policy::PolicySet;
use weir::policy::stats::WAIT_BUCKETS;

use crate::cells::Cells;
use crate::cluster::ClusterMode;
use crate::leases::Leases;
use crate::rls::Rls;

mod running;

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
    registry: Registry,
    requests: Family<EndpointLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    reloads: Family<ReloadLabel, Counter>,
    tls_reloads: Family<ReloadLabel, Counter>,
    resp_closed: Family<ReasonLabel, Counter>,
}

/// `{outcome}` of a config reload.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabel {
    /// `applied`, `unchanged` or `failed`.
    outcome: &'static str,
}

/// `{reason}` a Redis-protocol connection was closed by the server.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// `auth_timeout`, `command_timeout`, `idle_timeout` or `evicted`.
    reason: &'static str,
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
    /// otherwise find its series by hashing three strings under the families' locks each time:
    /// about a thousand instructions, most of what counting costs.
    static HANDLES: std::cell::RefCell<Vec<(SeriesKey, RequestSeries)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0,
    ])
}

impl Metrics {
    /// Metrics for `policies` and `leases` (and cluster mode's counters, if on).
    pub fn new(
        policies: Arc<PolicySet<SystemClock>>,
        leases: Arc<Leases>,
        cluster: Option<Arc<ClusterMode>>,
        rls: Option<Arc<Rls>>,
        cells: Arc<Cells>,
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
        let resp_closed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "weir_resp_connections_closed",
            "Redis-protocol connections the server closed, by reason: auth_timeout, command_timeout (a request begun and not finished in time), idle_timeout, evicted (silent longest when a newcomer found the port full)",
            resp_closed.clone(),
        );
        for reason in ["auth_timeout", "command_timeout", "idle_timeout", "evicted"] {
            let _ = resp_closed.get_or_create(&ReasonLabel { reason });
        }
        registry.register_collector(Box::new(running::BuildCollector {
            policies: Arc::clone(&policies),
        }));
        registry.register_collector(Box::new(PolicyCollector { policies, leases }));
        if let Some(cluster) = cluster {
            registry.register(
                "weir_cluster_forward_duration_seconds",
                "Time for a cluster-scoped rate decision to come back from the bucket's owner (a waiting one's wait included)",
                cluster.forward_latency(),
            );
            registry.register_collector(Box::new(ClusterCollector { cluster }));
        }
        if let Some(rls) = rls {
            registry.register_collector(Box::new(RlsCollector { rls }));
        }
        registry.register_collector(Box::new(CellsCollector { cells }));
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Metrics {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registry,
            requests,
            latency,
            reloads,
            tls_reloads,
            resp_closed,
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

    /// Counts a Redis-protocol connection the server closed, by why.
    pub fn count_resp_closed(&self, reason: &'static str) {
        self.resp_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The exposition, in Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// Reads every policy's counters at scrape time.
#[derive(Debug)]
struct PolicyCollector {
    policies: Arc<PolicySet<SystemClock>>,
    leases: Arc<Leases>,
}

/// `{policy}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

/// `{policy, outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    policy: String,
    outcome: &'static str,
}

/// `{policy, kind}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    policy: String,
    kind: String,
}

/// One metric family: a name, help, type, and its series.
fn family<S: EncodeLabelSet, M: EncodeMetric>(
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
fn single<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    value: M,
) -> std::fmt::Result {
    value.encode(encoder.encode_descriptor(name, help, None, kind)?)
}

/// A histogram from a snapshot: per-bucket (not cumulative) counts over [`WAIT_BUCKETS`] and an
/// unbounded last bucket.
fn wait_histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (impl EncodeLabelSet, Duration, Vec<u64>)>,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, sum, counts) in series {
        let buckets: Vec<(f64, u64)> = WAIT_BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts.iter().copied())
            .collect();
        let count = counts.iter().sum();
        metric
            .encode_family(&labels)?
            .encode_histogram::<PolicyLabel>(sum.as_secs_f64(), count, &buckets, None)?;
    }
    Ok(())
}

impl Collector for PolicyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let policies = self.policies.policies();
        let stats: Vec<_> = policies
            .iter()
            .map(|p| (p.name().to_owned(), p.stats(), p.backpressure_stats()))
            .collect();
        let label = |name: &String| PolicyLabel {
            policy: name.clone(),
        };
        family(
            &mut encoder,
            "weir_requests",
            "Requests a policy applied to (accounted)",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.started))),
        )?;
        family(
            &mut encoder,
            "weir_requests_finished",
            "Requests done: refused, or admitted and finished",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.finished))),
        )?;
        family(
            &mut encoder,
            "weir_decisions",
            "Decisions by outcome: admitted (at once), throttled (admitted after waiting), rejected, would_throttle (monitor mode), unkeyed (no bucket key)",
            MetricType::Counter,
            stats.iter().flat_map(|(n, s, _)| {
                [
                    ("admitted", s.admitted - s.throttled - s.would_throttle),
                    ("throttled", s.throttled),
                    ("rejected", s.rejected),
                    ("would_throttle", s.would_throttle),
                    ("unkeyed", s.unkeyed),
                ]
                .map(|(outcome, value)| {
                    (
                        OutcomeLabels {
                            policy: n.clone(),
                            outcome,
                        },
                        ConstCounter::new(value),
                    )
                })
            }),
        )?;
        wait_histogram(
            &mut encoder,
            "weir_wait_seconds",
            "How long throttled requests waited",
            stats
                .iter()
                .map(|(n, s, _)| (label(n), s.wait_sum, s.wait_counts.clone())),
        )?;
        for (name, help, value) in [
            ("weir_in_flight", "Admitted requests not finished yet", 0),
            ("weir_waiters", "Requests waiting for their turn", 1),
            ("weir_keys", "Keys (buckets) tracked", 2),
        ] {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Gauge,
                stats.iter().map(|(n, s, _)| {
                    let v = [s.in_flight, s.waiters, s.keys][value];
                    (label(n), ConstGauge::new(v as i64))
                }),
            )?;
        }
        family(
            &mut encoder,
            "weir_evictions",
            "Idle buckets dropped to bound memory",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.evictions))),
        )?;
        family(
            &mut encoder,
            "weir_overflow",
            "New keys that found the key map full",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.overflow_hits))),
        )?;
        family(
            &mut encoder,
            "weir_sketched",
            "Decisions on keys past the key map's cap, made in the policy's sketch",
            MetricType::Counter,
            stats
                .iter()
                .map(|(n, s, _)| (label(n), ConstCounter::new(s.sketched))),
        )?;

        let adaptive: Vec<_> = stats
            .iter()
            .filter_map(|(n, _, b)| b.as_ref().map(|b| (n, b)))
            .collect();
        for (name, help, pick) in [
            (
                "weir_backpressure_busy_signals",
                "Busy signals received by adaptive policies",
                0,
            ),
            (
                "weir_backpressure_upgrades",
                "Times an adaptive policy tightened its hottest keys",
                1,
            ),
            (
                "weir_backpressure_downgrades",
                "Times an adaptive policy relaxed limits (a level, or every limited key)",
                2,
            ),
        ] {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Counter,
                adaptive.iter().map(|(n, b)| {
                    let v = [b.busy_signals, b.upgrades, b.downgrades][pick];
                    (label(n), ConstCounter::new(v))
                }),
            )?;
        }
        family(
            &mut encoder,
            "weir_backpressure_throttled_keys",
            "Keys an adaptive policy limits now, per kind (RPC type)",
            MetricType::Gauge,
            adaptive.iter().flat_map(|(n, b)| {
                b.throttled_keys.iter().map(|(kind, count)| {
                    (
                        KindLabels {
                            policy: (*n).clone(),
                            kind: kind.clone(),
                        },
                        ConstGauge::new(*count as i64),
                    )
                })
            }),
        )?;
        wait_histogram(
            &mut encoder,
            "weir_backpressure_wait_seconds",
            "How long calls waited for their slot, per kind (RPC type)",
            adaptive.iter().flat_map(|(n, b)| {
                b.waits.iter().map(|(kind, (sum, counts))| {
                    (
                        KindLabels {
                            policy: (*n).clone(),
                            kind: kind.clone(),
                        },
                        *sum,
                        counts.clone(),
                    )
                })
            }),
        )?;

        let leases = self.leases.counters();
        single(
            &mut encoder,
            "weir_leases_active",
            "Concurrency leases held now",
            MetricType::Gauge,
            ConstGauge::new(leases.active as i64),
        )?;
        single(
            &mut encoder,
            "weir_leases_expired",
            "Leases reclaimed because their holder neither released nor renewed them",
            MetricType::Counter,
            ConstCounter::new(leases.expired),
        )?;
        single(
            &mut encoder,
            "weir_leases_released",
            "Leases released by their holder",
            MetricType::Counter,
            ConstCounter::new(leases.released),
        )?;
        Ok(())
    }
}

/// Cluster mode's counters, read at scrape time.
#[derive(Debug)]
struct ClusterCollector {
    cluster: Arc<ClusterMode>,
}

/// `{tier}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `{peer}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let c = self.cluster.counters();
        family(
            &mut encoder,
            "weir_cluster_admissions",
            "Admissions beyond the node tier: shared (a lease from the owner or a unit lent to this node), fail_open, local_share",
            MetricType::Counter,
            [
                ("shared", c.shared),
                ("fail_open", c.fail_open),
                ("local_share", c.local_share),
            ]
            .map(|(tier, v)| (TierLabel { tier }, ConstCounter::new(v))),
        )?;
        single(
            &mut encoder,
            "weir_cluster_unavailable",
            "Times a bucket's owner could not be asked",
            MetricType::Counter,
            ConstCounter::new(c.unavailable),
        )?;
        single(
            &mut encoder,
            "weir_cluster_leases_handed_off",
            "Shared leases re-registered with a bucket's new owner after a ring change",
            MetricType::Counter,
            ConstCounter::new(c.handed_off),
        )?;
        single(
            &mut encoder,
            "weir_cluster_admissions_from_loan",
            "Shared admissions on units lent to this node, made with no call to the owner",
            MetricType::Counter,
            ConstCounter::new(c.from_loan),
        )?;
        single(
            &mut encoder,
            "weir_cluster_learning_refusals",
            "Requests refused because the bucket's new owner was in its learning period",
            MetricType::Counter,
            ConstCounter::new(c.learning),
        )?;
        single(
            &mut encoder,
            "weir_cluster_units_given_back",
            "Lent units this node gave back to their owners",
            MetricType::Counter,
            ConstCounter::new(c.given_back),
        )?;
        single(
            &mut encoder,
            "weir_cluster_units_borrowed",
            "Shared units lent to this node now",
            MetricType::Gauge,
            ConstGauge::new(i64::try_from(c.borrowed).unwrap_or(i64::MAX)),
        )?;
        single(
            &mut encoder,
            "weir_cluster_refused_while_lent",
            "As an owner: requests refused while other nodes held loans of the bucket",
            MetricType::Counter,
            ConstCounter::new(c.refused_while_lent),
        )?;
        family(
            &mut encoder,
            "weir_cluster_units_lent",
            "As an owner: shared units lent out now, by the node holding them",
            MetricType::Gauge,
            self.cluster.lent().into_iter().map(|(peer, units)| {
                (
                    PeerLabel { peer },
                    ConstGauge::new(i64::try_from(units).unwrap_or(i64::MAX)),
                )
            }),
        )?;
        single(
            &mut encoder,
            "weir_cluster_grants_raced",
            "Grants given back because the ring moved their bucket while they were on the way",
            MetricType::Counter,
            ConstCounter::new(c.raced),
        )?;
        family(
            &mut encoder,
            "weir_cluster_rate_decisions",
            "Requests of cluster-scoped rate policies: forwarded (decided by the bucket's owner), forward_failed (decided here, the owner could not), decided_for_others (decided here as the owner)",
            MetricType::Counter,
            [
                ("forwarded", c.forwarded),
                ("forward_failed", c.forward_failed),
                ("decided_for_others", c.decided_for_others),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        family(
            &mut encoder,
            "weir_cluster_rate_buckets_handed",
            "Cluster-scoped rate buckets moved by the ring with their state: handed_over (by this node to the new owner), taken_on (by this node from the previous owner)",
            MetricType::Counter,
            [
                ("handed_over", c.rate_buckets_handed_over),
                ("taken_on", c.rate_buckets_taken_on),
            ]
            .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        single(
            &mut encoder,
            "weir_cluster_rate_learning_decisions",
            "Decisions on cluster-scoped rate buckets this node had owned for less than the policy's learning_period (each bucket held to what it refilled since)",
            MetricType::Counter,
            ConstCounter::new(c.rate_learning),
        )?;
        single(
            &mut encoder,
            "weir_cluster_members",
            "Live members seen by this node",
            MetricType::Gauge,
            ConstGauge::new(self.cluster.members() as i64),
        )?;
        single(
            &mut encoder,
            "weir_cluster_buckets_owned",
            "Buckets whose shared pool this node owns and tracks",
            MetricType::Gauge,
            ConstGauge::new(c.buckets_owned as i64),
        )
    }
}

/// `CL.THROTTLE`'s counters, read at scrape time.
#[derive(Debug)]
struct CellsCollector {
    cells: Arc<Cells>,
}

impl Collector for CellsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (admitted, limited) = self.cells.counts();
        family(
            &mut encoder,
            "weir_cl_throttle_decisions",
            "CL.THROTTLE decisions over the Redis protocol: admitted, limited",
            MetricType::Counter,
            [("admitted", admitted), ("limited", limited)]
                .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        let (sketched, _) = self.cells.sketch_counts();
        single(
            &mut encoder,
            "weir_cl_throttle_sketched",
            "CL.THROTTLE decisions on keys past `[server] resp_max_keys`, made in the sketch",
            MetricType::Counter,
            ConstCounter::new(sketched),
        )?;
        single(
            &mut encoder,
            "weir_cl_throttle_keys",
            "Keys CL.THROTTLE holds now (at most `[server] resp_max_keys`)",
            MetricType::Gauge,
            ConstGauge::new(self.cells.len() as i64),
        )
    }
}

/// Envoy rate limit rules' counters, read at scrape time.
#[derive(Debug)]
struct RlsCollector {
    rls: Arc<Rls>,
}

/// `{domain, rule}`: the rule's path, or the name its metrics ask for (`detailed_metric`,
/// `value_to_metric`). Limits sent with requests count under `rule="override"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

impl Collector for RlsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut rows: Vec<(RuleLabels, [u64; 5])> = Vec::new();
        for (domain, path, counts) in self.rls.counts() {
            rows.push((
                RuleLabels {
                    domain: domain.to_owned(),
                    rule: path.to_owned(),
                },
                counts.rule.read(),
            ));
            let named = counts.named.lock().unwrap_or_else(|p| p.into_inner());
            for (name, counts) in named.iter() {
                rows.push((
                    RuleLabels {
                        domain: domain.to_owned(),
                        rule: name.clone(),
                    },
                    counts.read(),
                ));
            }
        }
        for (domain, counts) in self.rls.override_counts() {
            let read = counts.read();
            if read[0] > 0 {
                rows.push((
                    RuleLabels {
                        domain: domain.to_owned(),
                        rule: "override".to_owned(),
                    },
                    read,
                ));
            }
        }
        let families = [
            (
                "weir_rls_hits",
                "Hits asked of an RLS rule (hits_addend summed)",
            ),
            ("weir_rls_over_limit", "Hits past an RLS rule's limit"),
            (
                "weir_rls_near_limit",
                "Hits between an RLS rule's near-limit mark (`[rls] near_limit_ratio`) and its limit",
            ),
            ("weir_rls_within_limit", "Hits within an RLS rule's limit"),
            (
                "weir_rls_shadow_mode",
                "Hits past the limit of an RLS rule in shadow mode, answered OK",
            ),
        ];
        for (i, (name, help)) in families.into_iter().enumerate() {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Counter,
                rows.iter()
                    .map(|(labels, read)| (labels.clone(), ConstCounter::new(read[i]))),
            )?;
        }
        Ok(())
    }
}
