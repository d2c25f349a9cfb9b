//! The targets a run can measure and the client loops that drive them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp1};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::keys::{KeyDistribution, KeySampler};
use super::pacer::{self, Paced, Pacer};
use super::progress::{self, Batch, Live};
use super::redis::RedisTarget;
use super::report::{Report, RequestOutcome, Tally};
use super::schedule::{Profile, Schedule};
use crate::app::{AcquireInput, AcquireOutcome, App, AppSettings};
use crate::config::ConfigFile;
use crate::proto::AcquireRequest;
use crate::proto::weir_client::WeirClient;

/// The most keys a run draws from: each client keeps a counter per key.
pub const MAX_KEYS: u64 = 1_000_000;

/// What a run measures.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetSpec {
    /// The library in this process, on a config's policies.
    InProcess(Box<ConfigFile>),
    /// A server's HTTP API (`http://host:port`).
    Http(String),
    /// A server's gRPC API, unary calls (`http://host:port`).
    Grpc(String),
    /// A server's gRPC API, every client's requests over one bidirectional stream.
    GrpcStream(String),
    /// Several servers, asked in turn (each lease is given back where it came from).
    RoundRobin(Vec<TargetSpec>),
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
pub fn configured_rate(policy: &weir::policy::PolicyConfig, kind: &str) -> Option<f64> {
    if !matches!(
        &policy.limiter,
        weir::policy::Limiter::Keyed(
            weir::policy::KeyedSpec::TokenBucket(_)
                | weir::policy::KeyedSpec::LeakyBucket(_)
                | weir::policy::KeyedSpec::Strict(_)
        )
    ) {
        return None;
    }
    weir::policy::Policy::new(policy.clone(), weir::SystemClock::new())
        .ok()?
        .limit_for(kind)
}

/// One connection (or handle) to the target, owned by one client.
#[derive(Clone)]
enum Target {
    InProcess(Arc<App>),
    Http(reqwest::Client, String),
    Grpc(WeirClient<Channel>),
    GrpcStream(WeirClient<Channel>, StreamSlot),
    RoundRobin(Vec<Target>, usize),
    Redis(Box<RedisTarget>),
}

/// A client's acquisition stream, opened on its first request. A clone (the one a held
/// lease's release task takes) has none: releases go unary.
#[derive(Default)]
struct StreamSlot(Option<Box<OpenStream>>);

struct OpenStream {
    requests: tokio::sync::mpsc::Sender<AcquireRequest>,
    answers: tonic::Streaming<crate::proto::AcquireResponse>,
    next_id: u64,
}

impl Clone for StreamSlot {
    fn clone(&self) -> Self {
        StreamSlot(None)
    }
}

/// A lease to give back, and which of the servers (round robin) gave it.
struct LeaseToGiveBack {
    server: usize,
    id: String,
}

/// An answer: how the request ended, and the lease to give back if it holds one.
type Answer = Result<(RequestOutcome, Option<LeaseToGiveBack>), String>;

/// A gRPC answer as an outcome, its lease (if any) from server 0.
fn grpc_answer(answer: crate::proto::AcquireResponse) -> Answer {
    if !answer.error.is_empty() {
        return Err(answer.error);
    }
    let lease = Some(answer.lease)
        .filter(|lease| !lease.is_empty())
        .map(|id| LeaseToGiveBack { server: 0, id });
    match answer.admitted {
        true => Ok((RequestOutcome::Admitted, lease)),
        false => Ok((RequestOutcome::Throttled, None)),
    }
}

fn grpc_request(input: AcquireInput, id: u64) -> AcquireRequest {
    AcquireRequest {
        policy: input.policy,
        key: input.key,
        kind: input.kind,
        cost: input.cost.unwrap_or(1),
        id,
        ..Default::default()
    }
}

impl Target {
    /// Asks once; an error is one that is not a limiter's refusal, with its message.
    async fn acquire(&mut self, input: AcquireInput) -> Answer {
        match self {
            Target::InProcess(app) => match app.acquire(input).await {
                Ok(AcquireOutcome::Admitted { lease, .. }) => Ok((
                    RequestOutcome::Admitted,
                    lease.map(|(id, _)| LeaseToGiveBack { server: 0, id }),
                )),
                Ok(AcquireOutcome::Refused { .. }) => Ok((RequestOutcome::Throttled, None)),
                Err(error) => Err(error.to_string()),
            },
            Target::Http(client, base) => {
                let body = serde_json::json!({
                    "policy": input.policy, "key": input.key, "kind": input.kind, "cost": input.cost,
                });
                // The key also rides in a header, so a proxy that cannot read the body (the
                // nginx baseline's `limit_req`) can key on it.
                let answer = client
                    .post(format!("{base}/v1/acquire"))
                    .header("x-weir-key", &input.key)
                    .json(&body)
                    .send()
                    .await;
                match answer {
                    Ok(response) => {
                        let status = response.status();
                        let body: serde_json::Value = response.json().await.unwrap_or_default();
                        match status.as_u16() {
                            200..=299 => Ok((
                                RequestOutcome::Admitted,
                                body["lease"].as_str().map(|id| LeaseToGiveBack {
                                    server: 0,
                                    id: id.to_owned(),
                                }),
                            )),
                            429 => Ok((RequestOutcome::Throttled, None)),
                            _ => Err(format!("HTTP {status}: {body}")),
                        }
                    }
                    Err(error) => Err(format!("{error:#}")),
                }
            }
            Target::Grpc(client) => match client.acquire(grpc_request(input, 0)).await {
                Ok(answer) => grpc_answer(answer.into_inner()),
                Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
            },
            Target::GrpcStream(client, slot) => {
                if slot.0.is_none() {
                    let (requests, queued) = tokio::sync::mpsc::channel(16);
                    let answers = client
                        .acquire_stream(tokio_stream::wrappers::ReceiverStream::new(queued))
                        .await
                        .map_err(|status| {
                            format!("gRPC stream {:?}: {}", status.code(), status.message())
                        })?
                        .into_inner();
                    slot.0 = Some(Box::new(OpenStream {
                        requests,
                        answers,
                        next_id: 0,
                    }));
                }
                let stream = slot.0.as_mut().expect("opened above");
                let id = stream.next_id;
                stream.next_id += 1;
                let sent = stream.requests.send(grpc_request(input, id)).await;
                let answer = match sent {
                    Ok(()) => stream.answers.message().await,
                    Err(_) => Ok(None),
                };
                match answer {
                    // One request in flight per client: the next answer is its answer.
                    Ok(Some(answer)) if answer.id == id => grpc_answer(answer),
                    Ok(Some(answer)) => {
                        slot.0 = None;
                        Err(format!(
                            "gRPC stream answered {} to request {id}",
                            answer.id
                        ))
                    }
                    Ok(None) => {
                        slot.0 = None;
                        Err("gRPC stream closed by the server".to_owned())
                    }
                    Err(status) => {
                        slot.0 = None;
                        Err(format!(
                            "gRPC stream {:?}: {}",
                            status.code(),
                            status.message()
                        ))
                    }
                }
            }
            Target::Redis(redis) => {
                match redis.acquire(&input.key, input.cost.unwrap_or(1)).await {
                    Ok((true, lease)) => Ok((
                        RequestOutcome::Admitted,
                        lease.map(|id| LeaseToGiveBack { server: 0, id }),
                    )),
                    Ok((false, _)) => Ok((RequestOutcome::Throttled, None)),
                    Err(error) => Err(format!("redis: {error}")),
                }
            }
            Target::RoundRobin(targets, next) => {
                let server = *next;
                *next = (server + 1) % targets.len();
                let (outcome, lease) = Box::pin(targets[server].acquire(input)).await?;
                Ok((
                    outcome,
                    lease.map(|lease| LeaseToGiveBack { server, ..lease }),
                ))
            }
        }
    }

    /// Gives a lease back (best effort: one that is not given back expires by its TTL).
    async fn release(&mut self, lease: LeaseToGiveBack) {
        match self {
            Target::InProcess(app) => {
                let _ = app.release(&lease.id);
            }
            Target::Http(client, base) => {
                let _ = client
                    .post(format!("{base}/v1/release"))
                    .json(&serde_json::json!({ "lease": lease.id }))
                    .send()
                    .await;
            }
            Target::Grpc(client) | Target::GrpcStream(client, _) => {
                let _ = client
                    .release(crate::proto::ReleaseRequest { lease: lease.id })
                    .await;
            }
            Target::Redis(redis) => {
                let _ = redis.release(&lease.id).await;
            }
            Target::RoundRobin(targets, _) => {
                if let Some(target) = targets.get_mut(lease.server) {
                    Box::pin(target.release(LeaseToGiveBack { server: 0, ..lease })).await;
                }
            }
        }
    }
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
async fn ask(
    target: &mut Target,
    input: AcquireInput,
    holds: &mut Holds,
) -> (Result<RequestOutcome, String>, Instant) {
    let rng = &mut holds.rng;
    let hold = holds.hold;
    let (outcome, lease) = match target.acquire(input).await {
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

/// Connects to a target; its name says what it is (`grpc`, `http×3`).
async fn connect(spec: &TargetSpec) -> anyhow::Result<(Target, String)> {
    Ok(match spec {
        TargetSpec::InProcess(config) => {
            // The app reads a data dir's overlay when it starts and writes only on API
            // changes, which a bench makes none of: an empty dir of its own, removed at once.
            static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let data_dir =
                std::env::temp_dir().join(format!("weir-bench-{}-{run}", std::process::id()));
            let app = App::new(AppSettings {
                node_id: "bench".to_owned(),
                http: config.server.http,
                grpc: config.server.grpc,
                policies: config.policy.clone(),
                data_dir: data_dir.clone(),
                admin_token: None,
                max_cost: config.server.max_cost,
                body_timeout: config.server.body_timeout,
                cluster: None,
            })?;
            let _ = std::fs::remove_dir_all(&data_dir);
            (Target::InProcess(app), "inproc".to_owned())
        }
        TargetSpec::Http(base) => {
            let client = reqwest::Client::builder()
                .build()
                .context("building the HTTP client")?;
            (
                Target::Http(client, base.trim_end_matches('/').to_owned()),
                "http".to_owned(),
            )
        }
        TargetSpec::Grpc(base) | TargetSpec::GrpcStream(base) => {
            let client = WeirClient::connect(base.clone())
                .await
                .with_context(|| format!("connecting to {base}"))?;
            match spec {
                TargetSpec::Grpc(_) => (Target::Grpc(client), "grpc".to_owned()),
                _ => (
                    Target::GrpcStream(client, StreamSlot::default()),
                    "grpc-stream".to_owned(),
                ),
            }
        }
        TargetSpec::Redis { url, policy } => (
            Target::Redis(Box::new(RedisTarget::connect(url, policy).await?)),
            "redis".to_owned(),
        ),
        TargetSpec::RoundRobin(specs) => {
            if specs.is_empty() {
                anyhow::bail!("a round robin needs at least one server");
            }
            let mut targets = Vec::with_capacity(specs.len());
            let mut name = String::new();
            for spec in specs {
                let (target, one) = Box::pin(connect(spec)).await?;
                targets.push(target);
                name = one;
            }
            let name = format!("{name}×{}", specs.len());
            (Target::RoundRobin(targets, 0), name)
        }
    })
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
    let (target, name) = connect(&settings.target).await?;
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
        let mut target = target.clone();
        // Round robins start at different servers, so clients spread from the first request.
        if let Target::RoundRobin(targets, next) = &mut target {
            *next = client % targets.len();
        }
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
    Ok(report)
}

fn input(settings: &RunSettings, key: u64) -> AcquireInput {
    AcquireInput {
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
async fn open_loop(
    mut target: Target,
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
async fn closed_loop(
    mut target: Target,
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
                ConfigFile::parse(include_str!("../default.toml")).unwrap(),
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
        assert_eq!(report.admitted + report.throttled, 120);
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
        assert_eq!((report.admitted, report.throttled), (300, 0));

        s.hold = HoldTime::Fixed(Duration::from_millis(195));
        let report = run(&s).await.unwrap();
        assert_eq!((report.admitted, report.throttled), (150, 150));
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
