//! The policy log's durable half: Raft's log entries, its vote, how far it has committed and
//! its last snapshot, in one redb database (`raft.redb`) in the data dir.
//!
//! redb commits each write transaction durably (flushed to disk) and atomically, so a crash
//! leaves every write either whole or absent: an entry Raft was told is appended is on disk,
//! and a vote once saved is never forgotten — what Raft's safety rests on.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use redb::{Database, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::PolicyRaft;
use crate::data_file::{DataFileError, refuse_empty, settle_format, unless_panics};

/// The database's file in the data dir.
pub const FILE: &str = "raft.redb";

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The layout of the tables above and of their JSON records, as the file records it
/// ([`settle_format`]): raised by any change an older build would misread.
pub const FORMAT: u32 = 1;

/// A failure of the database or of a record's form.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("the policy log's database: {0}")]
    Redb(Box<redb::Error>),
    /// A record did not parse.
    #[error("a record of the policy log: {0}")]
    Json(#[from] serde_json::Error),
    /// The file could not be opened: damaged, or in use by another process.
    #[error(transparent)]
    Open(#[from] DataFileError),
}

/// What starting without the file means, for the refusal that names it.
const WITHOUT: &str = "this member starts with an empty policy log: in a cluster it takes the policies from the leader when it joins; a node alone loses the policy changes made over the API";

macro_rules! through_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for StoreError {
            fn from(error: $error) -> Self {
                StoreError::Redb(Box::new(error.into()))
            }
        }
    )*};
}
through_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The database, shared by the log and the state machine (which keeps its snapshot here).
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
}

impl Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the database in `dir`. The file is small (a snapshot and the log
    /// since it), so every page is checked and every record read here: a damaged file stops
    /// the start by name, rather than a panic or a wrong answer inside Raft later.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join(FILE);
        refuse_empty(&path, WITHOUT)?;
        let damaged = |detail: String| DataFileError::Damaged {
            path: path.clone(),
            detail,
            without: WITHOUT,
        };
        let db = unless_panics(&path, WITHOUT, || {
            let redb = |e: redb::Error| DataFileError::from_redb(&path, e, WITHOUT);
            let mut db = Database::create(&path).map_err(|e| redb(e.into()))?;
            if !db.check_integrity().map_err(|e| redb(e.into()))? {
                return Err(damaged(
                    "some of its pages failed their checksums (redb repaired what it could)".into(),
                ));
            }
            let store = Store { db: Arc::new(db) };
            store.create_tables().map_err(|e| damaged(e.to_string()))?;
            settle_format(&store.db, &path, FORMAT, WITHOUT)?;
            store
                .read_everything()
                .map_err(|e| damaged(e.to_string()))?;
            Ok(store)
        })?;
        Ok(db)
    }

    fn create_tables(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(())
    }

    /// Reads and parses every record once.
    fn read_everything(&self) -> Result<(), StoreError> {
        self.entries(..)?;
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        for row in table.iter()? {
            let (_, value) = row?;
            serde_json::from_slice::<serde_json::Value>(value.value())?;
        }
        Ok(())
    }

    /// The record `key`, if written.
    pub fn read<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        let Some(value) = table.get(key)? else {
            return Ok(None);
        };
        Ok(Some(serde_json::from_slice(value.value())?))
    }

    /// Writes the record `key`, durably.
    pub fn write<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(value)?;
        let txn = self.db.begin_write()?;
        txn.open_table(META)?.insert(key, bytes.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry<PolicyRaft>>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let mut entries = Vec::new();
        for row in table.range(range)? {
            let (_, value) = row?;
            entries.push(serde_json::from_slice(value.value())?);
        }
        Ok(entries)
    }

    fn last_entry(&self) -> Result<Option<Entry<PolicyRaft>>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        match table.last()? {
            Some((_, value)) => Ok(Some(serde_json::from_slice(value.value())?)),
            None => Ok(None),
        }
    }

    fn append_all(
        &self,
        entries: impl IntoIterator<Item = Entry<PolicyRaft>>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(LOG)?;
            for entry in entries {
                let bytes = serde_json::to_vec(&entry)?;
                table.insert(entry.log_id.index, bytes.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Removes the entries in `range`, and with `purged` records the last one removed.
    fn remove(
        &self,
        range: impl RangeBounds<u64>,
        purged: Option<&LogId<u64>>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(LOG)?;
            table.retain_in(range, |_, _| false)?;
            if let Some(purged) = purged {
                let bytes = serde_json::to_vec(purged)?;
                txn.open_table(META)?.insert("purged", bytes.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }
}

fn failed(error: StoreError) -> AnyError {
    AnyError::new(&error)
}

impl RaftLogReader<PolicyRaft> for Store {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<PolicyRaft>>, StorageError<u64>> {
        self.entries(range)
            .map_err(|e| StorageIOError::read_logs(failed(e)).into())
    }
}

impl RaftLogStorage<PolicyRaft> for Store {
    type LogReader = Store;

    async fn get_log_state(&mut self) -> Result<LogState<PolicyRaft>, StorageError<u64>> {
        let read = || -> Result<LogState<PolicyRaft>, StoreError> {
            let last_purged_log_id: Option<LogId<u64>> = self.read("purged")?;
            let last = self.last_entry()?.map(|entry| entry.log_id);
            Ok(LogState {
                last_purged_log_id,
                last_log_id: last.or(last_purged_log_id),
            })
        };
        read().map_err(|e| StorageIOError::read_logs(failed(e)).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.write("vote", vote)
            .map_err(|e| StorageIOError::write_vote(failed(e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.read("vote")
            .map_err(|e| StorageIOError::read_vote(failed(e)).into())
    }

    // Saved so that a restarted member applies what it knows is committed before it hears
    // from a leader: it serves the policies it had, not older ones.
    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        self.write("committed", &committed)
            .map_err(|e| StorageIOError::write(failed(e)).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        self.read::<Option<LogId<u64>>>("committed")
            .map(Option::flatten)
            .map_err(|e| StorageIOError::read(failed(e)).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<PolicyRaft>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<PolicyRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.append_all(entries) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(StorageIOError::write_logs(failed(error)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.remove(log_id.index.., None)
            .map_err(|e| StorageIOError::write_logs(failed(e)).into())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.remove(..=log_id.index, Some(&log_id))
            .map_err(|e| StorageIOError::write_logs(failed(e)).into())
    }
}

#[cfg(test)]
mod tests;
