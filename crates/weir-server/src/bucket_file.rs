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

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::data_file::{DataFileError, refuse_empty, settle_format, unless_panics};

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

/// The layout of the tables above, as the file records it ([`settle_format`]).
pub const FORMAT: u32 = 1;

/// A failure of the database.
#[derive(Debug, thiserror::Error)]
pub enum BucketFileError {
    /// Opening it at start (or again after a failure).
    #[error(transparent)]
    Open(#[from] DataFileError),
    /// A read or a write.
    #[error("the kept buckets' database ({FILE}): {0}")]
    Redb(Box<redb::Error>),
}

macro_rules! through_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for BucketFileError {
            fn from(error: $error) -> Self {
                BucketFileError::Redb(Box::new(error.into()))
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

/// What starting without the file means, for the refusal that names it.
const WITHOUT: &str = "every kept bucket (a day's quota spent before) starts whole";

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

/// How the database is opened: from its file, or (in tests) through a storage backend.
type Opener = Box<dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync>;

/// The open database. After a failed write redb refuses every later transaction ("Previous
/// I/O error occurred") until the database is opened again; so a failed write closes it, and
/// the next write opens it again — a disk that was full and has room again is written to
/// again without a restart.
pub struct BucketFile {
    path: PathBuf,
    open: Opener,
    db: Mutex<Option<Database>>,
    /// Times the database was opened again after a failed write.
    pub reopened: AtomicU64,
}

impl Drop for BucketFile {
    fn drop(&mut self) {
        // Closing writes redb's allocator state back, and on a damaged file can panic too.
        let db = self.db.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        close_quietly(&self.path, db);
    }
}

impl std::fmt::Debug for BucketFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl BucketFile {
    /// Opens (or creates) the database in `dir`. After a crash redb checks and repairs its
    /// file here, which takes longer the larger the file. A damaged file (empty, cut short)
    /// is refused by name.
    pub fn open(dir: &Path) -> Result<BucketFile, BucketFileError> {
        let path = dir.join(FILE);
        refuse_empty(&path, WITHOUT)?;
        let at = path.clone();
        // redb caches up to 1 GiB of pages by default; the file is written in batches and read
        // whole only at start, so a small cache costs nothing and keeps the memory a kept
        // bucket takes near what its record does.
        let open = move || Database::builder().set_cache_size(CACHE_BYTES).create(&at);
        BucketFile::open_with(path, Box::new(open))
    }

    /// Opens the database with `open`, `path` naming it in errors.
    fn open_with(path: PathBuf, open: Opener) -> Result<BucketFile, BucketFileError> {
        let db = unless_panics(&path, WITHOUT, || {
            let db = open().map_err(|e| DataFileError::from_redb(&path, e, WITHOUT))?;
            create_tables(&db).map_err(|e| as_damage(&path, e))?;
            settle_format(&db, &path, FORMAT, WITHOUT)?;
            Ok(db)
        })?;
        Ok(BucketFile {
            path,
            open,
            db: Mutex::new(Some(db)),
            reopened: AtomicU64::new(0),
        })
    }

    /// Runs `read` on the database, a panic in the storage engine reported as damage.
    fn reading<T>(
        &self,
        read: impl FnOnce(&Database) -> Result<T, BucketFileError>,
    ) -> Result<T, BucketFileError> {
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        let Some(db) = db.as_ref() else {
            return Err(BucketFileError::Redb(Box::new(redb::Error::PreviousIo)));
        };
        Ok(unless_panics(&self.path, WITHOUT, || {
            read(db).map_err(|e| as_damage(&self.path, e))
        })?)
    }

    /// Every bucket kept.
    pub fn read_all(&self) -> Result<Vec<KeptBucket>, BucketFileError> {
        self.reading(|db| {
            let txn = db.begin_read()?;
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
        })
    }

    /// Every `CL.THROTTLE` key kept.
    pub fn read_cells(&self) -> Result<Vec<KeptCell>, BucketFileError> {
        self.reading(|db| {
            let txn = db.begin_read()?;
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
        })
    }

    /// Makes `changes`, in one durable commit. The database is opened again first if the last
    /// write failed; if this one fails, it is closed.
    pub fn write(&self, changes: Changes<'_>) -> Result<(), BucketFileError> {
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        if db.is_none() {
            let opened = unless_panics(&self.path, WITHOUT, || {
                (self.open)().map_err(|e| DataFileError::from_redb(&self.path, e, WITHOUT))
            })?;
            self.reopened.fetch_add(1, Ordering::Relaxed);
            *db = Some(opened);
        }
        let written = write_to(db.as_ref().expect("opened above"), changes);
        if written.is_err() {
            // Closed now, while nothing else uses it; opened again by the next write.
            close_quietly(&self.path, db.take());
        }
        written
    }
}

/// A failure opening or reading the file at start, as the refusal that names it.
fn as_damage(path: &Path, error: BucketFileError) -> DataFileError {
    match error {
        BucketFileError::Open(open) => open,
        BucketFileError::Redb(redb) => DataFileError::from_redb(path, *redb, WITHOUT),
    }
}

/// Closes `db`: closing writes redb's allocator state back, which on a damaged file or a
/// failing disk can panic too.
fn close_quietly(path: &Path, db: Option<Database>) {
    let _ = unless_panics(path, WITHOUT, || {
        drop(db);
        Ok(())
    });
}

/// Creates the tables if they are not there yet.
fn create_tables(db: &Database) -> Result<(), BucketFileError> {
    let txn = db.begin_write()?;
    txn.open_table(BUCKETS)?;
    txn.open_table(CELLS)?;
    txn.commit()?;
    Ok(())
}

/// Makes `changes` in `db`, in one durable commit.
fn write_to(db: &Database, changes: Changes<'_>) -> Result<(), BucketFileError> {
    let txn = db.begin_write()?;
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

#[cfg(test)]
mod tests;
