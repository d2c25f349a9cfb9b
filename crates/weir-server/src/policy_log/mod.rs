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
mod propose;
pub mod service;
pub mod store;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::error::RaftError;
use openraft::{BasicNode, Raft};
use tokio::sync::watch;

use change::{Change, Outcome};
use machine::{Applied, Machine};
use network::{Connect, Peers, call};
use store::Store;

use crate::log_gate::LogGate;
use identity::{Identity, Verdict};
use propose::FORWARD_WITHIN;
pub use propose::{COMMIT_WITHIN, Refusal};

openraft::declare_raft_types!(
    /// The policy log's Raft types: its entries carry [`Change`]s and answer [`Outcome`]s.
    pub PolicyRaft:
        D = Change,
        R = Outcome,
);

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
        self.voter_ids().len()
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
