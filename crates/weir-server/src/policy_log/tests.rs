//! The policy log simulated: N members in one process, their own storage and state machine,
//! the messages between them carried by [`network`] on a paused clock. It measures how long a
//! change takes to be applied on every member at 3 to 50 members, and checks the history of
//! conflicting conditional writers through restarts and a partition. The figures print with
//! `cargo test -p weir-server --lib policy_log -- --nocapture` (`docs/benchmarks.md`).

mod network;

use std::collections::{BTreeMap, HashMap};

use futures_util::future::join_all;
use openraft::storage::RaftLogReader;
use openraft::{EntryPayload, RaftMetrics};
use tokio::time::Instant;
use weir::policy::PolicyConfig;

use openraft::error::ClientWriteError;

use super::change::{Change, Expect, Outcome, apply};
use super::propose::PROPOSE_WITHIN;
use super::*;
use crate::durable::Overlay;
use crate::etag::etag_of;
use network::{Network, Shared, World};

/// The delay model every simulation here uses: a link of one datacenter. Tokio's timers
/// count whole milliseconds, so a crossing takes 1 ms (no finer latency or jitter would
/// survive the rounding); a leader's fan-out adds 20 µs a message, which shows once it sums
/// past a millisecond.
fn world() -> Shared {
    World::new(Duration::from_millis(1), Duration::from_micros(20))
}

fn policy(name: &str, qps: u64) -> PolicyConfig {
    toml::from_str(&format!("name = \"{name}\"\nstrict = {{ qps = {qps} }}")).unwrap()
}

/// What a proposal came to, as its caller saw it.
// Held by the hundred in a test: size does not matter, as for `Outcome` itself.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// Committed at this index with this outcome.
    Committed(u64, Outcome),
    /// No answer in time, or the member went away: it may or may not be in the log.
    Unknown,
}

/// The simulated members.
struct Sim {
    world: Shared,
    dirs: tempfile::TempDir,
    ids: Vec<u64>,
    applied: HashMap<u64, watch::Receiver<machine::Applied>>,
    /// Each member's log, while it is up.
    logs: HashMap<u64, Store>,
}

impl Sim {
    /// `n` members, all voters from the start, with a leader elected.
    async fn new(n: u64) -> Sim {
        let mut sim = Sim {
            world: world(),
            dirs: tempfile::tempdir().unwrap(),
            ids: (1..=n).collect(),
            applied: HashMap::new(),
            logs: HashMap::new(),
        };
        for id in sim.ids.clone() {
            sim.start(id).await;
        }
        let members: BTreeMap<u64, BasicNode> = sim
            .ids
            .iter()
            .map(|&id| (id, BasicNode::new(format!("member-{id}"))))
            .collect();
        sim.raft(1).unwrap().initialize(members).await.unwrap();
        sim.settle().await;
        sim
    }

    /// Starts member `id` on its data dir (again, after [`Sim::stop`]).
    async fn start(&mut self, id: u64) {
        let dir = self.dirs.path().join(id.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(&dir).unwrap();
        let machine = Machine::open(store.clone()).unwrap();
        self.applied.insert(id, machine.applied());
        self.logs.insert(id, store.clone());
        let network = Network {
            me: id,
            world: self.world.clone(),
        };
        let raft = Raft::new(id, raft_config().unwrap(), network, store, machine)
            .await
            .unwrap();
        self.lock().up.insert(id, raft);
    }

    /// Stops member `id` as a process stops: whatever it had on disk stays.
    async fn stop(&mut self, id: u64) {
        self.logs.remove(&id);
        let raft = self.lock().up.remove(&id);
        if let Some(raft) = raft {
            raft.shutdown().await.unwrap();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        network::lock(&self.world)
    }

    fn raft(&self, id: u64) -> Option<Raft<PolicyRaft>> {
        self.lock().up.get(&id).cloned()
    }

    fn up(&self) -> Vec<u64> {
        let mut up: Vec<u64> = self.lock().up.keys().copied().collect();
        up.sort_unstable();
        up
    }

    /// Waits until a member that is up leads with every member up behind it, and every member
    /// up has applied all it committed; returns the leader and that index.
    async fn settle(&self) -> (u64, u64) {
        let up = self.up();
        let leads = |m: &RaftMetrics<u64, BasicNode>| {
            m.state.is_leader()
                && m.replication
                    .as_ref()
                    .is_some_and(|r| up.iter().all(|id| *id == m.id || r.contains_key(id)))
        };
        let waits = up.iter().map(|&id| {
            let mut metrics = self.raft(id).unwrap().metrics();
            async move {
                let _ = metrics.wait_for(|m| leads(m)).await;
                id
            }
        });
        let (leader, _, _) = tokio::time::timeout(
            Duration::from_secs(30),
            futures_util::future::select_all(waits.map(Box::pin)),
        )
        .await
        .expect("a leader elected with every member up behind it");
        let index = self.raft(leader).unwrap().metrics().borrow().last_log_index;
        let index = index.unwrap_or(0);
        self.applied_on(&up, index).await;
        (leader, index)
    }

    /// Waits until each of `members` has applied the log through `index`; returns when each
    /// did, in order.
    async fn applied_on(&self, members: &[u64], index: u64) -> Vec<Instant> {
        let waits = members.iter().map(|id| {
            let mut applied = self.applied[id].clone();
            async move {
                let reached = applied.wait_for(|a| a.index >= index);
                tokio::time::timeout(Duration::from_secs(30), reached)
                    .await
                    .unwrap_or_else(|_| panic!("member {id} did not apply {index}"))
                    .unwrap();
                Instant::now()
            }
        });
        join_all(waits).await
    }

    /// What member `id` has applied.
    fn overlay(&self, id: u64) -> Arc<Overlay> {
        self.applied[&id].borrow().overlay.clone()
    }

    /// Proposes `change` through member `via` as a real member does: to the leader it knows
    /// of (a forward crossing the network both ways), again while the leader moves, at most
    /// [`PROPOSE_WITHIN`], as a real member's.
    async fn propose(&self, via: u64, change: Change) -> Answer {
        let attempt = async {
            loop {
                let Some(own) = self.raft(via) else {
                    return Answer::Unknown;
                };
                let leader = own.metrics().borrow().current_leader;
                let target = match leader {
                    Some(leader) if leader == via => Some(own),
                    Some(leader) if self.lock().linked(via, leader) => self.raft(leader),
                    _ => None,
                };
                let forwarded = leader != Some(via);
                if let Some(target) = target {
                    let latency = self.lock().latency;
                    if forwarded {
                        tokio::time::sleep(latency).await;
                    }
                    match target.client_write(change.clone()).await {
                        Ok(response) => {
                            if forwarded {
                                tokio::time::sleep(latency).await;
                            }
                            return Answer::Committed(response.log_id.index, response.data);
                        }
                        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {}
                        Err(_) => return Answer::Unknown,
                    }
                }
                // Until a leader is known: as a real member retries.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(PROPOSE_WITHIN, attempt)
            .await
            .unwrap_or(Answer::Unknown)
    }
}

fn put(config: PolicyConfig, if_match: Option<String>) -> Change {
    Change::Put {
        config,
        expect: Expect {
            if_match,
            base: None,
        },
    }
}

/// The p-th percentile of `times`, in milliseconds.
fn percentile(times: &mut [Duration], p: f64) -> f64 {
    times.sort_unstable();
    let at = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[at].as_secs_f64() * 1000.0
}

#[tokio::test(start_paused = true)]
async fn a_change_is_applied_on_every_member_within_a_few_round_trips_from_3_to_50_members() {
    const CHANGES: u64 = 100;
    println!("members | answered p50 / p99 | applied on all p50 / p99 / max (simulated ms)");
    for n in [3, 10, 25, 50] {
        let sim = Sim::new(n).await;
        let mut answered = Vec::new();
        let mut on_all = Vec::new();
        for change in 0..CHANGES {
            // Through each member in turn: most are forwarded to the leader.
            let via = sim.ids[(change % n) as usize];
            let started = Instant::now();
            let answer = sim
                .propose(via, put(policy("global", change + 1), None))
                .await;
            let Answer::Committed(index, Outcome::Written { .. }) = answer else {
                panic!("change {change} through {via} at {n} members: {answer:?}");
            };
            answered.push(started.elapsed());
            let applied = sim.applied_on(&sim.ids, index).await;
            on_all.push(applied.iter().max().unwrap().duration_since(started));
            for id in &sim.ids {
                assert_eq!(
                    sim.overlay(*id).upserts["global"],
                    policy("global", change + 1),
                    "member {id} at {n} members"
                );
            }
        }
        println!(
            "{n} | {:.2} / {:.2} | {:.2} / {:.2} / {:.2}",
            percentile(&mut answered, 0.5),
            percentile(&mut answered, 0.99),
            percentile(&mut on_all, 0.5),
            percentile(&mut on_all, 0.99),
            percentile(&mut on_all, 1.0),
        );
        for id in sim.ids.clone() {
            sim.raft(id).unwrap().shutdown().await.unwrap();
        }
    }
}

/// One conditional write, as its writer made it and saw it answered.
#[derive(Debug)]
struct Attempt {
    round: u64,
    change: Change,
    answer: Answer,
}

/// What happens to the members before a round (and is undone after it).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// A follower is stopped for the round, then started again on its data dir.
    RestartFollower,
    /// The leader is stopped for the round, then started again on its data dir.
    RestartLeader,
    /// The leader and one follower are cut off from the others for the round.
    PartitionLeader,
    /// Two followers are cut off from the others for the round.
    PartitionFollowers,
}

#[tokio::test(start_paused = true)]
async fn conflicting_writers_through_restarts_and_a_partition_lose_nothing_and_win_once() {
    const MEMBERS: u64 = 5;
    const ROUNDS: u64 = 40;
    let mut sim = Sim::new(MEMBERS).await;
    let (leader, _) = sim.settle().await;
    let first = sim.propose(leader, put(policy("p", 1), None)).await;
    assert!(matches!(
        first,
        Answer::Committed(_, Outcome::Written { .. })
    ));
    let mut attempts = Vec::new();
    let mut winners_per_round = Vec::new();
    for round in 0..ROUNDS {
        let (leader, _) = sim.settle().await;
        let followers: Vec<u64> = sim.ids.iter().copied().filter(|&id| id != leader).collect();
        let fault = match round % 5 {
            1 => Fault::RestartFollower,
            2 => Fault::RestartLeader,
            3 => Fault::PartitionLeader,
            4 => Fault::PartitionFollowers,
            _ => Fault::None,
        };
        let mut stopped = None;
        match fault {
            Fault::None => {}
            Fault::RestartFollower => stopped = Some(followers[round as usize % 4]),
            Fault::RestartLeader => stopped = Some(leader),
            Fault::PartitionLeader => {
                let side = [leader, followers[0]];
                sim.lock().partition(&side, &sim.ids);
            }
            Fault::PartitionFollowers => {
                let side = [followers[0], followers[1]];
                sim.lock().partition(&side, &sim.ids);
            }
        }
        if let Some(id) = stopped {
            sim.stop(id).await;
        }
        // Every writer read the same version (all members had applied it) and writes against
        // it through its own member at once.
        let read = etag_of(&sim.overlay(leader).upserts["p"]);
        let writers = sim.up();
        let writes = writers.iter().enumerate().map(|(i, &via)| {
            let change = put(policy("p", round * 10 + i as u64 + 2), Some(read.clone()));
            let sim = &sim;
            async move {
                let answer = sim.propose(via, change.clone()).await;
                Attempt {
                    round,
                    change,
                    answer,
                }
            }
        });
        let answered = join_all(writes).await;
        let won = answered
            .iter()
            .filter(|a| matches!(a.answer, Answer::Committed(_, Outcome::Written { .. })))
            .count();
        assert!(won <= 1, "round {round} ({fault:?}): {answered:?}");
        if matches!(fault, Fault::None | Fault::RestartFollower) {
            assert_eq!(won, 1, "round {round} ({fault:?}): {answered:?}");
        }
        winners_per_round.push((fault, won));
        attempts.extend(answered);
        sim.lock().cut.clear();
        if let Some(id) = stopped {
            sim.start(id).await;
        }
    }
    let (leader, committed) = sim.settle().await;
    let overlays: Vec<Arc<Overlay>> = sim.ids.iter().map(|&id| sim.overlay(id)).collect();
    assert!(overlays.iter().all(|o| *o == overlays[0]), "members agree");
    // The history, from the leader's log: replayed, it decides every write as its writer was
    // told, and no version has two winners.
    let mut store = sim.logs[&leader].clone();
    let entries = store.try_get_log_entries(1..=committed).await.unwrap();
    for id in sim.ids.clone() {
        sim.stop(id).await;
    }
    let mut overlay = Overlay::default();
    let mut decided: BTreeMap<u64, (Change, Outcome)> = BTreeMap::new();
    let mut winners: BTreeMap<Option<String>, u64> = BTreeMap::new();
    for entry in entries {
        if let EntryPayload::Normal(change) = entry.payload {
            let outcome = apply(&mut overlay, change.clone());
            if let (Change::Put { expect, .. }, Outcome::Written { .. }) = (&change, &outcome) {
                *winners.entry(expect.if_match.clone()).or_default() += 1;
            }
            decided.insert(entry.log_id.index, (change, outcome));
        }
    }
    assert_eq!(
        overlay, *overlays[0],
        "the replayed log is what every member holds"
    );
    for (tag, won) in &winners {
        assert_eq!(*won, 1, "version {tag:?} won {won} times");
    }
    let (mut acknowledged, mut refused, mut unknown) = (0, 0, 0);
    for attempt in &attempts {
        match &attempt.answer {
            Answer::Committed(index, outcome) => {
                let logged = decided.get(index).cloned();
                assert_eq!(
                    logged,
                    Some((attempt.change.clone(), outcome.clone())),
                    "round {}: the answer given is the log's",
                    attempt.round
                );
                match outcome {
                    Outcome::Written { .. } => acknowledged += 1,
                    _ => refused += 1,
                }
            }
            Answer::Unknown => unknown += 1,
        }
    }
    let rounds_won = winners_per_round
        .iter()
        .filter(|(_, won)| *won == 1)
        .count();
    println!(
        "{ROUNDS} rounds of {MEMBERS} conditional writers, a fault in 4 of 5 rounds \
         (follower or leader restarted, leader or followers cut off): {acknowledged} \
         acknowledged, {refused} refused (412), {unknown} unanswered; {rounds_won} rounds \
         with one winner, none with two; {} versions written, each once; {} entries replayed",
        winners.len(),
        decided.len()
    );
    for fault in [
        Fault::None,
        Fault::RestartFollower,
        Fault::RestartLeader,
        Fault::PartitionLeader,
        Fault::PartitionFollowers,
    ] {
        let of: Vec<usize> = winners_per_round
            .iter()
            .filter(|(f, _)| *f == fault)
            .map(|(_, won)| *won)
            .collect();
        println!(
            "  {fault:?}: {} rounds, {} with a winner",
            of.len(),
            of.iter().sum::<usize>()
        );
    }
}
