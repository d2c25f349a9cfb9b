//! A run: what it measures ([`TargetSpec`]), its settings, and the client loops that drive a
//! [`Target`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp1};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::keys::{KeyDistribution, KeySampler};
use super::pacer::{self, Paced, Pacer};
use super::progress::{self, Batch, Live};
use super::redis::RedisTarget;
use super::report::{Report, RequestOutcome, Tally};
use super::schedule::{Profile, Schedule};
use super::targets::{
    Grpc, GrpcStream, Http, InProcess, RedisFixedWindow, Rls, RlsLoad, RoundRobin, Target,
};
use weir_api::http::AcquireBody;
use weir_server::ConfigFile;

/// The most keys a run draws from: each client keeps a counter per key.
pub const MAX_KEYS: u64 = 1_000_000;

/// What a run measures.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetSpec {
    /// The library in this process, on a config's policies.
    InProcess(Box<ConfigFile>),
    /// Servers' HTTP APIs (`http://host:port`), asked in turn.
    Http(Vec<String>),
    /// Servers' gRPC APIs, unary calls (`http://host:port`), asked in turn.
    Grpc(Vec<String>),
    /// Servers' gRPC APIs, every client's requests over one bidirectional stream, asked in turn.
    GrpcStream(Vec<String>),
    /// Envoy's rate limit service on servers' gRPC ports, asked in turn.
    Rls {
        /// `http://host:port`.
        servers: Vec<String>,
        /// The domain and descriptors every request asks.
        load: RlsLoad,
    },
    /// The reference rate limit server's Redis data path (`INCRBY` + `EXPIRE` per descriptor,
    /// pipelined), deciding by the same rules.
    RedisFixedWindow {
        /// `redis://host:port`.
        url: String,
        /// The rules.
        rules: Box<weir_server::rls::RulesConfig>,
        /// The domain and descriptors every request asks.
        load: RlsLoad,
    },
    /// A server speaking the Redis protocol at `url` (`redis://host:port`): Weir's
    /// `WEIR.ACQUIRE`, or `CL.THROTTLE` (Weir or redis-cell), or redis-cell's decision in Lua.
    Resp {
        /// `redis://host:port`.
        url: String,
        /// What each request asks.
        command: crate::targets::RespCommand,
    },
    /// The Redis baseline: a Lua script at `url` enforcing `policy`'s limiter.
    Redis {
        /// `redis://host:port`.
        url: String,
        /// The policy whose limiter the script enforces.
        policy: Box<weir::policy::PolicyConfig>,
    },
}

/// A run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// What to measure.
    pub target: TargetSpec,
    /// The policy every request names.
    pub policy: String,
    /// The kind every request carries (empty: none).
    pub kind: String,
    /// The cost of every request.
    pub cost: u64,
    /// Concurrent clients.
    pub clients: usize,
    /// Each client's rate in requests per second; 0: closed loop (as fast as answered).
    pub rate: f64,
    /// The shape of the offered load (open loop).
    pub profile: Profile,
    /// How many keys.
    pub keys: u64,
    /// How keys are drawn.
    pub distribution: KeyDistribution,
    /// The measured time.
    pub duration: Duration,
    /// Time run first and not counted.
    pub warmup: Duration,
    /// How long admitted requests hold their leases (concurrency policies).
    pub hold: HoldTime,
    /// Show live progress on standard error.
    pub progress: bool,
    /// Pace open-loop clients from an OS thread (precise to tens of microseconds) rather
    /// than tokio's millisecond timer; off under a paused clock.
    pub precise_pacing: bool,
    /// Each key's configured rate per second, to report admitted against (see
    /// [`configured_rate`]); `None` when unknown or not a rate.
    pub configured: Option<f64>,
}

/// The rate per second `policy` gives each key of `kind`: `None` for in-flight limits,
/// adaptive policies, kinds it does not apply to or does not limit.
pub fn configured_rate(policy: &weir::policy::PolicyConfig, kind: Option<&str>) -> Option<f64> {
    if !matches!(
        &policy.limiter,
        weir::policy::Limiter::Keyed(
            weir::policy::KeyedSpec::TokenBucket(_)
                | weir::policy::KeyedSpec::LeakyBucket(_)
                | weir::policy::KeyedSpec::Strict(_)
                | weir::policy::KeyedSpec::Window(..)
        )
    ) {
        return None;
    }
    weir::policy::Policy::new(policy.clone(), weir::SystemClock::new())
        .ok()?
        .limit_for(kind)
}

/// How long an admitted request holds its lease before giving it back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HoldTime {
    /// Given back at once.
    None,
    /// Held this long.
    Fixed(Duration),
    /// Held for an exponentially distributed time with this mean.
    Exponential(Duration),
}

/// A client's leases being held; each is given back by a task of its own.
struct Holds {
    hold: HoldTime,
    rng: SmallRng,
    releases: JoinSet<()>,
}

impl Holds {
    fn new(hold: HoldTime, seed: u64) -> Self {
        Holds {
            hold,
            rng: SmallRng::seed_from_u64(seed),
            releases: JoinSet::new(),
        }
    }

    /// Waits until every held lease has been given back, so a run leaves nothing held.
    async fn finish(mut self) {
        while self.releases.join_next().await.is_some() {}
    }
}

/// Asks, and gives any lease back after its hold. A held lease is given back by a task of its
/// own, so a client keeps to its schedule while its earlier requests are in flight — which
/// is how an in-flight limit fills up.
///
/// Returns the answer and when the request was done with: after an immediate release, or as it
/// was answered when its lease is held (handing the lease to its task is the generator's own
/// bookkeeping, not the target's time).
async fn ask<T: Target>(
    target: &mut T,
    request: AcquireBody,
    holds: &mut Holds,
) -> (Result<RequestOutcome, String>, Instant) {
    let rng = &mut holds.rng;
    let hold = holds.hold;
    let (outcome, lease) = match target.acquire(request).await {
        Ok(answer) => answer,
        Err(error) => return (Err(error), Instant::now()),
    };
    let mut done = Instant::now();
    if let Some(lease) = lease {
        let held = match hold {
            HoldTime::None => Duration::ZERO,
            HoldTime::Fixed(held) => held,
            HoldTime::Exponential(mean) => {
                let exp = Exp1;
                mean.mul_f64(Distribution::<f64>::sample(&exp, rng))
            }
        };
        if held.is_zero() {
            target.release(lease).await;
            done = Instant::now();
        } else {
            while holds.releases.try_join_next().is_some() {}
            let mut target = target.clone();
            holds.releases.spawn(async move {
                tokio::time::sleep(held).await;
                target.release(lease).await;
            });
        }
    }
    (Ok(outcome), done)
}

/// Runs the load and reports what it saw.
pub async fn run(settings: &RunSettings) -> anyhow::Result<Report> {
    if settings.clients == 0 {
        anyhow::bail!("--clients must be at least 1");
    }
    if !(settings.rate >= 0.0 && settings.rate.is_finite()) {
        anyhow::bail!("--rate must be a number ≥ 0, not {}", settings.rate);
    }
    if settings.duration.is_zero() {
        anyhow::bail!("--duration must be longer than zero");
    }
    if settings.keys > MAX_KEYS {
        anyhow::bail!(
            "--keys must be at most {MAX_KEYS}, not {} (every client counts admissions per key)",
            settings.keys
        );
    }
    KeySampler::new(settings.keys, settings.distribution, 0)?;
    match &settings.target {
        TargetSpec::InProcess(config) => {
            drive(InProcess::start(config)?, "inproc".to_owned(), settings).await
        }
        TargetSpec::Http(servers) => {
            let servers = servers.iter().map(|base| Http::connect(base));
            on_servers(servers.collect::<anyhow::Result<_>>()?, "http", settings).await
        }
        TargetSpec::Grpc(servers) => {
            let mut connected = Vec::with_capacity(servers.len());
            for base in servers {
                connected.push(Grpc::connect(base).await?);
            }
            on_servers(connected, "grpc", settings).await
        }
        TargetSpec::GrpcStream(servers) => {
            let mut connected = Vec::with_capacity(servers.len());
            for base in servers {
                connected.push(GrpcStream::connect(base).await?);
            }
            on_servers(connected, "grpc-stream", settings).await
        }
        TargetSpec::Rls { servers, load } => {
            let mut connected = Vec::with_capacity(servers.len());
            for base in servers {
                connected.push(Rls::connect(base, load.clone()).await?);
            }
            on_servers(connected, "rls", settings).await
        }
        TargetSpec::RedisFixedWindow { url, rules, load } => {
            drive(
                RedisFixedWindow::connect(url, rules, load.clone()).await?,
                "redis-rls".to_owned(),
                settings,
            )
            .await
        }
        TargetSpec::Redis { url, policy } => {
            drive(
                RedisTarget::connect(url, policy).await?,
                "redis".to_owned(),
                settings,
            )
            .await
        }
        TargetSpec::Resp { url, command } => {
            let name = match command {
                crate::targets::RespCommand::Acquire { .. } => "resp",
                crate::targets::RespCommand::Cell(_) => "cl-throttle",
                crate::targets::RespCommand::LuaCell(_) => "lua-cell",
            };
            drive(
                crate::targets::Resp::connect(url, command.clone()).await?,
                name.to_owned(),
                settings,
            )
            .await
        }
    }
}

/// One server as it is, several in turn (reported as `name×n`).
async fn on_servers<T: Target>(
    mut servers: Vec<T>,
    name: &str,
    settings: &RunSettings,
) -> anyhow::Result<Report> {
    if servers.len() == 1 {
        let server = servers.pop().expect("one");
        return drive(server, name.to_owned(), settings).await;
    }
    let servers = RoundRobin::new(servers)?;
    let name = format!("{name}×{}", servers.servers());
    drive(servers, name, settings).await
}

/// Drives the clients against `target` (each with a clone of its own) and gathers the report.
async fn drive<T: Target>(
    target: T,
    name: String,
    settings: &RunSettings,
) -> anyhow::Result<Report> {
    let start = Instant::now() + Duration::from_millis(50);
    let open = settings.rate > 0.0;
    let schedule = Schedule::new(settings.rate.max(f64::MIN_POSITIVE), settings.profile);
    let total = schedule.total(settings.warmup + settings.duration);
    // Open-loop clients are spread over one period so they do not all fire together.
    let starts: Vec<Instant> = (0..settings.clients)
        .map(|c| match open {
            true => start + schedule.due(1).mul_f64(c as f64 / settings.clients as f64),
            false => start,
        })
        .collect();
    let pacers = if open && settings.precise_pacing {
        pacer::spawn_thread(
            starts
                .iter()
                .map(|&start| Paced {
                    start,
                    schedule,
                    total,
                })
                .collect(),
        )
    } else {
        (0..settings.clients).map(|_| Pacer::Timer).collect()
    };
    let live = Arc::new(Live::default());
    let sampler = progress::sample(Arc::clone(&live), settings.progress);
    let mut tasks = Vec::with_capacity(settings.clients);
    for ((client, pacer), client_start) in pacers.into_iter().enumerate().zip(starts) {
        // Round robins start at different servers, so clients spread from the first request.
        let target = target.clone().for_client(client);
        let settings = settings.clone();
        let live = Arc::clone(&live);
        tasks.push(tokio::spawn(async move {
            let keys = KeySampler::new(settings.keys, settings.distribution, client as u64)
                .expect("checked above");
            // Each client draws its own hold times.
            let holds = Holds::new(settings.hold, client as u64);
            if open {
                let clock = ClientClock {
                    start: client_start,
                    measured_from: start + settings.warmup,
                    schedule,
                    total,
                };
                open_loop(target, &settings, keys, holds, pacer, clock, &live).await
            } else {
                closed_loop(target, &settings, keys, holds, start, &live).await
            }
        }));
    }
    let mut total = Tally::new(settings.keys as usize);
    for task in tasks {
        total.merge(&task.await.context("a client task")?);
    }
    let mut report = Report::new(
        &name,
        settings.duration.as_secs_f64(),
        &total,
        settings.configured,
    );
    report.timeline = sampler.finish();
    if let Some(last) = total.last_answer {
        report.span = last
            .saturating_duration_since(start + settings.warmup)
            .as_secs_f64();
    }
    Ok(report)
}

fn input(settings: &RunSettings, key: u64) -> AcquireBody {
    AcquireBody {
        policy: settings.policy.clone(),
        key: format!("key-{key}"),
        kind: settings.kind.clone(),
        cost: Some(settings.cost),
        max_wait_ms: None,
    }
}

/// One open-loop client's timing.
struct ClientClock {
    /// When its first request is due.
    start: Instant,
    /// Requests due before this are warm-up.
    measured_from: Instant,
    schedule: Schedule,
    /// How many requests it is due to send.
    total: u64,
}

/// Sends request `k` at its due time; a request whose slot ended before the client was free
/// is counted as missed and not sent.
async fn open_loop<T: Target>(
    mut target: T,
    settings: &RunSettings,
    mut keys: KeySampler,
    mut holds: Holds,
    mut pacer: Pacer,
    clock: ClientClock,
    live: &Live,
) -> Tally {
    let ClientClock {
        start,
        measured_from,
        schedule,
        total,
    } = clock;
    let mut tally = Tally::new(settings.keys as usize);
    let mut batch = Batch::default();
    let mut reported = Instant::now();
    let mut k = 0;
    while k < total {
        let due = start + schedule.due(k);
        pacer.wait(k, due).await;
        let key = keys.next_index();
        let (outcome, done) = ask(&mut target, input(settings, key), &mut holds).await;
        let latency = (done - due).as_micros() as u64;
        batch.record(RequestOutcome::of(&outcome), latency);
        if due >= measured_from {
            tally.record_answer(key as usize, outcome, latency);
            tally.last_answer = Some(done);
        }
        let now = Instant::now();
        let (next, _) = schedule.skip_missed(k + 1, now - start);
        let next = next.min(total);
        batch.counts.missed += next - (k + 1);
        if batch.latencies.len() >= BATCH || now - reported >= REPORT_EVERY {
            live.add(&mut batch);
            reported = now;
        }
        // Missed slots count when they fall in the measured time.
        tally.counts.missed += (k + 1..next)
            .filter(|&m| start + schedule.due(m) >= measured_from)
            .count() as u64;
        k = next;
    }
    live.add(&mut batch);
    holds.finish().await;
    tally
}

/// How many answers a client gathers before it adds them to the live counts…
const BATCH: usize = 256;
/// …or how long, whichever comes first (open loop; a slow client still shows up each second).
const REPORT_EVERY: Duration = Duration::from_millis(100);

/// Sends requests back to back until the run ends; latency is from each send.
async fn closed_loop<T: Target>(
    mut target: T,
    settings: &RunSettings,
    mut keys: KeySampler,
    mut holds: Holds,
    start: Instant,
    live: &Live,
) -> Tally {
    let measured_from = start + settings.warmup;
    let end = measured_from + settings.duration;
    let mut tally = Tally::new(settings.keys as usize);
    let mut batch = Batch::default();
    let mut reported = Instant::now();
    tokio::time::sleep_until(start).await;
    loop {
        let sent = Instant::now();
        if sent >= end {
            live.add(&mut batch);
            holds.finish().await;
            return tally;
        }
        let key = keys.next_index();
        let (outcome, done) = ask(&mut target, input(settings, key), &mut holds).await;
        let latency = (done - sent).as_micros() as u64;
        batch.record(RequestOutcome::of(&outcome), latency);
        if sent >= measured_from {
            tally.record_answer(key as usize, outcome, latency);
            tally.last_answer = Some(done);
        }
        // Outside the timed span: adding a batch takes a lock and fills a histogram.
        if batch.latencies.len() >= BATCH || done - reported >= REPORT_EVERY {
            live.add(&mut batch);
            reported = done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(rate: f64) -> RunSettings {
        RunSettings {
            target: TargetSpec::InProcess(Box::new(
                ConfigFile::parse(weir_server::DEFAULT_CONFIG).unwrap(),
            )),
            policy: "tables".to_owned(),
            kind: String::new(),
            cost: 1,
            clients: 2,
            rate,
            profile: Profile::Steady,
            keys: 4,
            distribution: KeyDistribution::Uniform,
            duration: Duration::from_secs(3),
            warmup: Duration::from_secs(1),
            precise_pacing: false,
            hold: HoldTime::None,
            progress: false,
            configured: None,
        }
    }

    /// The in-process target on a paused clock: every request is answered before its slot
    /// ends, so every due request in the measured time is sent and none is missed.
    #[tokio::test(start_paused = true)]
    async fn an_open_loop_run_sends_every_request_on_time() {
        let report = run(&settings(20.0)).await.unwrap();
        // 2 clients × 20/s × 3 measured seconds.
        assert_eq!(report.sent, 120);
        assert_eq!(report.missed, 0);
        assert_eq!(report.errors, 0);
        assert_eq!(report.admitted + report.refused, 120);
        assert_eq!(report.target, "inproc");
    }

    /// `search` allows 10 in flight per key. One client at 100/s holding each lease 195 ms
    /// keeps ten in flight, so in every 200 ms it is admitted ten times and refused ten.
    #[tokio::test(start_paused = true)]
    async fn held_leases_fill_an_in_flight_limit() {
        let mut s = settings(100.0);
        s.policy = "search".to_owned();
        s.clients = 1;
        s.keys = 1;
        let report = run(&s).await.unwrap();
        assert_eq!((report.admitted, report.refused), (300, 0));

        s.hold = HoldTime::Fixed(Duration::from_millis(195));
        let report = run(&s).await.unwrap();
        assert_eq!((report.admitted, report.refused), (150, 150));
        assert_eq!(report.missed, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_policy_counts_as_errors() {
        let mut s = settings(10.0);
        s.policy = "nope".to_owned();
        let report = run(&s).await.unwrap();
        assert_eq!(report.errors, report.sent);
        assert_eq!(report.admitted, 0);
        assert!(report.first_error.unwrap().contains("nope"));
    }

    #[tokio::test(start_paused = true)]
    async fn bad_settings_are_refused_by_name() {
        let mut s = settings(10.0);
        s.clients = 0;
        assert_eq!(
            run(&s).await.unwrap_err().to_string(),
            "--clients must be at least 1"
        );
        let mut s = settings(-1.0);
        s.clients = 1;
        assert!(run(&s).await.unwrap_err().to_string().contains("--rate"));
        let mut s = settings(10.0);
        s.keys = MAX_KEYS + 1;
        assert!(
            run(&s)
                .await
                .unwrap_err()
                .to_string()
                .starts_with("--keys must be at most")
        );
    }
}
