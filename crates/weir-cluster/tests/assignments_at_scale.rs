//! Rate assignments at scale on turmoil's simulated network: N nodes, from 3 to 50, each an
//! owner and a holder speaking the real gRPC protocol (batched per owner), all asking for one
//! hot cluster-scoped bucket (500 a second, burst 100), together three times as often as it
//! admits (so 500 a second each on 3 nodes, 30 on 50). Each size
//! runs twice: every request forwarded to the bucket's owner, and with assignments (a node
//! reports its demand every 250 ms and decides within the share its owner assigns it). Each
//! run reports the calls one node makes to another per request and per admission, and checks
//! what the cluster admitted against what one bucket admits: over the whole run and over every
//! second.
//!
//! `cargo test -p weir-cluster --test assignments_at_scale -- --nocapture` prints the table
//! that `docs/benchmarks.md` shows.

mod sim_net;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sim_net::Counting;
use tokio::time::Instant;
use weir::policy::{Policy, Request};
use weir::{Clock, TokioClock};
use weir_cluster::assignment::{AssignmentBook, HeldRates, Local, REPORT_EVERY, RateReport, Whole};
use weir_cluster::batch::Batching;
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::rates::{
    Assignment, Decided, Handover, RateAsk, RateDecision, RateOwner, Report, ReportAnswer,
    bucket_of,
};
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::transport::{BoxFuture, TransportExt};

const POLICY: &str = r#"
name = "hot"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 500, burst = 100 }
"#;
const RATE: u64 = 500;
const BURST: u64 = 100;
/// The bucket's shape as the owner lends it: 2 ms a token, 100 of them.
const WHOLE: Whole = Whole {
    interval: 2_000_000,
    capacity: BURST,
};
const KEY: &str = "tenant";
/// The cluster's demand, as a multiple of the rate, spread evenly over the nodes.
const DEMAND: u64 = 3;
/// The load runs from `START` to `END`; admissions are counted in slots of `SLOT`. Calls
/// and requests are also counted from `SETTLED` on, once the first reports have been answered.
const START: Duration = Duration::from_millis(500);
const SETTLED: Duration = Duration::from_millis(1_500);
const END: Duration = Duration::from_millis(3_500);
const SLOT: Duration = Duration::from_millis(100);

type Transport = Batching<Counting<weir_cluster::grpc::GrpcTransport<TokioClock>>>;

/// What every node saw, added up.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    /// Admissions by slot of simulated time since the start.
    admitted: Vec<AtomicU64>,
    calls: Arc<AtomicU64>,
    forwarded: AtomicU64,
}

impl Tally {
    fn admit(&self, origin: Instant) {
        let slot = (origin.elapsed().as_nanos() / SLOT.as_nanos()) as usize;
        self.admitted[slot.min(self.admitted.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }
}

/// One node: its policy's bucket (decided as the owner), its book as the owner, its
/// assignments as a holder.
struct Hot {
    id: String,
    view: Arc<SharedRing>,
    policy: Policy<TokioClock>,
    book: AssignmentBook,
    held: Mutex<HeldRates>,
    assigns: bool,
    tally: Arc<Tally>,
    origin: Instant,
}

impl Hot {
    fn bucket() -> String {
        bucket_of("hot", KEY)
    }

    /// Decides a request as the bucket's owner, setting aside what it lent first.
    fn decide_here(&self) -> bool {
        let now = TokioClock::new().now();
        if let Some(aside) = self.book.decided_here(&Self::bucket(), 1, now) {
            self.policy
                .set_aside(None, KEY, (aside.before, aside.elapsed, aside.after));
        }
        let admitted = self.policy.try_acquire(&Request::new(KEY)).is_ok();
        if admitted {
            self.tally.admit(self.origin);
        }
        admitted
    }

    fn owns(&self) -> bool {
        self.view.is_owner(&Self::bucket(), &self.id)
    }
}

impl RateOwner for Hot {
    fn decide(&self, _ask: RateAsk) -> BoxFuture<'_, RateDecision> {
        Box::pin(async move {
            if !self.owns() {
                return RateDecision::NotOwner;
            }
            RateDecision::Decided(match self.decide_here() {
                true => Decided::Admitted {
                    waited: Duration::ZERO,
                    would_throttle: false,
                    quota: None,
                },
                false => Decided::Refused {
                    retry_after: None,
                    reason: "rate limited".to_owned(),
                    quota: None,
                },
            })
        })
    }

    // The ring never changes here.
    fn take_on(&self, _handover: Handover) {}

    fn report(&self, Report { holder, report }: Report) -> ReportAnswer {
        if !self.owns() {
            return ReportAnswer::NotOwner;
        }
        let now = TokioClock::new().now();
        let (mut assignment, aside) =
            self.book
                .report(&holder, &Self::bucket(), &report, WHOLE, now);
        assignment.tokens =
            self.policy
                .set_aside(None, KEY, (aside.before, aside.elapsed, aside.after));
        ReportAnswer::Assigned(assignment)
    }

    fn handovers(&self, _moving: &mut dyn FnMut(&str) -> bool) -> Vec<Handover> {
        Vec::new()
    }
}

/// One node's requests: one every `every` from `START` to `END`, decided here within an
/// assignment, or forwarded to the owner (counted as demand), or decided here as the owner.
async fn load(hot: Arc<Hot>, transport: Arc<Transport>, every: Duration) {
    let mut ticks = tokio::time::interval_at(hot.origin + START, every);
    while hot.origin.elapsed() < END {
        ticks.tick().await;
        let (hot, transport) = (Arc::clone(&hot), Arc::clone(&transport));
        tokio::spawn(async move {
            hot.tally.requests.fetch_add(1, Ordering::Relaxed);
            let Some(owner) = hot.view.owner_of(&Hot::bucket()).filter(|o| *o != hot.id) else {
                hot.decide_here();
                return;
            };
            if hot.assigns {
                let now = TokioClock::new().now();
                let mut held = hot.held.lock().unwrap();
                match held.take("hot", KEY, &owner, 1, now) {
                    Local::Admitted => {
                        hot.tally.admit(hot.origin);
                        return;
                    }
                    Local::Refused { .. } => return,
                    Local::Forward => held.forwarded("hot", KEY, &owner, 1),
                }
            }
            hot.tally.forwarded.fetch_add(1, Ordering::Relaxed);
            let ask = RateAsk {
                policy: "hot".to_owned(),
                key: KEY.to_owned(),
                kind: None,
                cost: 1,
                max_wait: Duration::ZERO,
                relayed: false,
            };
            if let Ok(RateDecision::Decided(Decided::Admitted { .. })) =
                transport.decide(&owner, ask).await
            {
                // Counted by the owner.
            }
        });
    }
}

/// A holder's reports every `REPORT_EVERY`, and the assignments they are answered with.
async fn report(hot: Arc<Hot>, transport: Arc<Transport>) {
    let mut ticks = tokio::time::interval(REPORT_EVERY);
    loop {
        ticks.tick().await;
        let asked_at = TokioClock::new().now();
        let reports: Vec<(String, RateReport)> = hot.held.lock().unwrap().reports(asked_at);
        for (owner, report) in reports {
            let request = Report {
                holder: hot.id.clone(),
                report: report.clone(),
            };
            let answer = transport.report(&owner, vec![request]).await;
            let assignment = match answer.into_iter().next() {
                Some(Ok(ReportAnswer::Assigned(assignment))) => assignment,
                Some(Err(_)) | None => continue,
                Some(Ok(_)) => Assignment::none(),
            };
            let now = TokioClock::new().now();
            hot.held.lock().unwrap().assigned(
                (&owner, &report.policy, &report.key),
                assignment,
                WHOLE,
                (asked_at, now),
            );
        }
        hot.book.sweep(TokioClock::new().now());
    }
}

/// One run's row.
#[derive(Debug)]
struct Row {
    nodes: usize,
    assigns: bool,
    requests: u64,
    admitted: u64,
    forwarded: u64,
    /// The most admitted over any second (slot-aligned).
    busiest_second: u64,
    /// From `SETTLED` to the end: requests, admitted, calls.
    settled: (u64, u64, u64),
}

fn run(n: usize, assigns: bool) -> Row {
    let ids: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(END + Duration::from_secs(2))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(2))
        .rng_seed(0xa551 + n as u64)
        .build();
    let slots = (END.as_nanos() / SLOT.as_nanos()) as usize + 10;
    let tally = Arc::new(Tally {
        admitted: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        ..Tally::default()
    });
    let ring = Ring::new(
        ids.iter().map(|id| Member::owner(id.clone(), 1)),
        DEFAULT_VNODES,
        1,
    );
    for id in &ids {
        let (id, ids, ring, tally) = (id.clone(), ids.clone(), ring.clone(), Arc::clone(&tally));
        sim.host(id.clone(), move || {
            let (id, ids, tally) = (id.clone(), ids.clone(), Arc::clone(&tally));
            let view = Arc::new(SharedRing::new(ring.clone()));
            async move {
                let owner = Arc::new(Owner::new(
                    &id,
                    Arc::clone(&view),
                    Arc::new(SharedPool::new(16)),
                ));
                let hot = Arc::new(Hot {
                    id: id.clone(),
                    view,
                    policy: Policy::new(toml::from_str(POLICY).unwrap(), TokioClock::new())
                        .unwrap(),
                    book: AssignmentBook::new(16),
                    held: Mutex::new(HeldRates::new()),
                    assigns,
                    tally: Arc::clone(&tally),
                    origin: Instant::now(),
                });
                let transport = Arc::new(Batching::new(Arc::new(Counting {
                    inner: sim_net::transport(ids.iter().map(String::as_str)),
                    calls: Arc::clone(&tally.calls),
                })));
                let deciding: Arc<dyn RateOwner> = Arc::clone(&hot) as Arc<dyn RateOwner>;
                tokio::spawn(async move {
                    let _ = sim_net::serve(owner, Some(deciding)).await;
                });
                if assigns {
                    tokio::spawn(report(Arc::clone(&hot), Arc::clone(&transport)));
                }
                let every = Duration::from_secs(1) * n as u32 / (DEMAND * RATE) as u32;
                load(hot, transport, every).await;
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let count = |tally: &Tally| {
        let admitted: u64 = tally
            .admitted
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum();
        (
            tally.requests.load(Ordering::Relaxed),
            admitted,
            tally.calls.load(Ordering::Relaxed),
        )
    };
    let mut at_settled = None;
    while sim.elapsed() < END + Duration::from_millis(500) {
        sim.step().unwrap();
        if at_settled.is_none() && sim.elapsed() >= SETTLED {
            at_settled = Some(count(&tally));
        }
    }
    let (before, after) = (at_settled.unwrap(), count(&tally));
    let by_slot: Vec<u64> = tally
        .admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    let per_second = (Duration::from_secs(1).as_nanos() / SLOT.as_nanos()) as usize;
    let busiest_second = by_slot
        .windows(per_second)
        .map(|w| w.iter().sum())
        .max()
        .unwrap_or(0);
    Row {
        nodes: n,
        assigns,
        requests: tally.requests.load(Ordering::Relaxed),
        admitted: by_slot.iter().sum(),
        forwarded: tally.forwarded.load(Ordering::Relaxed),
        busiest_second,
        settled: (after.0 - before.0, after.1 - before.1, after.2 - before.2),
    }
}

#[test]
fn with_assignments_a_hot_bucket_costs_a_few_calls_a_second_per_node_and_holds_its_rate() {
    println!(
        "| nodes | mode | requests | admitted | of one bucket | over it | busiest second (bound {}) | forwarded | calls per request (settled) | calls per admission (settled) |",
        BURST + RATE
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // `WEIR_SCALE_NODES=3,10` runs fewer sizes while working on it.
    let sizes: Vec<usize> = std::env::var("WEIR_SCALE_NODES")
        .unwrap_or_else(|_| "3,10,50".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("a number of nodes"))
        .collect();
    // One bucket over the run: its burst, and its rate over the time requests were made and
    // answered.
    let run_bound = BURST + RATE * (END - START).as_secs() + RATE / 100;
    for n in sizes {
        let mut calls = Vec::new();
        for assigns in [false, true] {
            let row = run(n, assigns);
            let (requests, admitted, calls_made) = row.settled;
            let of_rate = row.admitted as f64 / run_bound as f64;
            println!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {:.3} | {:.3} |",
                row.nodes,
                if row.assigns { "assigned" } else { "forwarded" },
                row.requests,
                row.admitted,
                of_rate,
                row.admitted.saturating_sub(run_bound),
                row.busiest_second,
                row.forwarded,
                calls_made as f64 / requests.max(1) as f64,
                calls_made as f64 / admitted.max(1) as f64,
            );
            // What one bucket admits, over any second and over the run.
            assert!(row.busiest_second <= BURST + RATE, "{row:?}");
            assert!(row.admitted <= run_bound, "{row:?}");
            // The demand is three times the rate: the bucket is spent, if less exactly by
            // shares (a node refuses on its share while another's holds a token).
            assert!(of_rate >= 0.7, "{row:?}");
            calls.push(calls_made as f64 / requests.max(1) as f64);
        }
        // A report every 250 ms instead of a call for each of a node's requests.
        assert!(calls[1] * 2.0 < calls[0], "{n} nodes: {calls:?}");
    }
}
