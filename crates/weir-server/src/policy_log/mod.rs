//! The cluster's policy changes, agreed by Raft: a change made through any member is proposed
//! to the leader, committed once a majority of the members has it on disk, then applied by
//! every member in the same order ([`change`]). So a change reaches every node, a conditional
//! write is decided once for the whole cluster, and a member that was away catches up.
//!
//! Raft itself is openraft's; Weir brings the log's storage ([`store`], in the data dir), the
//! state machine ([`machine`]: the API's overlay), the calls between members ([`network`],
//! [`service`]) and who is a member ([`members`]: gossip's live members, added and removed by
//! the leader) and which cluster it belongs to ([`identity`]). See `docs/guarantees.md` for
//! what it gives and what a partition does.

pub mod change;
pub mod forget;
pub mod identity;
pub mod machine;
pub mod members;
pub mod network;
pub mod service;
pub mod store;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use change::{Change, Outcome};
use machine::{Applied, Machine};
use network::{Connect, Peers, call};
use store::Store;

use crate::log_gate::LogGate;
use identity::{Identity, Verdict};

openraft::declare_raft_types!(
    /// The policy log's Raft types: its entries carry [`Change`]s and answer [`Outcome`]s.
    pub PolicyRaft:
        D = Change,
        R = Outcome,
);

/// How long a change is retried while no leader with a majority behind it can be found.
pub const PROPOSE_WITHIN: Duration = Duration::from_secs(3);

/// How long a leader waits for a majority to answer its heartbeat before it writes a change: no
/// answer, and nothing is written (a refusal is then final).
pub const CONFIRM_WITHIN: Duration = Duration::from_millis(1000);

/// How long a leader waits for a change it wrote to be committed. Past it, the outcome is
/// unknown: the entry is in the leader's log, and commits if a majority takes it later.
pub const COMMIT_WITHIN: Duration = Duration::from_millis(2000);

/// How long a member waits for the leader's answer to a change it passed on: the leader's own
/// two waits, and the way there and back.
const FORWARD_WITHIN: Duration = Duration::from_millis(3500);

/// A member's id in the log: its node id, hashed (Raft's ids are numbers).
pub fn id_of(node_id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(node_id.as_bytes())
}

/// Why the policy log could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir's database.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// Raft's own checks or start.
    #[error("starting the policy log: {0}")]
    Raft(String),
}

/// Raft's timing for the policy log, the same on every member.
fn raft_config() -> Result<Arc<openraft::Config>, StartError> {
    let config = openraft::Config {
        cluster_name: "weir-policies".to_owned(),
        // A change reaches the followers with the next heartbeat at the latest.
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1000,
        ..Default::default()
    };
    config
        .validate()
        .map(Arc::new)
        .map_err(|e| StartError::Raft(e.to_string()))
}

/// A change committed by the cluster: where it is in the log, and what applying it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Committed {
    /// Its index in the log.
    pub index: u64,
    /// What it did.
    pub outcome: Outcome,
}

/// Why a change was not committed, or a read barrier not given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The member asked is not the leader (it names the one it knows of, if any).
    #[error("this member is not the policy log's leader")]
    NotLeader {
        /// The leader's gRPC address, if known.
        leader: Option<String>,
    },
    /// No leader with a majority behind it could be found in time: this member cannot reach
    /// a majority, or the cluster is electing one. Nothing was written: the change will not
    /// apply.
    #[error(
        "the change was not made: within {within_ms} ms no leader of the cluster's policy log could be reached from this member with a majority behind it ({why}); nothing was written, so it will not apply later. Retry once a majority of the members is back"
    )]
    NoQuorum {
        /// How long it was given.
        within_ms: u64,
        /// What was last seen.
        why: String,
    },
    /// The leader wrote the change to its log, but a majority did not take it in time: it
    /// applies if a majority takes it later (the members come back), and not otherwise.
    #[error(
        "the outcome of the change is unknown: the leader wrote it to its log, but a majority of the members did not confirm it within {within_ms} ms ({why}). It applies if they take it once they are back, and not otherwise: read the policy to learn which"
    )]
    OutcomeUnknown {
        /// How long the leader waited for the commit.
        within_ms: u64,
        /// What was seen.
        why: String,
    },
    /// The member is stopping.
    #[error("the policy log is stopping")]
    Stopped,
    /// This member's part of the log has stopped on an error (a full disk, a failing file)
    /// and is being started again: the change was not proposed.
    #[error(
        "this member's part of the cluster's policy log has stopped ({why}) and is being started again; the change was not made. Send it to another member, or retry once this member is ready again (`/readyz`)"
    )]
    LogStopped {
        /// What stopped it.
        why: String,
    },
    /// The cluster committed the change, but this member did not apply it in time (its log
    /// stopped, or lags): the change stands, and is not acknowledged as applied here.
    #[error(
        "the cluster committed the change (log index {index}), but this member has not applied it within {within_ms} ms (its policy log has stopped or lags behind): it stands on the other members; read it from one of them, or here once this member is ready again (`/readyz`)"
    )]
    NotAppliedHere {
        /// Where it was committed.
        index: u64,
        /// How long this member was given.
        within_ms: u64,
    },
}

/// How often a stopped log core is started again.
pub const RESTART_EVERY: Duration = Duration::from_secs(5);

/// This member's part of the policy log.
pub struct PolicyLog {
    /// Its Raft: replaced when a core that stopped on an error is started again.
    raft: RwLock<Raft<PolicyRaft>>,
    dir: PathBuf,
    /// Where the state machine publishes (kept across restarts of the core).
    published: Arc<watch::Sender<Applied>>,
    /// Why the core has stopped, while it has.
    stopped: watch::Sender<Option<String>>,
    /// Whether [`stop`](Self::stop) was called: the core's end is then no fault.
    stopping: AtomicBool,
    /// Times the core was started again after stopping on an error.
    restarts: AtomicU64,
    /// Failed restarts, logged once a minute.
    failed_restarts: LogGate,
    /// The store, to keep the log's identity in (none while the core is started again).
    store: RwLock<Option<Store>>,
    /// Which cluster's log this is.
    identity: Arc<Identity>,
    /// Calls refused as another cluster's, logged once a minute.
    foreign_calls: LogGate,
    /// Changes made through this member: committed, refused for want of a majority, and of
    /// unknown outcome.
    committed_here: AtomicU64,
    refused_here: AtomicU64,
    unknown_here: AtomicU64,
    /// When each member was last seen alive (who may be forgotten as a voter).
    sightings: forget::Sightings,
    /// A voter unseen this long is forgotten by the leader, in ms (0: never).
    forget_after_ms: AtomicU64,
    /// Gossip's live members, once this member follows them.
    live: std::sync::OnceLock<watch::Receiver<Vec<weir_cluster::membership::NodeInfo>>>,
    node_id: String,
    id: u64,
    address: String,
    applied: watch::Receiver<Applied>,
    peers: Peers,
}

impl std::fmt::Debug for PolicyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyLog")
            .field("id", &self.id)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl PolicyLog {
    /// Starts this member's part: its log and state machine read from `dir`, reaching others
    /// through `connect` with `token`. It serves through [`service`] and joins through
    /// [`members`].
    pub async fn start(
        node_id: &str,
        address: String,
        dir: &Path,
        connect: Connect,
        token: weir_cluster::secret::AttachToken,
    ) -> Result<Arc<PolicyLog>, StartError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StartError::Raft(format!("creating {}: {e}", dir.display())))?;
        let store = Store::open(dir)?;
        let machine = Machine::open(store.clone())?;
        let applied = machine.applied();
        let published = machine.publisher();
        let identity = Arc::new(Identity::new(store.read(identity::RECORD)?));
        let peers = Peers::new(connect, token, Arc::clone(&identity));
        let id = id_of(node_id);
        let raft = Raft::new(id, raft_config()?, peers.clone(), store.clone(), machine)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let log = Arc::new(PolicyLog {
            store: RwLock::new(Some(store)),
            identity,
            foreign_calls: LogGate::new(),
            raft: RwLock::new(raft),
            dir: dir.to_owned(),
            published,
            stopped: watch::Sender::new(None),
            stopping: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            failed_restarts: LogGate::new(),
            committed_here: AtomicU64::new(0),
            refused_here: AtomicU64::new(0),
            unknown_here: AtomicU64::new(0),
            sightings: forget::Sightings::default(),
            forget_after_ms: AtomicU64::new(0),
            live: std::sync::OnceLock::new(),
            node_id: node_id.to_owned(),
            id,
            address,
            applied,
            peers,
        });
        tokio::spawn(Arc::clone(&log).watch_core());
        Ok(log)
    }

    /// Watches the Raft core: when it stops on an error, says so (`/readyz`, `/metrics`, one
    /// log line) and starts it again every [`RESTART_EVERY`] until it runs — its database
    /// opened anew, as redb asks after an I/O error. Ends when the log is stopped.
    async fn watch_core(self: Arc<Self>) {
        loop {
            let mut metrics = self.raft().metrics();
            let ended = metrics
                .wait_for(|m| m.running_state.is_err())
                .await
                .map(|m| m.running_state.clone().err());
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let why = match ended {
                Ok(Some(fatal)) => fatal.to_string(),
                _ => "its core ended".to_owned(),
            };
            tracing::error!(
                "this member's part of the cluster's policy log stopped: {why}. It refuses policy changes and is not ready until it runs again; it is started again every {} s",
                RESTART_EVERY.as_secs()
            );
            self.stopped.send_replace(Some(why));
            loop {
                tokio::time::sleep(RESTART_EVERY).await;
                if self.stopping.load(Ordering::Acquire) {
                    return;
                }
                match self.restart().await {
                    Ok(()) => break,
                    Err(error) => {
                        if let Some(unlogged) = self.failed_restarts.pass() {
                            tracing::warn!(
                                unlogged,
                                "the policy log could not be started again yet (tried every {} s, logged at most once a minute): {error}",
                                RESTART_EVERY.as_secs()
                            );
                        }
                    }
                }
            }
            self.restarts.fetch_add(1, Ordering::Relaxed);
            self.stopped.send_replace(None);
            tracing::info!("this member's part of the cluster's policy log runs again");
        }
    }

    /// Starts the core again on its database, opened anew.
    async fn restart(&self) -> Result<(), StartError> {
        let old = self.raft();
        let _ = old.shutdown().await;
        drop(old);
        // Every handle on the database closed, so that it can be opened again.
        self.store.write().unwrap_or_else(|p| p.into_inner()).take();
        let store = Store::open(&self.dir)?;
        let machine = Machine::reopen(store.clone(), Arc::clone(&self.published))?;
        let raft = Raft::new(
            self.id,
            raft_config()?,
            self.peers.clone(),
            store.clone(),
            machine,
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        *self.raft.write().unwrap_or_else(|p| p.into_inner()) = raft;
        *self.store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
        Ok(())
    }

    /// Which cluster's log this member holds, once known.
    pub fn identity(&self) -> Option<String> {
        self.identity.get()
    }

    /// Keeps `id` as this log's identity: durably first, then in memory.
    fn keep_identity(&self, id: String) -> Result<(), StartError> {
        let store = self.store.read().unwrap_or_else(|p| p.into_inner());
        let store = store
            .as_ref()
            .ok_or_else(|| StartError::Raft("the policy log is being started again".into()))?;
        store.write(identity::RECORD, &id)?;
        self.identity.set(id);
        Ok(())
    }

    /// Judges a call from another member carrying `theirs`: refused if it comes from another
    /// cluster's log; an identity this member lacks is taken from a call of its leader
    /// (`from_leader`: an append or a snapshot).
    fn admit_call(&self, theirs: Option<&str>, from_leader: bool) -> Result<(), String> {
        match identity::judge(self.identity().as_deref(), theirs) {
            Verdict::Same => Ok(()),
            Verdict::Take(id) if from_leader => {
                if let Err(error) = self.keep_identity(id) {
                    tracing::warn!(%error, "could not keep the policy log's identity");
                }
                Ok(())
            }
            Verdict::Take(_) => Ok(()),
            Verdict::Foreign { ours, theirs } => {
                let why = format!(
                    "the caller's policy log is another cluster's (this member's is {ours}, the caller's {theirs}): one of the two data dirs was copied or restored from elsewhere; the member whose log no other member shares stops"
                );
                if let Some(unlogged) = self.foreign_calls.pass() {
                    tracing::error!(unlogged, "refused a policy log call: {why}");
                }
                Err(why)
            }
        }
    }

    /// Why this member's log core has stopped, while it has (it is being started again).
    pub fn stopped(&self) -> Option<String> {
        self.stopped.borrow().clone()
    }

    /// Times the core was started again after stopping on an error.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// What this member has applied, as it changes.
    pub fn applied(&self) -> watch::Receiver<Applied> {
        self.applied.clone()
    }

    /// The leader's gRPC address, as this member knows it.
    pub fn leader(&self) -> Option<String> {
        let metrics = self.raft().metrics().borrow().clone();
        let leader = metrics.current_leader?;
        if leader == self.id {
            return Some(self.address.clone());
        }
        metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|node| node.addr.clone())
    }

    /// Whether this member's log has been started (initialised, or joined by a leader).
    pub async fn started(&self) -> bool {
        self.raft().is_initialized().await.unwrap_or(false)
    }

    /// How many voters this member's log had when it started: more than one, and this node
    /// was a member of a cluster with others before (it joins it again, seeds or not).
    pub async fn voters_before(&self) -> usize {
        // Answered by the Raft core once it has loaded its state and reported it.
        if !self.started().await {
            return 0;
        }
        self.raft()
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .count()
    }

    /// Proposes `change` here, if this member leads: its outcome once committed and applied
    /// here. A leader first hears from a majority ([`CONFIRM_WITHIN`]): one cut off from it
    /// writes nothing, so its refusal is final — else the entry would wait in its log and
    /// commit once the others came back, a change applied after the caller was told no. A
    /// change written but not committed within [`COMMIT_WITHIN`] is
    /// [`Refusal::OutcomeUnknown`].
    pub async fn propose_here(&self, change: Change) -> Result<Committed, Refusal> {
        let raft = self.raft();
        match tokio::time::timeout(CONFIRM_WITHIN, raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)))) => {
                return Err(Refusal::NotLeader {
                    leader: forward.leader_node.map(|node| node.addr),
                });
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(error)))) => {
                return Err(Refusal::NoQuorum {
                    within_ms: 0,
                    why: format!("this member leads, but {error}"),
                });
            }
            Ok(Err(RaftError::Fatal(fatal))) => return Err(self.fatal(&fatal)),
            Err(_) => {
                return Err(Refusal::NoQuorum {
                    within_ms: 0,
                    why: format!(
                        "this member leads, but a majority did not answer its heartbeat within {} ms",
                        CONFIRM_WITHIN.as_millis()
                    ),
                });
            }
        }
        let written = tokio::time::timeout(COMMIT_WITHIN, raft.client_write(change)).await;
        let Ok(written) = written else {
            return Err(Refusal::OutcomeUnknown {
                within_ms: COMMIT_WITHIN.as_millis() as u64,
                why: "the majority answered the leader's heartbeat, then not its write".to_owned(),
            });
        };
        match written {
            Ok(response) => Ok(Committed {
                index: response.log_id.index,
                outcome: response.data,
            }),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(Refusal::NotLeader {
                    leader: forward.leader_node.map(|node| node.addr),
                })
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error))) => {
                Err(Refusal::NoQuorum {
                    within_ms: 0,
                    why: error.to_string(),
                })
            }
            Err(RaftError::Fatal(fatal)) => Err(self.fatal(&fatal)),
        }
    }

    /// The refusal for a call the core answered with `fatal`: stopping, or stopped on an
    /// error.
    fn fatal(&self, fatal: &openraft::error::Fatal<u64>) -> Refusal {
        match self.stopping.load(Ordering::Acquire) {
            true => Refusal::Stopped,
            false => Refusal::LogStopped {
                why: fatal.to_string(),
            },
        }
    }

    /// Proposes `change` through the leader, wherever it is, and waits until it is committed
    /// and applied on this member — at most [`PROPOSE_WITHIN`].
    pub async fn propose(&self, change: Change) -> Result<Committed, Refusal> {
        if let Some(why) = self.stopped() {
            self.refused_here.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::LogStopped { why });
        }
        // Attempts are retried until `PROPOSE_WITHIN` has passed, each bounded by its own
        // waits; one under way is never cut short, so a change a leader wrote is never
        // reported as not written.
        let deadline = std::time::Instant::now() + PROPOSE_WITHIN;
        let outcome = loop {
            let leader = self.leader();
            let outcome = match &leader {
                Some(leader) if *leader == self.address => self.propose_here(change.clone()).await,
                Some(leader) => call(&self.peers, leader, FORWARD_WITHIN, &change, |c, r| {
                    Box::pin(c.propose(r))
                })
                .await
                .unwrap_or_else(|error| Err(forward_failed(&error))),
                None => Err(Refusal::NotLeader { leader: None }),
            };
            let last = match outcome {
                Err(Refusal::NotLeader { leader: moved }) => match (moved, leader) {
                    (Some(moved), _) => format!("the leader moved to {moved}"),
                    (None, _) => "no leader elected".to_owned(),
                },
                Err(Refusal::NoQuorum { why, .. }) => why,
                decided => break decided,
            };
            if std::time::Instant::now() >= deadline {
                break Err(Refusal::NoQuorum {
                    within_ms: PROPOSE_WITHIN.as_millis() as u64,
                    why: last,
                });
            }
            // Until a leader is elected or known: Raft's heartbeat tells the members.
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let committed = outcome.inspect_err(|refusal| {
            let counter = match refusal {
                Refusal::OutcomeUnknown { .. } => &self.unknown_here,
                _ => &self.refused_here,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        })?;
        self.committed_here.fetch_add(1, Ordering::Relaxed);
        if !self.applied_through(committed.index, PROPOSE_WITHIN).await {
            return Err(Refusal::NotAppliedHere {
                index: committed.index,
                within_ms: PROPOSE_WITHIN.as_millis() as u64,
            });
        }
        Ok(committed)
    }

    /// Waits until this member has applied the log through `index`, at most `within`; says
    /// whether it has.
    pub async fn applied_through(&self, index: u64, within: Duration) -> bool {
        let mut applied = self.applied.clone();
        let reached = applied.wait_for(|applied| applied.index >= index);
        matches!(tokio::time::timeout(within, reached).await, Ok(Ok(_)))
    }

    /// The index through which a member must have applied the log to have every change
    /// committed so far: the leader's, asked of whoever is known to lead or else of `others`
    /// (gRPC addresses) in turn.
    pub async fn read_index(&self, others: &[String]) -> Result<u64, Refusal> {
        // Asked from the end: the leader this member knows of first, then the others.
        let mut ask: Vec<String> = others.to_vec();
        ask.extend(self.leader());
        let mut last = "no member answered".to_owned();
        let mut tried = std::collections::BTreeSet::new();
        while let Some(address) = ask.pop() {
            if !tried.insert(address.clone()) {
                continue;
            }
            let answer = if address == self.address {
                self.read_index_here().await
            } else {
                call(
                    &self.peers,
                    &address,
                    Duration::from_secs(1),
                    &(),
                    |c, r| Box::pin(c.read_index(r)),
                )
                .await
                .unwrap_or_else(|error| {
                    Err(Refusal::NoQuorum {
                        within_ms: 0,
                        why: error.to_string(),
                    })
                })
            };
            match answer {
                Ok(index) => return Ok(index),
                Err(Refusal::NotLeader {
                    leader: Some(leader),
                }) => ask.push(leader),
                Err(refusal) => last = refusal.to_string(),
            }
        }
        Err(Refusal::NoQuorum {
            within_ms: 0,
            why: last,
        })
    }

    /// The read barrier, if this member leads: the index committed as of now, confirmed by a
    /// majority still following it.
    pub async fn read_index_here(&self) -> Result<u64, Refusal> {
        match self.raft().get_read_log_id().await {
            Ok((read, _)) => Ok(read.map_or(0, |id| id.index)),
            Err(RaftError::APIError(_)) => Err(Refusal::NotLeader {
                leader: self.leader().filter(|leader| *leader != self.address),
            }),
            Err(RaftError::Fatal(fatal)) => Err(self.fatal(&fatal)),
        }
    }

    /// The log as this member sees it, for `/v1/cluster` and `/metrics`.
    pub fn status(&self) -> weir_api::http::PolicyLogView {
        let metrics = self.raft().metrics().borrow().clone();
        weir_api::http::PolicyLogView {
            leader: self.leader(),
            is_leader: metrics.state.is_leader(),
            term: metrics.current_term,
            applied_index: metrics.last_applied.map_or(0, |id| id.index),
            voters: metrics.membership_config.membership().voter_ids().count(),
            committed_here: self.committed_here.load(Ordering::Relaxed),
            refused_here: self.refused_here.load(Ordering::Relaxed),
            outcome_unknown_here: self.unknown_here.load(Ordering::Relaxed),
            voter_states: self.voter_states(),
        }
    }

    /// Stops this member's part of the log.
    pub async fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.raft().shutdown().await;
    }

    /// This member's Raft, for the service and the membership follower.
    fn raft(&self) -> Raft<PolicyRaft> {
        self.raft.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This member's id and address, as the log knows it.
    fn node(&self) -> (u64, BasicNode) {
        (self.id, BasicNode::new(self.address.clone()))
    }
}

#[cfg(test)]
mod tests;

/// What a change passed on to the leader came to when the call failed: no answer in time
/// leaves its outcome unknown (the leader may have written it); a call that could not be made
/// wrote nothing.
fn forward_failed(error: &network::CallError) -> Refusal {
    let not_sent = match error {
        network::CallError::Address(_) => true,
        // Refused before a byte was sent (nothing listens there, the member is down).
        network::CallError::Status { status, .. } => {
            status.code() == tonic::Code::Unavailable && {
                let mut said = status.message().to_ascii_lowercase();
                let mut source = std::error::Error::source(status);
                while let Some(cause) = source {
                    said.push_str(&cause.to_string().to_ascii_lowercase());
                    source = cause.source();
                }
                said.contains("connect")
            }
        }
        network::CallError::Body { .. } => false,
    };
    if not_sent {
        Refusal::NoQuorum {
            within_ms: 0,
            why: error.to_string(),
        }
    } else {
        Refusal::OutcomeUnknown {
            within_ms: FORWARD_WITHIN.as_millis() as u64,
            why: error.to_string(),
        }
    }
}
