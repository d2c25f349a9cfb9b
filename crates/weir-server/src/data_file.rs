//! Opening the data dir's redb files (`raft.redb`, `buckets.redb`) so that a damaged one stops
//! the start with one line naming it, rather than a panic from inside the storage engine or a
//! silent fresh start.
//!
//! A file can be damaged by a careless operator (truncated, copied half-way, emptied) or by a
//! dying disk. redb checks what it can and repairs what a crash leaves, but a file cut short
//! can make it panic on an assertion, and an empty file is to redb a new database: every quota
//! it kept would be whole again without a word. So here a 0-byte file is damaged, a panic while
//! opening or reading the file at start is caught and reported as damage, and another process
//! holding the file is told apart from damage (and never answered with "move it away").
//!
//! Each file also records its *format* (the layout of its tables and records, counted from 1):
//! a file of a newer format than this build reads stops the start by name and is left as it is
//! — what a rollback to an older build meets — and one written before formats were recorded is
//! format 1, recorded at its first start. When a layout changes, its format goes up and the
//! start migrates a file of the older one.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Once;

use redb::{Database, ReadableTable, TableDefinition};

/// The table a data file records its format in, one row.
const FORMAT_TABLE: TableDefinition<&str, u32> = TableDefinition::new("weir_format");
const FORMAT_ROW: &str = "format";

/// Why a data file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DataFileError {
    /// The file is damaged: empty, cut short, or not a database redb can read.
    #[error(
        "{path} is damaged ({detail}). Weir does not overwrite it. Restore it from a backup; or stop this node, move the file aside (e.g. to {path}.damaged) and start again: {without}"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
        /// What starting without it means.
        without: &'static str,
    },
    /// Another process has the file open.
    #[error(
        "{path} is open in another process (another weir serve on the same data dir?): stop that one first, or give this node its own --data-dir"
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The file is of a newer format than this build reads: written by a newer Weir.
    #[error(
        "{path} was written by a newer Weir: its data format is {found}, and this build reads formats up to {reads}. Weir does not change it. Run the newer build on this data dir; to go back to this one, restore the data dir from the copy taken before the upgrade (docs/deployment.md, \"Upgrades and rollbacks\")"
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// The format it records.
        found: u32,
        /// The newest format this build reads.
        reads: u32,
    },
    /// redb failed otherwise (a permission, a disk error).
    #[error("{path}: {source}")]
    Redb {
        /// The file.
        path: PathBuf,
        /// What redb said.
        source: Box<redb::Error>,
    },
}

impl DataFileError {
    /// The error for `path` from what redb said while opening it.
    pub fn from_redb(path: &Path, error: impl Into<redb::Error>, without: &'static str) -> Self {
        let error: redb::Error = error.into();
        match error {
            redb::Error::DatabaseAlreadyOpen => DataFileError::InUse {
                path: path.to_owned(),
            },
            redb::Error::Corrupted(detail) => DataFileError::Damaged {
                path: path.to_owned(),
                detail,
                without,
            },
            redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                DataFileError::Damaged {
                    path: path.to_owned(),
                    detail: io.to_string(),
                    without,
                }
            }
            other => DataFileError::Redb {
                path: path.to_owned(),
                source: Box::new(other),
            },
        }
    }
}

/// Checks the format `db` (the file at `path`) records against `reads`, the newest this build
/// reads: newer stops the start ([`DataFileError::Newer`]); none recorded (a file from before
/// formats were) is format 1; an older or absent one is recorded as `reads` once its
/// migration, if its layout changed, is done — there is none yet, every file being of format 1.
pub fn settle_format(
    db: &Database,
    path: &Path,
    reads: u32,
    without: &'static str,
) -> Result<(), DataFileError> {
    let failed = |error: redb::Error| DataFileError::from_redb(path, error, without);
    let txn = db.begin_write().map_err(|e| failed(e.into()))?;
    {
        let mut table = txn.open_table(FORMAT_TABLE).map_err(|e| failed(e.into()))?;
        let found = table
            .get(FORMAT_ROW)
            .map_err(|e| failed(e.into()))?
            .map(|format| format.value());
        match found {
            Some(found) if found > reads => {
                return Err(DataFileError::Newer {
                    path: path.to_owned(),
                    found,
                    reads,
                });
            }
            Some(found) if found == reads => {}
            _ => {
                table
                    .insert(FORMAT_ROW, reads)
                    .map_err(|e| failed(e.into()))?;
            }
        }
    }
    txn.commit().map_err(|e| failed(e.into()))
}

/// Records `format` in `db`, as a build of that format would: for tests.
#[cfg(test)]
pub(crate) fn record_format(db: &Database, format: u32) {
    let txn = db.begin_write().unwrap();
    txn.open_table(FORMAT_TABLE)
        .unwrap()
        .insert(FORMAT_ROW, format)
        .unwrap();
    txn.commit().unwrap();
}

/// Refuses a file that exists but is empty: to redb a new database, here a damaged one (a
/// file this node wrote always holds at least redb's header).
pub fn refuse_empty(path: &Path, without: &'static str) -> Result<(), DataFileError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() == 0 => Err(DataFileError::Damaged {
            path: path.to_owned(),
            detail: "it is empty (0 bytes)".to_owned(),
            without,
        }),
        _ => Ok(()),
    }
}

thread_local! {
    /// Whether a panic on this thread is caught by [`unless_panics`] and reported there.
    static CAUGHT_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `read` (opening or reading `path` at start); a panic inside it — the storage engine
/// meeting a page it cannot read — is reported as damage to `path`, without the panic's own
/// message and backtrace on stderr.
pub fn unless_panics<T>(
    path: &Path,
    without: &'static str,
    read: impl FnOnce() -> Result<T, DataFileError>,
) -> Result<T, DataFileError> {
    quiet_caught_panics();
    let was = CAUGHT_HERE.replace(true);
    let outcome = catch_unwind(AssertUnwindSafe(read));
    CAUGHT_HERE.set(was);
    outcome.unwrap_or_else(|panic| {
        Err(DataFileError::Damaged {
            path: path.to_owned(),
            detail: format!("the storage engine could not read it: {}", message(&*panic)),
            without,
        })
    })
}

/// Installs, once, a panic hook that stays silent for panics [`unless_panics`] catches and
/// hands every other one to the hook that was there.
fn quiet_caught_panics() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CAUGHT_HERE.get() {
                previous(info);
            }
        }));
    });
}

/// A panic's message, when it has one.
fn message(panic: &dyn Any) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Damaged copies of a data file's bytes `whole`, each with what was done to it: cut short at
/// every 4 KiB page and a few odd places, and 40 overwritten with random bytes (a fixed seed,
/// so a failure repeats) — half at the tail, half in the middle. What the stores' tests open
/// to hold that a damaged file loads or is refused by name, never a panic.
#[cfg(test)]
pub(crate) fn damaged_copies(whole: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut copies = Vec::new();
    let mut cuts: Vec<usize> = (1..whole.len()).step_by(4096).collect();
    cuts.extend([1, 511, 4096, whole.len() / 2, whole.len() - 1]);
    for cut in cuts.into_iter().filter(|cut| *cut < whole.len()) {
        copies.push((format!("cut to {cut} bytes"), whole[..cut].to_vec()));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..40 {
        let mut bytes = whole.to_vec();
        let len = 1 + (random() as usize % 8192).min(bytes.len() - 1);
        let from = match round % 2 {
            0 => bytes.len() - len,
            _ => random() as usize % (bytes.len() - len),
        };
        for byte in &mut bytes[from..from + len] {
            *byte = random() as u8;
        }
        copies.push((
            format!("round {round}: {len} random bytes at {from}"),
            bytes,
        ));
    }
    copies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_damage_to_the_file_named() {
        let path = Path::new("/data/x.redb");
        let error = unless_panics::<()>(path, "nothing kept", || panic!("page_manager assertion"))
            .unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("/data/x.redb is damaged"), "{text}");
        assert!(text.contains("page_manager assertion"), "{text}");
        assert!(text.contains("nothing kept"), "{text}");
        // And the thread is back to reporting panics it does not catch here.
        assert!(!CAUGHT_HERE.get());
    }

    #[test]
    fn a_files_format_is_recorded_once_and_a_newer_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.redb");
        let db = Database::create(&path).unwrap();
        let recorded = |db: &Database| {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(FORMAT_TABLE).unwrap();
            table.get(FORMAT_ROW).unwrap().map(|format| format.value())
        };
        // A file from before formats were recorded is format 1, and says so from then on.
        settle_format(&db, &path, 1, "nothing kept").unwrap();
        assert_eq!(recorded(&db), Some(1));
        settle_format(&db, &path, 1, "nothing kept").unwrap();
        // A build that reads format 2 brings a format 1 file up.
        settle_format(&db, &path, 2, "nothing kept").unwrap();
        assert_eq!(recorded(&db), Some(2));
        // And the older build is refused it, by name, the file left as it was.
        let error = settle_format(&db, &path, 1, "nothing kept").unwrap_err();
        assert!(matches!(
            error,
            DataFileError::Newer {
                found: 2,
                reads: 1,
                ..
            }
        ));
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("{} was written by a newer Weir", path.display())),
            "{text}"
        );
        assert!(
            text.contains("its data format is 2, and this build reads formats up to 1"),
            "{text}"
        );
        assert_eq!(recorded(&db), Some(2));
    }

    #[test]
    fn an_empty_file_is_damaged_not_new() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.redb");
        assert!(refuse_empty(&path, "").is_ok(), "no file: a new one");
        std::fs::write(&path, b"").unwrap();
        let text = refuse_empty(&path, "").unwrap_err().to_string();
        assert!(text.contains("empty (0 bytes)"), "{text}");
    }

    #[test]
    fn a_file_held_by_another_process_is_not_called_damaged() {
        let text =
            DataFileError::from_redb(Path::new("/d/b.redb"), redb::Error::DatabaseAlreadyOpen, "")
                .to_string();
        assert!(text.contains("open in another process"), "{text}");
        assert!(
            !text.contains("move"),
            "never suggest moving a live file: {text}"
        );
    }
}
