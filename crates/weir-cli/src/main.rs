//! `weir`: the throttling server and its tools.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use weir_server::TopOptions;
use weir_server::{Client, ClientTls};

mod bench;
mod check_config;
mod cluster;
mod config;
mod serve;

use bench::{BenchArgs, bench};
use check_config::check_config;
use cluster::{ClusterAction, cluster};
use config::{ConfigAction, config};
use serve::{JSON_LOGS, ServeArgs, serve_command};

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
        /// The sort column: current_qps, throttled_qps, qps_limit, in_flight, waiters, key,
        /// policy, kind (with --cluster, keys are ordered by the cluster's totals).
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
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Acts on a running cluster's membership (through any member).
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        #[command(flatten)]
        admin: AdminArgs,
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

/// How `weir config` and `weir cluster` reach a server as its admin.
#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// The server's HTTP address.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    server: String,
    /// The admin token (else WEIR_ADMIN_TOKEN).
    #[arg(long, global = true, env = "WEIR_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

impl AdminArgs {
    /// A client of the server with these settings.
    fn client(self) -> anyhow::Result<Client> {
        self.tls.client(&self.server, self.token)
    }
}

/// How `weir top`, `weir config` and `weir cluster` reach an `https://` server.
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

/// The async runtime the commands run on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
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
                    Command::Config { action, admin } => config(action, admin.client()?)
                        .await
                        .map(|()| ExitCode::SUCCESS),
                    Command::Cluster { action, admin } => cluster(action, admin.client()?)
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
