//! `weir serve`: its flags (each also a `WEIR_*` variable), the logs and the trace exporter, a
//! node run until it is stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tracing_subscriber::EnvFilter;
use weir_server::Overrides;
use weir_server::Traces;

use crate::runtime;

/// How `weir serve` writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// For people: a line of text each, coloured on a terminal.
    Text,
    /// For log collectors: one JSON object a line (timestamp, level, target, fields).
    Json,
}

/// `weir serve`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// A TOML config file.
    #[arg(long, env = "WEIR_CONFIG")]
    config: Option<PathBuf>,
    /// Where policy changes made over the API are kept.
    #[arg(long, env = "WEIR_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The HTTP API's address (IP:PORT, or HOST:PORT resolved at start).
    #[arg(long, env = "WEIR_HTTP", value_parser = weir_server::listen_address)]
    http: Option<SocketAddr>,
    /// The gRPC API's address.
    #[arg(long, env = "WEIR_GRPC", value_parser = weir_server::listen_address)]
    grpc: Option<SocketAddr>,
    /// The Redis-protocol listener's address (RESP2 and RESP3: `CL.THROTTLE`, `WEIR.*`).
    #[arg(long, env = "WEIR_RESP", value_parser = weir_server::listen_address)]
    resp: Option<SocketAddr>,
    /// The registered front doors' listeners: `--NAME ADDR` each.
    #[command(flatten)]
    doors: weir_server::DoorListeners,
    /// This node's name.
    #[arg(long, env = "WEIR_NODE_ID")]
    node_id: Option<String>,
    /// Cluster mode: the UDP address to gossip on.
    #[arg(long, env = "WEIR_GOSSIP", value_parser = weir_server::listen_address)]
    gossip: Option<SocketAddr>,
    /// Cluster mode: a node's gossip address to join through (repeatable; in the
    /// environment, comma-separated).
    #[arg(long, env = "WEIR_JOIN", value_delimiter = ',')]
    join: Vec<String>,
    /// Envoy's rate limit service: the reference server's YAML rules (a file, or a
    /// directory of .yaml/.yml files).
    #[arg(long, value_name = "PATH", env = "WEIR_RLS_CONFIG")]
    rls_config: Option<PathBuf>,
    /// TLS on every listener: the certificate chain (PEM), reloaded when it changes.
    #[arg(long, value_name = "PATH", env = "WEIR_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// TLS: the certificate's private key (PEM).
    #[arg(long, value_name = "PATH", env = "WEIR_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: require client certificates signed by this CA (PEM); in cluster mode,
    /// also the CA other nodes are verified by.
    #[arg(long, value_name = "PATH", env = "WEIR_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
    /// Log level or filter (else RUST_LOG, else `info`).
    #[arg(long, env = "WEIR_LOG")]
    log: Option<String>,
    /// OpenTelemetry traces: a collector's OTLP/HTTP address (`http://HOST:4318`); a span per
    /// admission and per call to another node. Off when absent.
    #[arg(long, value_name = "URL", env = "WEIR_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Log lines as `text` (for people) or `json` (one JSON object a line, for collectors).
    #[arg(long, env = "WEIR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `weir serve`: logs and traces set up, the config loaded, the server run on a runtime of
/// its own; the last spans are sent after the runtime has stopped (the exporter blocks).
pub(crate) fn serve_command(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let ServeArgs {
        config,
        data_dir,
        http,
        grpc,
        resp,
        doors,
        node_id,
        gossip,
        join,
        rls_config,
        tls_cert,
        tls_key,
        tls_client_ca,
        log,
        otlp_endpoint,
        log_format,
    } = args;
    // `WEIR_OTLP_ENDPOINT=""` is no endpoint, as `WEIR_JOIN=""` or `a, b,` name no empty seed.
    let otlp_endpoint = otlp_endpoint.filter(|url| !url.trim().is_empty());
    let join = join
        .iter()
        .map(|seed| seed.trim().to_owned())
        .filter(|seed| !seed.is_empty())
        .collect();
    let overrides = Overrides {
        http,
        grpc,
        resp,
        doors,
        data_dir,
        node_id,
        gossip,
        join,
        rls_config,
        tls_cert,
        tls_key,
        tls_client_ca,
    };
    // Loaded before the logs are set up, for the node's id on its spans; a config that does
    // not load is reported after, in the logs' format.
    let file = weir_server::load_config(config.as_ref(), &overrides);
    let node_id = file
        .as_ref()
        .map_or("local", |file| file.server.node_id.as_str());
    // Dropped last, after the runtime: it sends the spans it still holds, blocking.
    let _traces = init_logs(
        log.as_deref(),
        log_format,
        otlp_endpoint.as_deref(),
        node_id,
    )?;
    let file = file?;
    let runtime = runtime()?;
    let served = runtime.block_on(weir_server::serve(file, config));
    // What still runs on the runtime (a file write under way, a name being looked up) gets a
    // moment to end, not for ever; then "stopped" is said when it is true.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if served.is_ok() {
        tracing::info!("stopped");
    }
    served.map(|()| ExitCode::SUCCESS)
}

/// Sets up the logs (`level`, `format`) and, with an `otlp_endpoint`, the trace exporter
/// beside them. Each has its own filter: `--log` says what is logged, and the exporter takes
/// Weir's spans whatever the log level (see `weir_server::traces`).
pub(crate) fn init_logs(
    level: Option<&str>,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
    node_id: &str,
) -> anyhow::Result<Option<Traces>> {
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{Layer as _, fmt};
    use weir_server::ForeignLines;

    // The Raft library behind the cluster's policy log narrates elections and membership
    // changes at INFO and WARN as a matter of course; Weir says what matters of them itself.
    // Its errors still show, and a filter that names `openraft` is taken as written.
    let quiet_raft = |filter: String| match filter.contains("openraft") {
        true => filter,
        false => format!("{filter},openraft=error"),
    };
    let filter = || match level {
        Some(level) => EnvFilter::new(quiet_raft(level.to_owned())),
        None => EnvFilter::new(quiet_raft(
            std::env::var(EnvFilter::DEFAULT_ENV).unwrap_or_else(|_| "info".to_owned()),
        )),
    };
    let (traces, exporter) = match otlp_endpoint {
        Some(endpoint) => {
            let (traces, layer) = Traces::start(endpoint, node_id)
                .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
            (Some(traces), Some(layer))
        }
        None => (None, None),
    };
    // A library's line that an outsider or a lasting fault repeats (an HTTP/2 reset, an
    // unreachable voter) is written once a minute at most, the rest counted in
    // weir_log_lines_suppressed_total.
    let text = matches!(format, LogFormat::Text).then(|| {
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter().and(ForeignLines::new()))
    });
    let json = matches!(format, LogFormat::Json).then(|| {
        fmt::layer()
            .json()
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .with_filter(filter().and(ForeignLines::new()))
    });
    tracing_subscriber::registry()
        .with(exporter)
        .with(text)
        .with(json)
        .init();
    if matches!(format, LogFormat::Json) {
        // Every line a collector reads must parse: a panic and the final error are logged
        // as JSON too, not printed.
        JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
        std::panic::set_hook(Box::new(|panic| tracing::error!(%panic, "panicked")));
    }
    if let Some(endpoint) = otlp_endpoint {
        tracing::info!(endpoint, "exporting traces over OTLP/HTTP");
    }
    Ok(traces)
}

/// Whether logs are JSON lines (`--log-format json`).
pub(crate) static JSON_LOGS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
