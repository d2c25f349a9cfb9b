//! `weir`: the throttling server and its tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use weir::SystemClock;
use weir::policy::Scope;
use weir_bench::keys::KeyDistribution;
use weir_bench::run::{self, HoldTime, RunSettings, TargetSpec};
use weir_bench::schedule::Profile;
use weir_bench::target::{CellShape, RespCommand, RlsLoad};
use weir_bench::{plot, scenario};
use weir_server::ConfigFile;
use weir_server::Overrides;
use weir_server::TopOptions;
use weir_server::Traces;
use weir_server::rls::RulesConfig;
use weir_server::rls::policies_of;
use weir_server::{Client, ClientTls};

/// Weir: throttling and admission control for shared backends.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a node (on the embedded default config unless --config is given).
    ///
    /// Every flag can also come from the environment variable named beside it, as container
    /// platforms set them; a flag given on the command line wins. The admin token and the
    /// cluster secret come from WEIR_ADMIN_TOKEN and WEIR_CLUSTER_SECRET (or the config).
    Serve(Box<ServeArgs>),
    /// Shows the keys being held back, like top(1).
    Top {
        /// The server's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        /// Every node's rows.
        #[arg(long)]
        cluster: bool,
        /// The sort column: current_qps, qps_limit, in_flight, waiters, key, policy, kind.
        #[arg(long)]
        sort: Option<String>,
        /// Only this policy.
        #[arg(long)]
        policy: Option<String>,
        /// Refresh every second.
        #[arg(long)]
        watch: bool,
        /// At most this many rows.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[command(flatten)]
        tls: ClientTlsArgs,
    },
    /// Reads or changes a policy on a running server.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
        /// The server's HTTP address.
        #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
        server: String,
        /// The admin token (else WEIR_ADMIN_TOKEN).
        #[arg(long, global = true, env = "WEIR_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(flatten)]
        tls: ClientTlsArgs,
    },
    /// Measures a target under open-loop (or closed-loop) load and reports what it saw.
    Bench(Box<BenchArgs>),
    /// Checks a config file (and the RLS rules it names), or RLS rules alone, and prints every
    /// problem.
    CheckConfig {
        /// The TOML config file (absent: check `--rls-config` alone).
        #[arg(required_unless_present = "rls_config")]
        file: Option<PathBuf>,
        /// RLS rules to check with it, as `serve --rls-config` takes them.
        #[arg(long, value_name = "PATH")]
        rls_config: Option<PathBuf>,
    },
}

/// How `weir top` and `weir config` reach an `https://` server.
#[derive(Debug, clap::Args)]
struct ClientTlsArgs {
    /// An https:// server: the CA certificate to trust (PEM). No other CA is trusted.
    #[arg(long, global = true, value_name = "PATH", env = "WEIR_CACERT")]
    cacert: Option<PathBuf>,
    /// Mutual TLS: the client certificate to present (PEM), with --key.
    #[arg(long, global = true, value_name = "PATH", env = "WEIR_CLIENT_CERT")]
    cert: Option<PathBuf>,
    /// Mutual TLS: the client certificate's key (PEM).
    #[arg(long, global = true, value_name = "PATH", env = "WEIR_CLIENT_KEY")]
    key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// A client of `server` with these settings.
    fn client(self, server: &str, token: Option<String>) -> anyhow::Result<Client> {
        let tls = ClientTls {
            ca: self.cacert,
            cert: self.cert,
            key: self.key,
        };
        Client::with_tls(server, token, &tls)
    }
}

/// `weir bench`'s options.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchArgs {
    /// A named experiment instead of the options below.
    #[command(subcommand)]
    scenario: Option<ScenarioCommand>,
    /// What to measure: `inproc` (the library, on --config's policies), `http`, `grpc`
    /// (unary calls), `grpc-stream` (each client's requests over one stream), `redis` (the
    /// baseline: --config's --policy as a Lua script in the Redis at --server), `rls` (Envoy's
    /// rate limit service: --domain and --descriptor), `redis-rls` (the reference rate limit
    /// server's Redis calls for the same descriptors, by --rls-config's rules), `resp` (Weir's
    /// WEIR.ACQUIRE over the Redis protocol), `cl-throttle` (CL.THROTTLE with --cell's numbers,
    /// to Weir or to a Redis with redis-cell), or `lua-cell` (the same decision as a Lua
    /// script in a plain Redis).
    #[arg(long, default_value = "inproc")]
    target: String,
    /// The cl-throttle and lua-cell targets: `BURST,COUNT,PERIOD` (CL.THROTTLE's numbers).
    #[arg(long, default_value = "100,1000,1")]
    cell: String,
    /// RLS targets: the domain every request names.
    #[arg(long, default_value = "")]
    domain: String,
    /// RLS targets: one descriptor, `key=value,key=value`; `{key}` in a value is the request's
    /// key (repeatable: one descriptor each).
    #[arg(long)]
    descriptor: Vec<String>,
    /// RLS targets: a file of descriptors, one per line as --descriptor takes them.
    #[arg(long, value_name = "PATH")]
    descriptors_file: Option<PathBuf>,
    /// The redis-rls target: the reference server's YAML rules it decides by.
    #[arg(long, value_name = "PATH")]
    rls_config: Option<PathBuf>,
    /// The server (remote targets); several, comma-separated, are asked in turn.
    #[arg(long)]
    server: Option<String>,
    /// The config whose policies the inproc and redis targets run, and whose rates reports
    /// compare admitted rates with (default: the embedded one).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The policy every request names.
    #[arg(long, default_value = "getpage")]
    policy: String,
    /// The kind every request carries.
    #[arg(long, default_value = "")]
    kind: String,
    /// The cost of every request.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Each client's rate, requests per second; 0: closed loop.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Bursts: `FACTOR,ON,EVERY`, e.g. `4,1s,5s` (4× the rate for 1 s of every 5 s).
    #[arg(long)]
    burst: Option<String>,
    /// How many keys.
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// Draw keys zipf-distributed with this exponent (default: uniform).
    #[arg(long)]
    zipf: Option<f64>,
    /// Client `c` always uses key `c mod --keys` (one tenant per client).
    #[arg(long, conflicts_with = "zipf")]
    key_per_client: bool,
    /// The measured time.
    #[arg(long, default_value = "10s", value_parser = weir::duration::parse)]
    duration: std::time::Duration,
    /// Time run first and not counted.
    #[arg(long, default_value = "1s", value_parser = weir::duration::parse)]
    warmup: std::time::Duration,
    /// Concurrency policies: hold each lease this long (`50ms`), or an exponentially
    /// distributed time with this mean (`exp:50ms`), then give it back.
    #[arg(long)]
    hold: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also draw latency percentiles and rates over time into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum ScenarioCommand {
    /// Runs a named experiment, starting and stopping the nodes it needs:
    /// `rate-accuracy` (many buckets at different rates, admitted against configured),
    /// `cluster-rate-accuracy` (cluster-scoped rates over 3 local nodes, against per-node ones),
    /// `opensearch-latency` (two-tier admission latency on a local 3-node cluster),
    /// `neon-throttle` (per-tenant page-read workloads with the node's CPU use),
    /// `doris-backpressure` (adaptive backpressure against a toy busy backend, step-wise and
    /// converging side by side).
    Scenario {
        /// The experiment.
        name: String,
        /// The measured time of each run.
        #[arg(long, default_value = "10s", value_parser = weir::duration::parse)]
        duration: std::time::Duration,
        /// Time run first in each run and not counted.
        #[arg(long, default_value = "1s", value_parser = weir::duration::parse)]
        warmup: std::time::Duration,
        /// How many times each measurement is repeated; the median is reported
        /// (`doris-backpressure` reports every run).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// `doris-backpressure`: also draw both controls' first run into this SVG file.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Serves the frameworks' floor to measure the front doors against: a bare axum
    /// `POST /v1/acquire` that parses Weir's body and answers a fixed admission, and a bare
    /// tonic service of Weir's gRPC API whose `Acquire` and `AcquireStream` answer the same
    /// (see `bench/floor.sh`). Prints `listening http=ADDR grpc=ADDR` and runs until stopped.
    Floor {
        /// The HTTP address (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        http: std::net::SocketAddr,
        /// The gRPC address (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        grpc: std::net::SocketAddr,
    },
}

impl BenchArgs {
    fn settings(self) -> anyhow::Result<RunSettings> {
        let servers = |default: &str| -> Vec<String> {
            self.server
                .as_deref()
                .unwrap_or(default)
                .split(',')
                .map(|server| server.trim().to_owned())
                .filter(|server| !server.is_empty())
                .collect()
        };
        // The policies as --config (or the embedded config) defines them: what the inproc and
        // redis targets run, and what every report compares admitted rates with.
        let config = weir_server::load_config(self.config.as_ref(), &Overrides::default())?;
        let configured = config
            .policy
            .iter()
            .find(|policy| policy.name == self.policy)
            .and_then(|policy| run::configured_rate(policy, &self.kind));
        // An HTTP or gRPC server is a URL: a bare address is told so before any request,
        // rather than failing each one with the client library's words.
        if matches!(
            self.target.as_str(),
            "http" | "grpc" | "grpc-stream" | "rls"
        ) {
            for server in servers("http://127.0.0.1") {
                if !(server.starts_with("http://") || server.starts_with("https://")) {
                    anyhow::bail!(
                        "--server `{server}` has no scheme: give a URL, e.g. --server http://{server}"
                    );
                }
            }
        }
        let target = match self.target.as_str() {
            "inproc" => TargetSpec::InProcess(Box::new(config)),
            "http" => TargetSpec::Http(servers("http://127.0.0.1:8080")),
            "grpc" => TargetSpec::Grpc(servers("http://127.0.0.1:50051")),
            "grpc-stream" => TargetSpec::GrpcStream(servers("http://127.0.0.1:50051")),
            "rls" | "redis-rls" => {
                let mut descriptors = self.descriptor.clone();
                if let Some(file) = &self.descriptors_file {
                    let text = std::fs::read_to_string(file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    descriptors.extend(
                        text.lines()
                            .map(str::trim)
                            .filter(|l| !l.is_empty() && !l.starts_with('#'))
                            .map(str::to_owned),
                    );
                }
                let load = RlsLoad::parse(&self.domain, &descriptors)?;
                if self.target == "rls" {
                    TargetSpec::Rls {
                        servers: servers("http://127.0.0.1:50051"),
                        load,
                    }
                } else {
                    let path = self.rls_config.as_ref().context(
                        "--target redis-rls needs --rls-config (the rules it decides by)",
                    )?;
                    let rules = RulesConfig::load(path).map_err(|errors| {
                        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                        anyhow::anyhow!("{}", list.join("\n"))
                    })?;
                    TargetSpec::RedisFixedWindow {
                        url: self
                            .server
                            .clone()
                            .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()),
                        rules: Box::new(rules),
                        load,
                    }
                }
            }
            "redis" => {
                let policy = config
                    .policy
                    .into_iter()
                    .find(|policy| policy.name == self.policy)
                    .with_context(|| format!("no policy {:?} in the config", self.policy))?;
                TargetSpec::Redis {
                    url: self
                        .server
                        .clone()
                        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()),
                    policy: Box::new(policy),
                }
            }
            "resp" | "cl-throttle" | "lua-cell" => {
                let command = match self.target.as_str() {
                    "resp" => RespCommand::Acquire {
                        policy: self.policy.clone(),
                    },
                    "cl-throttle" => RespCommand::Cell(CellShape::parse(&self.cell)?),
                    _ => RespCommand::LuaCell(CellShape::parse(&self.cell)?),
                };
                TargetSpec::Resp {
                    url: self
                        .server
                        .clone()
                        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()),
                    command,
                }
            }
            other => anyhow::bail!(
                "--target must be inproc, http, grpc, grpc-stream, redis, rls, redis-rls, resp, cl-throttle or lua-cell, not {other:?}"
            ),
        };
        let profile = match self.burst.as_deref() {
            None => Profile::Steady,
            Some(text) => parse_burst(text)?,
        };
        Ok(RunSettings {
            target,
            policy: self.policy,
            kind: self.kind,
            cost: self.cost,
            clients: self.clients,
            rate: self.rate,
            profile,
            keys: self.keys,
            distribution: match (self.key_per_client, self.zipf) {
                (true, _) => KeyDistribution::PerClient,
                (false, Some(s)) => KeyDistribution::Zipf(s),
                (false, None) => KeyDistribution::Uniform,
            },
            duration: self.duration,
            warmup: self.warmup,
            precise_pacing: true,
            progress: true,
            configured,
            hold: match self.hold.as_deref() {
                None => HoldTime::None,
                Some(text) => parse_hold(text)?,
            },
        })
    }
}

/// Parses `DURATION` or `exp:MEAN`.
fn parse_hold(text: &str) -> anyhow::Result<HoldTime> {
    let (exponential, duration) = match text.strip_prefix("exp:") {
        Some(mean) => (true, mean),
        None => (false, text),
    };
    let duration = weir::duration::parse(duration)
        .with_context(|| format!("--hold is DURATION or exp:MEAN (e.g. 50ms), not {text:?}"))?;
    Ok(match exponential {
        true => HoldTime::Exponential(duration),
        false => HoldTime::Fixed(duration),
    })
}

/// Parses `FACTOR,ON,EVERY` (e.g. `4,1s,5s`).
fn parse_burst(text: &str) -> anyhow::Result<Profile> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [factor, on, every] = parts[..] else {
        anyhow::bail!("--burst is FACTOR,ON,EVERY (e.g. 4,1s,5s), not {text:?}");
    };
    let factor: f64 = factor
        .parse()
        .with_context(|| format!("--burst factor {factor:?}"))?;
    let on = weir::duration::parse(on).with_context(|| format!("--burst length {on:?}"))?;
    let every =
        weir::duration::parse(every).with_context(|| format!("--burst period {every:?}"))?;
    if !(factor > 0.0 && factor.is_finite()) || on.is_zero() || on >= every {
        anyhow::bail!("--burst needs a positive factor and 0 < ON < EVERY, not {text:?}");
    }
    Ok(Profile::Burst { factor, on, every })
}

async fn bench(mut args: BenchArgs) -> anyhow::Result<()> {
    if let Some(ScenarioCommand::Floor { http, grpc }) = args.scenario {
        return weir_bench::floor::serve(http, grpc).await;
    }
    if let Some(ScenarioCommand::Scenario {
        name,
        duration,
        warmup,
        runs,
        json,
        plot,
    }) = args.scenario.take()
    {
        if plot.is_some() && name != "doris-backpressure" {
            anyhow::bail!("--plot draws the doris-backpressure scenario only, not {name:?}");
        }
        let settings = scenario::ScenarioSettings {
            duration,
            warmup,
            runs,
            binary: std::env::current_exe().context("finding the weir binary")?,
        };
        let (text, value) = match name.as_str() {
            "rate-accuracy" => {
                let report = scenario::rate_accuracy::rate_accuracy(&settings).await?;
                (report.render(), serde_json::to_value(&report)?)
            }
            "cluster-rate-accuracy" => {
                let report =
                    scenario::cluster_rate_accuracy::cluster_rate_accuracy(&settings).await?;
                (report.render(), serde_json::to_value(&report)?)
            }
            "opensearch-latency" => {
                let report = scenario::opensearch_latency::opensearch_latency(&settings).await?;
                (report.render(), serde_json::to_value(&report)?)
            }
            "owner-throughput" => {
                let report = scenario::owner_throughput::owner_throughput(&settings).await?;
                (report.render(), serde_json::to_value(&report)?)
            }
            "neon-throttle" => {
                let report = scenario::neon_throttle::neon_throttle(&settings).await?;
                (report.render(), serde_json::to_value(&report)?)
            }
            "doris-backpressure" => {
                let report = scenario::doris_backpressure::doris_backpressure(&settings).await?;
                if let Some(path) = &plot {
                    report.plot(path)?;
                }
                (report.render(), serde_json::to_value(&report)?)
            }
            other => anyhow::bail!(
                "no scenario {other:?}: the scenarios are {}",
                scenario::NAMES.join(", ")
            ),
        };
        match json {
            true => println!("{}", serde_json::to_string_pretty(&value)?),
            false => print!("{text}"),
        }
        return Ok(());
    }
    let json = args.json;
    let plot = args.plot.take();
    let settings = args.settings()?;
    let report = run::run(&settings).await?;
    if let Some(path) = plot {
        let title = format!(
            "weir bench: {} policy {}, {} clients × {}/s",
            report.target, settings.policy, settings.clients, settings.rate
        );
        plot::write(&path, &title, &report.timeline)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Prints a policy (or every policy) as JSON.
    Get {
        /// The policy; none: every policy.
        name: Option<String>,
    },
    /// Creates or replaces a policy from a JSON or TOML file (`-` for standard input).
    Set {
        /// The policy.
        name: String,
        /// The policy's fields.
        file: PathBuf,
    },
    /// Deletes a policy.
    Delete {
        /// The policy.
        name: String,
    },
}

/// How `weir serve` writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// For people: a line of text each, coloured on a terminal.
    Text,
    /// For log collectors: one JSON object a line (timestamp, level, target, fields).
    Json,
}

/// `weir serve`'s flags.
#[derive(Debug, clap::Args)]
struct ServeArgs {
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
fn serve_command(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let ServeArgs {
        config,
        data_dir,
        http,
        grpc,
        resp,
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

/// The async runtime the commands run on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// Sets up the logs (`level`, `format`) and, with an `otlp_endpoint`, the trace exporter
/// beside them. Each has its own filter: `--log` says what is logged, and the exporter takes
/// Weir's spans whatever the log level (see `weir_server::traces`).
fn init_logs(
    level: Option<&str>,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
    node_id: &str,
) -> anyhow::Result<Option<Traces>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{Layer as _, fmt};

    let filter = || match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let (traces, exporter) = match otlp_endpoint {
        Some(endpoint) => {
            let (traces, layer) = Traces::start(endpoint, node_id)
                .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
            (Some(traces), Some(layer))
        }
        None => (None, None),
    };
    let text = matches!(format, LogFormat::Text).then(|| {
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter())
    });
    let json = matches!(format, LogFormat::Json).then(|| {
        fmt::layer()
            .json()
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .with_filter(filter())
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
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn check_config(file: Option<&PathBuf>, rls_config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let Some(file) = file else {
        // The rules alone, with the `[rls]` table's defaults.
        let path = rls_config.expect("clap requires FILE or --rls-config");
        let settings = weir_server::rls::RlsTable::default().settings();
        return Ok(match check_rules(&path, &settings) {
            Ok(summary) => {
                println!("{}: ok ({summary})", path.display());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for problem in &problems {
                    println!("{problem}");
                }
                println!("{} problem(s)", problems.len());
                ExitCode::FAILURE
            }
        });
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    match ConfigFile::parse(&text) {
        Ok(config) => {
            // What `weir serve` would refuse at start is a problem too: the same loading (the
            // environment's token and secret included) and the same exposure check.
            let overrides = Overrides {
                rls_config,
                ..Overrides::default()
            };
            let loaded = weir_server::load_config(Some(file), &overrides);
            let loaded = loaded.and_then(|l| {
                weir_server::check_exposure(&l)?;
                weir_server::check_tls(&l)?;
                Ok(l)
            });
            let loaded = match loaded {
                Ok(loaded) => loaded,
                Err(error) => {
                    println!("{}: {error:#}", file.display());
                    println!("1 problem(s)");
                    return Ok(ExitCode::FAILURE);
                }
            };
            let rules = match &loaded.rls.config {
                None => String::new(),
                Some(path) => match check_rules(path, &loaded.rls.settings()) {
                    Ok(summary) => format!(", {summary}"),
                    Err(problems) => {
                        for problem in &problems {
                            println!("{problem}");
                        }
                        println!("{} problem(s)", problems.len());
                        return Ok(ExitCode::FAILURE);
                    }
                },
            };
            println!(
                "{}: ok ({} policies{rules})",
                file.display(),
                config.policy.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => {
            for problem in &problems {
                println!("{}: {problem}", file.display());
            }
            println!("{} problem(s)", problems.len());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Loads the RLS rules at `path` and builds their policies as `serve` builds them (a rate a
/// token bucket cannot hold is found here, not at start): a summary, or every problem.
fn check_rules(
    path: &std::path::Path,
    settings: &weir_server::rls::RlsSettings,
) -> Result<String, Vec<String>> {
    let rules = RulesConfig::load(path)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    let policies = policies_of(&rules, settings, Scope::Node);
    let count = policies.len();
    weir::policy::PolicySet::new(policies, SystemClock::new())
        .map_err(|error| vec![format!("{}: {error}", path.display())])?;
    Ok(format!(
        "{} RLS domain(s), {count} counted rule(s)",
        rules.domains.len()
    ))
}

/// The policy `name` as `weir config set` reads it from `file`: one policy's fields (JSON or
/// TOML), or a config file's shape (`[[policy]]` tables), from which the one named `name` is
/// taken.
fn read_policy(name: &str, file: &PathBuf) -> anyhow::Result<serde_json::Value> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let value = match serde_json::from_str(&text) {
        Ok(json) => json,
        Err(_) => {
            let toml: toml::Value = toml::from_str(&text)
                .with_context(|| format!("{} is neither JSON nor TOML", file.display()))?;
            serde_json::to_value(toml)?
        }
    };
    policy_named(name, value).with_context(|| format!("in {}", file.display()))
}

/// `value` itself if it is one policy; the entry named `name` if it is a config file's shape.
fn policy_named(name: &str, value: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let Some(policies) = value.get("policy").and_then(|p| p.as_array()) else {
        return Ok(value);
    };
    let names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p.get("name").and_then(|n| n.as_str()))
        .collect();
    policies
        .iter()
        .find(|p| p.get("name").and_then(|n| n.as_str()) == Some(name))
        .cloned()
        .with_context(|| {
            format!(
                "no [[policy]] named {name:?} (the file has {})",
                if names.is_empty() {
                    "none with a name".to_owned()
                } else {
                    names.join(", ")
                }
            )
        })
}

async fn config(action: ConfigAction, client: Client) -> anyhow::Result<()> {
    let body = match action {
        ConfigAction::Get { name: Some(name) } => {
            client.get(&format!("/v1/policies/{name}")).await?
        }
        ConfigAction::Get { name: None } => client.get("/v1/policies").await?,
        ConfigAction::Set { name, file } => {
            client
                .put(&format!("/v1/policies/{name}"), &read_policy(&name, &file)?)
                .await?
        }
        ConfigAction::Delete { name } => client.delete(&format!("/v1/policies/{name}")).await?,
    };
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig { file, rls_config } => check_config(file.as_ref(), rls_config),
        Command::Serve(args) => serve_command(*args),
        command => {
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(async move {
                match command {
                    Command::Top {
                        server,
                        cluster,
                        sort,
                        policy,
                        watch,
                        limit,
                        tls,
                    } => {
                        let options = TopOptions {
                            cluster,
                            sort,
                            policy,
                            watch,
                            limit,
                        };
                        weir_server::top(&tls.client(&server, None)?, &options)
                            .await
                            .map(|()| ExitCode::SUCCESS)
                    }
                    Command::Config {
                        action,
                        server,
                        token,
                        tls,
                    } => config(action, tls.client(&server, token)?)
                        .await
                        .map(|()| ExitCode::SUCCESS),
                    Command::Bench(args) => bench(*args).await.map(|()| ExitCode::SUCCESS),
                    Command::CheckConfig { .. } | Command::Serve(_) => {
                        unreachable!("handled above")
                    }
                }
            })
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::error!("{error:#}");
            } else {
                eprintln!("error: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_set_takes_one_policy_or_picks_it_from_a_config_file() {
        let one = serde_json::json!({"name": "p", "strict": {"qps": 5}});
        assert_eq!(policy_named("p", one.clone()).unwrap(), one);
        let file: toml::Value = toml::from_str(
            "[server]\nhttp = \"127.0.0.1:8080\"\n[[policy]]\nname = \"a\"\nstrict = { qps = 1 }\n[[policy]]\nname = \"p\"\nstrict = { qps = 5 }\n",
        )
        .unwrap();
        let file = serde_json::to_value(file).unwrap();
        assert_eq!(
            policy_named("p", file.clone()).unwrap(),
            serde_json::json!({"name": "p", "strict": {"qps": 5}})
        );
        let missing = policy_named("z", file).unwrap_err().to_string();
        assert_eq!(missing, "no [[policy]] named \"z\" (the file has a, p)");
    }
}
