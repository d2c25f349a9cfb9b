//! The policy log's state machine: the API's overlay as the committed changes make it, what it
//! has applied up to, and the members' Raft membership. Each apply is published, so the node
//! lays the new overlay over its config file at once and a write's caller can wait until its
//! own node has applied it.
//!
//! The overlay lives in memory; what makes it durable is the log (its committed entries are
//! applied again at start) and the snapshot kept beside it, which lets the log be trimmed.

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::PolicyRaft;
use super::change::{Outcome, apply};
use super::store::Store;
use crate::durable::Overlay;

/// What the state machine holds: also its snapshot's form.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    overlay: Overlay,
}

/// What the state machine has applied, as published to the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// The index of the last entry applied (0: none).
    pub index: u64,
    /// The overlay as of it.
    pub overlay: Arc<Overlay>,
}

/// A snapshot as stored: its meta and its bytes.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
}

const SNAPSHOT: &str = "snapshot";

/// The state machine (cheap to clone: the clones share one state).
#[derive(Debug, Clone)]
pub struct Machine {
    state: Arc<Mutex<State>>,
    store: Store,
    published: Arc<watch::Sender<Applied>>,
}

fn failed(error: impl std::error::Error + 'static) -> AnyError {
    AnyError::new(&error)
}

impl Machine {
    /// The state machine as of `store`'s last snapshot (the entries committed after it are
    /// applied again by Raft at start).
    pub fn open(store: Store) -> Result<Machine, super::store::StoreError> {
        let state = Machine::read_snapshot(&store)?;
        let published = watch::Sender::new(Applied {
            index: state.last_applied.map_or(0, |id| id.index),
            overlay: Arc::new(state.overlay.clone()),
        });
        Ok(Machine {
            state: Arc::new(Mutex::new(state)),
            store,
            published: Arc::new(published),
        })
    }

    /// The state machine as of `store`'s last snapshot, publishing to `published`: a log core
    /// started again keeps its node's subscribers. What it applies again up to what was
    /// already published is not published a second time (see [`publish`](Self::publish)).
    pub fn reopen(
        store: Store,
        published: Arc<watch::Sender<Applied>>,
    ) -> Result<Machine, super::store::StoreError> {
        let state = Machine::read_snapshot(&store)?;
        Ok(Machine {
            state: Arc::new(Mutex::new(state)),
            store,
            published,
        })
    }

    /// Where this machine publishes what it applies.
    pub fn publisher(&self) -> Arc<watch::Sender<Applied>> {
        Arc::clone(&self.published)
    }

    fn read_snapshot(store: &Store) -> Result<State, super::store::StoreError> {
        Ok(match store.read::<StoredSnapshot>(SNAPSHOT)? {
            Some(snapshot) => serde_json::from_slice(&snapshot.data)?,
            None => State::default(),
        })
    }

    /// What has been applied, as it changes.
    pub fn applied(&self) -> watch::Receiver<Applied> {
        self.published.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, state: &State) {
        let index = state.last_applied.map_or(0, |id| id.index);
        self.published.send_if_modified(|applied| {
            // Behind what was published: a restarted core applying the log again from its
            // snapshot. Publishing it would lay an older overlay over the node for a moment.
            if index < applied.index
                || (applied.index == index && *applied.overlay == state.overlay)
            {
                return false;
            }
            *applied = Applied {
                index,
                overlay: Arc::new(state.overlay.clone()),
            };
            true
        });
    }
}

impl RaftSnapshotBuilder<PolicyRaft> for Machine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<PolicyRaft>, StorageError<u64>> {
        let state = self.lock().clone();
        let data = serde_json::to_vec(&state)
            .map_err(|e| StorageIOError::write_snapshot(None, failed(e)))?;
        let meta = SnapshotMeta {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
            snapshot_id: state.last_applied.map_or_else(
                || "0-0".to_owned(),
                |id| format!("{}-{}", id.leader_id, id.index),
            ),
        };
        self.store
            .write(
                SNAPSHOT,
                &StoredSnapshot {
                    meta: meta.clone(),
                    data: data.clone(),
                },
            )
            .map_err(|e| StorageIOError::write_snapshot(None, failed(e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<PolicyRaft> for Machine {
    type SnapshotBuilder = Machine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let state = self.lock();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<PolicyRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut state = self.lock();
        let mut outcomes = Vec::new();
        for entry in entries {
            state.last_applied = Some(entry.log_id);
            outcomes.push(match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Normal(change) => apply(&mut state.overlay, change),
                EntryPayload::Membership(membership) => {
                    state.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Outcome::Nothing
                }
            });
        }
        self.publish(&state);
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let mut installed: State = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), failed(e)))?;
        installed.last_applied = meta.last_log_id;
        installed.membership = meta.last_membership.clone();
        self.store
            .write(
                SNAPSHOT,
                &StoredSnapshot {
                    meta: meta.clone(),
                    data,
                },
            )
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), failed(e)))?;
        let mut state = self.lock();
        *state = installed;
        self.publish(&state);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<PolicyRaft>>, StorageError<u64>> {
        let stored = self
            .store
            .read::<StoredSnapshot>(SNAPSHOT)
            .map_err(|e| StorageIOError::read_snapshot(None, failed(e)))?;
        Ok(stored.map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}
