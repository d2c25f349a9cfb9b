//! What is running, for `/metrics`: the build, the policies in force (as a hash, to tell members
//! apart that run different ones), the process itself, and the trace exporter's failures — each
//! read at scrape time.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use weir::SystemClock;
use weir::policy::PolicySet;

use super::{family, single};

/// What is running: the build (`weir_build_info{version, commit}`) and the policies in force
/// (`weir_config_info{hash}`, the same on every node that runs the same policies).
#[derive(Debug)]
pub(super) struct BuildCollector {
    pub(super) policies: Arc<PolicySet<SystemClock>>,
}

/// `{version, commit}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// `{hash}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HashLabel {
    hash: String,
}

impl Collector for BuildCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        family(
            &mut encoder,
            "weir_build_info",
            "The running build: 1, with its version and commit",
            MetricType::Gauge,
            std::iter::once((
                BuildLabels {
                    version: env!("CARGO_PKG_VERSION"),
                    commit: env!("WEIR_GIT_COMMIT"),
                },
                ConstGauge::new(1),
            )),
        )?;
        family(
            &mut encoder,
            "weir_config_info",
            "The policies in force: 1, with a hash of them all (names and entity tags); members that differ run different policies",
            MetricType::Gauge,
            std::iter::once((
                HashLabel {
                    hash: crate::etag::version_of(&self.policies),
                },
                ConstGauge::new(1),
            )),
        )
    }
}

/// What the policies in force come from, read at scrape time: `(source, policies)` pairs and
/// how many of the config file's policies a change made over the API stands in place of.
pub(crate) type SourceCounts = Box<dyn Fn() -> (Vec<(&'static str, u64)>, u64) + Send + Sync>;

/// Where the policies in force come from (`weir_config_policies{source}`), and the config
/// file's policies replaced or deleted over the API (`weir_config_shadowed_policies`): an edit
/// of the file does not reach those until they are reverted.
pub(crate) struct SourcesCollector(pub(crate) SourceCounts);

impl std::fmt::Debug for SourcesCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcesCollector").finish_non_exhaustive()
    }
}

impl Collector for SourcesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (by_source, shadowed) = (self.0)();
        family(
            &mut encoder,
            "weir_config_policies",
            "Policies in force by where they come from: file (the config file), api (changed or made over the API), rls (the RLS rules)",
            MetricType::Gauge,
            by_source
                .into_iter()
                .map(|(source, n)| (SourceLabel { source }, ConstGauge::new(n as i64))),
        )?;
        single(
            &mut encoder,
            "weir_config_shadowed_policies",
            "Policies of the config file that a change made over the API replaced or deleted: edits of the file do not reach them until reverted (`weir config revert NAME`)",
            MetricType::Gauge,
            ConstGauge::new(shadowed as i64),
        )
    }
}

/// Log lines of the libraries under Weir held back by `log_gate::ForeignLines`, by library.
#[derive(Debug)]
pub(super) struct SuppressedLinesCollector;

/// `{source}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

impl Collector for SuppressedLinesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        family(
            &mut encoder,
            "weir_log_lines_suppressed",
            "Log lines of a library under Weir (`source`: h2, openraft, tonic…) not written because the same line was written less than a minute before",
            MetricType::Counter,
            crate::log_gate::suppressed()
                .into_iter()
                .map(|(source, count)| (SourceLabel { source }, ConstCounter::new(count))),
        )
    }
}

/// The process's own metrics, as Prometheus's client libraries name them, read from `/proc`
/// at scrape time (Linux; elsewhere none).
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    #[cfg(target_os = "linux")]
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        use procfs::process::{LimitValue, Process};
        let Ok(process) = Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = process.stat() {
            let ticks = procfs::ticks_per_second().max(1) as f64;
            single(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                MetricType::Counter,
                ConstCounter::new((stat.utime + stat.stime) as f64 / ticks),
            )?;
            single(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                MetricType::Gauge,
                ConstGauge::new((stat.rss * procfs::page_size()) as i64),
            )?;
            single(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                MetricType::Gauge,
                ConstGauge::new(stat.vsize as i64),
            )?;
            single(
                &mut encoder,
                "process_threads",
                "Number of OS threads in the process",
                MetricType::Gauge,
                ConstGauge::new(stat.num_threads),
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                single(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since the Unix epoch in seconds",
                    MetricType::Gauge,
                    ConstGauge::new(boot as f64 + stat.starttime as f64 / ticks),
                )?;
            }
        }
        if let Ok(open) = process.fd_count() {
            single(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                MetricType::Gauge,
                ConstGauge::new(open as i64),
            )?;
        }
        if let Ok(limits) = process.limits()
            && let LimitValue::Value(max) = limits.max_open_files.soft_limit
        {
            single(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                MetricType::Gauge,
                ConstGauge::new(max as i64),
            )?;
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn encode(&self, _encoder: DescriptorEncoder) -> std::fmt::Result {
        Ok(())
    }
}

/// The trace exporter's failures, kept by [`crate::traces`] (it starts before the metrics).
#[derive(Debug)]
pub(super) struct TraceExportCollector;

impl Collector for TraceExportCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (batches, spans) = crate::traces::export_failures();
        family(
            &mut encoder,
            "weir_trace_export_failures",
            "Trace exports to the OTLP collector that failed (refused, unreachable or timed out), in batches and in the spans they carried, which are lost",
            MetricType::Counter,
            [("batches", batches), ("spans", spans)]
                .map(|(unit, v)| (UnitLabel { unit }, ConstCounter::new(v))),
        )
    }
}

/// `{unit}` of a count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnitLabel {
    unit: &'static str,
}
