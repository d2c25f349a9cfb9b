//! The data dir's `buckets.redb`: the rate buckets that take long to refill, kept across
//! restarts (what writes and reads them is `app::kept_buckets`).
//!
//! Two redb tables: policies' buckets, keyed by policy, kind and key, each record saying when,
//! in Unix time, the bucket is whole again and what it had spent and left when it was written;
//! and `CL.THROTTLE`'s keys, each with the shape its last call gave it and when it is whole. Times are the
//! wall clock's because a process's own clock starts again at every start.
//!
//! redb commits a write transaction atomically and, by default, durably (flushed to disk): a
//! crash — `kill -9`, a power cut — leaves the file as it was after the last commit, never a
//! mix of two. So the writer batches many buckets into one commit, and what a crash loses is
//! what changed since the last one. redb rather than a file of our own because it is already
//! the policy log's store: one storage engine to trust, with its crash safety tested by its
//! own authors, not a second written here.

use std::path::Path;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

/// The database's file in the data dir.
pub const FILE: &str = "buckets.redb";

/// redb's page cache.
const CACHE_BYTES: usize = 16 << 20;

/// A policy's buckets: `(policy, kind or "", key)` → `(whole_at, used, remaining)`.
const BUCKETS: TableDefinition<(&str, &str, &str), (u64, u64, u64)> =
    TableDefinition::new("buckets");

/// `CL.THROTTLE`'s keys, whose shape is the key's own: `key` → `(whole_at, interval,
/// tolerance)`.
const CELLS: TableDefinition<&[u8], (u64, u64, u64)> = TableDefinition::new("cells");

/// A failure of the database.
#[derive(Debug, thiserror::Error)]
#[error("the kept buckets' database ({FILE}): {0}")]
pub struct BucketFileError(Box<redb::Error>);

macro_rules! through_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for BucketFileError {
            fn from(error: $error) -> Self {
                BucketFileError(Box::new(error.into()))
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

/// One bucket as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBucket {
    /// The policy's name.
    pub policy: String,
    /// The kind whose own buckets it is in (`None`: the policy's default buckets).
    pub kind: Option<String>,
    /// The bucket's key.
    pub key: String,
    /// When the bucket is whole again, in nanoseconds since the Unix epoch.
    pub whole_at: u64,
    /// What it had spent when written.
    pub used: u64,
    /// What it had left when written.
    pub remaining: u64,
}

/// One `CL.THROTTLE` key as kept: the shape its last call gave it, and when it is whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptCell {
    /// The key, as the client sent it.
    pub key: Vec<u8>,
    /// When the bucket is whole again, in nanoseconds since the Unix epoch.
    pub whole_at: u64,
    /// Nanoseconds per request.
    pub interval: u64,
    /// The bucket's tolerance, in nanoseconds: `interval` × its limit.
    pub tolerance: u64,
}

/// Everything a write changes: buckets and keys written, whole ones removed.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    /// Policy buckets to write, each replacing what was kept of it.
    pub buckets: &'a [KeptBucket],
    /// `CL.THROTTLE` keys to write.
    pub cells: &'a [KeptCell],
    /// Remove every bucket and key whole by then (Unix nanoseconds).
    pub whole_by: Option<u64>,
}

/// The open database.
pub struct BucketFile {
    db: Database,
}

impl std::fmt::Debug for BucketFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketFile").finish_non_exhaustive()
    }
}

impl BucketFile {
    /// Opens (or creates) the database in `dir`. After a crash redb checks and repairs its
    /// file here, which takes longer the larger the file.
    pub fn open(dir: &Path) -> Result<BucketFile, BucketFileError> {
        // redb caches up to 1 GiB of pages by default; the file is written in batches and read
        // whole only at start, so a small cache costs nothing and keeps the memory a kept
        // bucket takes near what its record does.
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(dir.join(FILE))?;
        let txn = db.begin_write()?;
        txn.open_table(BUCKETS)?;
        txn.open_table(CELLS)?;
        txn.commit()?;
        Ok(BucketFile { db })
    }

    /// Every bucket kept.
    pub fn read_all(&self) -> Result<Vec<KeptBucket>, BucketFileError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(BUCKETS)?;
        let mut buckets = Vec::with_capacity(table.len()? as usize);
        for row in table.iter()? {
            let (id, state) = row?;
            let (policy, kind, key) = id.value();
            let (whole_at, used, remaining) = state.value();
            buckets.push(KeptBucket {
                policy: policy.to_owned(),
                kind: (!kind.is_empty()).then(|| kind.to_owned()),
                key: key.to_owned(),
                whole_at,
                used,
                remaining,
            });
        }
        Ok(buckets)
    }

    /// Every `CL.THROTTLE` key kept.
    pub fn read_cells(&self) -> Result<Vec<KeptCell>, BucketFileError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CELLS)?;
        let mut cells = Vec::with_capacity(table.len()? as usize);
        for row in table.iter()? {
            let (key, state) = row?;
            let (whole_at, interval, tolerance) = state.value();
            cells.push(KeptCell {
                key: key.value().to_vec(),
                whole_at,
                interval,
                tolerance,
            });
        }
        Ok(cells)
    }

    /// Makes `changes`, in one durable commit.
    pub fn write(&self, changes: Changes<'_>) -> Result<(), BucketFileError> {
        let txn = self.db.begin_write()?;
        {
            let mut buckets = txn.open_table(BUCKETS)?;
            let mut cells = txn.open_table(CELLS)?;
            if let Some(now) = changes.whole_by {
                buckets.retain(|_, (whole_at, _, _)| whole_at > now)?;
                cells.retain(|_, (whole_at, _, _)| whole_at > now)?;
            }
            for bucket in changes.buckets {
                let id = (
                    bucket.policy.as_str(),
                    bucket.kind.as_deref().unwrap_or(""),
                    bucket.key.as_str(),
                );
                buckets.insert(id, (bucket.whole_at, bucket.used, bucket.remaining))?;
            }
            for cell in changes.cells {
                cells.insert(
                    cell.key.as_slice(),
                    (cell.whole_at, cell.interval, cell.tolerance),
                )?;
            }
        }
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
