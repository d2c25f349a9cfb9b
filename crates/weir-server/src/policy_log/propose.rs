//! A change proposed: through the leader wherever it is, confirmed by a majority before it is
//! written, committed, and applied on the member that proposed it — or refused, finally, or
//! answered "outcome unknown" when the leader wrote it and a majority did not confirm it in
//! time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};

use super::PolicyLog;
use super::change::{Change, Outcome};
use super::network::{self, call};

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
pub(super) const FORWARD_WITHIN: Duration = Duration::from_millis(3500);

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

impl PolicyLog {
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
    pub(super) fn fatal(&self, fatal: &openraft::error::Fatal<u64>) -> Refusal {
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
}

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
