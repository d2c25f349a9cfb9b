//! `weir bench`: its options, and a run or a scenario started from them.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use weir_bench::keys::KeyDistribution;
use weir_bench::run::{self, HoldTime, RunSettings};
use weir_bench::schedule::Profile;
use weir_bench::targets::{self, TargetOptions};
use weir_bench::{plot, scenario};
use weir_server::Overrides;

/// `weir bench`'s options.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    /// A named experiment instead of the options below.
    #[command(subcommand)]
    scenario: Option<ScenarioCommand>,
    /// What to measure (each target and what it measures is listed under TARGET).
    #[arg(long, default_value = "inproc", value_parser = target_names())]
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
pub(crate) enum ScenarioCommand {
    /// Runs a named experiment, starting and stopping the nodes it needs (each scenario and what
    /// it measures is listed under NAME).
    Scenario {
        /// The experiment.
        #[arg(value_parser = scenario_names())]
        name: String,
        /// The measured time of each run.
        #[arg(long, default_value = "10s", value_parser = weir::duration::parse)]
        duration: std::time::Duration,
        /// Time run first in each run and not counted.
        #[arg(long, default_value = "1s", value_parser = weir::duration::parse)]
        warmup: std::time::Duration,
        /// How many times each measurement is repeated; the median is reported
        /// (`adaptive-backpressure` reports every run).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// `adaptive-backpressure`: also draw both controls' first run into this SVG file.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// `rolling-restart`: start the nodes on this `weir` binary (a previous release) and
        /// restart each on this one — a rolling upgrade under load.
        #[arg(long, value_name = "PATH")]
        from_binary: Option<PathBuf>,
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
        // The policies as --config (or the embedded config) defines them: what the inproc and
        // redis targets run, and what every report compares admitted rates with.
        let config = weir_server::load_config(self.config.as_ref(), &Overrides::default())?;
        let configured = config
            .policy
            .iter()
            .find(|policy| policy.name == self.policy)
            .and_then(|policy| {
                run::configured_rate(
                    policy,
                    (!self.kind.is_empty()).then_some(self.kind.as_str()),
                )
            });
        let target = targets::spec(
            &self.target,
            &TargetOptions {
                server: self.server,
                config,
                policy: self.policy.clone(),
                cell: self.cell,
                domain: self.domain,
                descriptors: self.descriptor,
                descriptors_file: self.descriptors_file,
                rls_config: self.rls_config,
            },
        )?;
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
pub(crate) fn parse_hold(text: &str) -> anyhow::Result<HoldTime> {
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
pub(crate) fn parse_burst(text: &str) -> anyhow::Result<Profile> {
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

pub(crate) async fn bench(mut args: BenchArgs) -> anyhow::Result<()> {
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
        from_binary,
    }) = args.scenario.take()
    {
        let Some(scenario) = scenario::find(&name) else {
            anyhow::bail!("no scenario {name:?}");
        };
        if plot.is_some() && !scenario.plots {
            anyhow::bail!("--plot draws a scenario that plots; {name:?} does not");
        }
        if from_binary.is_some() && !scenario.upgrades {
            anyhow::bail!(
                "--from-binary starts a scenario that restarts its nodes; {name:?} does not"
            );
        }
        let settings = scenario::ScenarioSettings {
            duration,
            warmup,
            runs,
            binary: std::env::current_exe().context("finding the weir binary")?,
            from_binary,
        };
        let finished = (scenario.run)(&settings, plot.as_deref()).await?;
        let (text, value) = (finished.text, finished.json);
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

/// The scenarios' names for clap: each with what it measures, older names as aliases.
fn scenario_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(scenario::SCENARIOS.iter().map(|s| {
        clap::builder::PossibleValue::new(s.name)
            .help(format!("{} (figures: {})", s.measures, s.figures))
            .aliases(s.aliases.iter().copied())
    }))
}

/// The targets' names for clap, each with what it measures.
fn target_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        targets::TARGETS
            .iter()
            .map(|target| clap::builder::PossibleValue::new(target.name).help(target.measures)),
    )
}
