//! Optional OpenTelemetry traces: spans exported over OTLP/HTTP (protobuf) to a collector.
//!
//! Off unless an endpoint is given (`--otlp-endpoint`, `WEIR_OTLP_ENDPOINT`). The spans are
//! `tracing` spans at the `TRACE` level under two targets — `weir::admission`, one per
//! admission decided (policy, kind, key, cost, then tier and decision; `CL.THROTTLE` and Envoy's
//! `ShouldRateLimit` included), and `weir::cluster`, one per call to another node (owner,
//! call, requests, whether it was reached) — which only
//! the exporter's layer enables. With no exporter nothing enables them, so a decision pays a
//! disabled callsite's check and nothing else; the log filter (`--log`) does not decide what is
//! traced, and traces do not show in the logs.
//!
//! Spans are batched and sent from a thread of the SDK's own (`OTEL_BSP_*` variables tune the
//! batch); a collector that is down costs dropped spans, never a slower decision. A failed
//! export (refused, unreachable, or past `OTEL_EXPORTER_OTLP_TIMEOUT`) is counted in
//! `weir_trace_export_failures_total` and logged, at most once a minute. The resource carries
//! `service.name = "weir"` and `service.instance.id` = the node's id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};

use crate::log_gate::LogGate;

/// The target of the span each admission gets.
pub const ADMISSION_TARGET: &str = "weir::admission";
/// The target of the spans around calls to other nodes.
pub const CLUSTER_TARGET: &str = "weir::cluster";

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The endpoint is not an `http://` URL.
    #[error(
        "the OTLP endpoint {0:?} is not an http:// URL (e.g. http://127.0.0.1:4318; for TLS, send to a collector on the node that forwards over it)"
    )]
    Endpoint(String),
    /// The exporter could not be built.
    #[error("building the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The exporter, kept so that its last spans are sent at exit: dropping it sends them, on
/// every way out (an error, a panic unwinding) — outside the async runtime, since it blocks.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!("the last spans were not all sent: {error}");
        }
    }
}

impl Traces {
    /// An exporter sending to `endpoint` — a collector's OTLP/HTTP base URL
    /// (`http://host:4318`; `/v1/traces` is added unless the URL has a path) — with this
    /// node's id on every span, and the layer that feeds it. Plain HTTP only: a collector
    /// beside the node (an agent, a sidecar) forwards over TLS.
    pub fn start<S>(
        endpoint: &str,
        node_id: &str,
    ) -> Result<(Traces, impl Layer<S> + Send + Sync + 'static), TracesError>
    where
        S: tracing::Subscriber
            + for<'span> tracing_subscriber::registry::LookupSpan<'span>
            + Send
            + Sync,
    {
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .build()?;
        let resource = Resource::builder()
            .with_service_name("weir")
            .with_attribute(opentelemetry::KeyValue::new(
                "service.instance.id",
                node_id.to_owned(),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Counted::new(exporter))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("weir");
        let only_weirs_spans = Targets::new()
            .with_target(ADMISSION_TARGET, LevelFilter::TRACE)
            .with_target(CLUSTER_TARGET, LevelFilter::TRACE);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(only_weirs_spans);
        Ok((Traces { provider }, layer))
    }
}

/// Failed exports so far, in this process: batches, and the spans they carried.
pub fn export_failures() -> (u64, u64) {
    (
        FAILED_BATCHES.load(Ordering::Relaxed),
        FAILED_SPANS.load(Ordering::Relaxed),
    )
}

static FAILED_BATCHES: AtomicU64 = AtomicU64::new(0);
static FAILED_SPANS: AtomicU64 = AtomicU64::new(0);

/// An exporter whose failures are counted and logged: the SDK itself reports them only
/// through its own diagnostics, which nothing here shows.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    failures: LogGate,
}

impl<E> Counted<E> {
    fn new(inner: E) -> Self {
        Counted {
            inner,
            failures: LogGate::new(),
        }
    }

    /// Counts a failed batch of `spans`, and logs it unless one was logged within a minute.
    fn failed(&self, spans: usize, error: &dyn std::fmt::Display) {
        FAILED_BATCHES.fetch_add(1, Ordering::Relaxed);
        FAILED_SPANS.fetch_add(spans as u64, Ordering::Relaxed);
        if self.failures.pass().is_some() {
            let (batches, lost) = export_failures();
            tracing::warn!(
                failed_exports = batches,
                spans_lost = lost,
                "trace spans not exported to the OTLP collector (logged at most once a minute; see weir_trace_export_failures_total): {error}"
            );
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let exported = self.inner.export(batch).await;
        if let Err(error) = &exported {
            self.failed(spans, error);
        }
        exported
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The URL spans are posted to.
fn traces_url(endpoint: &str) -> Result<String, TracesError> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|_| TracesError::Endpoint(endpoint.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(TracesError::Endpoint(endpoint.to_owned()));
    }
    Ok(match uri.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector/otlp/v1/traces").unwrap(),
            "http://collector/otlp/v1/traces"
        );
        let bad = [
            "collector:4318",
            "grpc://collector:4317",
            "https://collector",
            "",
            "http://",
        ];
        for bad in bad {
            assert!(
                matches!(traces_url(bad), Err(TracesError::Endpoint(_))),
                "{bad}"
            );
        }
    }
}
