//! Policy changes made over the API, kept in the data dir so they survive restarts.
//!
//! The data dir holds one file, `policies.json`: the policies created or replaced over the API
//! and the names deleted over the API, laid over the config file's policies at start. So an
//! operator's edit of the config file still takes effect for policies the API never touched,
//! and an API change is never silently undone by a restart.
//!
//! Every change is written whole and atomically: to `policies.json.tmp`, flushed to disk
//! (`fsync`), renamed over `policies.json`, and the directory flushed too, before the change is
//! applied or acknowledged. A crash at any moment leaves either the old file or the new one,
//! never a mix; a leftover temporary file is ignored, and a write that fails (a full disk)
//! removes its temporary file. A `policies.json` that does not parse is not silently replaced:
//! the server refuses to start, names the file and says how to start without it. At start the
//! dir is also probed for writing, so a read-only one is reported then, not at the first change.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weir::policy::PolicyConfig;

const FILE: &str = "policies.json";

/// The layout of `policies.json` this build reads and writes. Format 1 is written without a
/// `format` field, as every build before formats were recorded wrote it (so that one of those
/// can still read it after a rollback); a later format writes its number, and this build
/// refuses a file whose number is higher, by name, before reading anything else of it.
pub const FORMAT: u32 = 1;
const LOCK: &str = "lock";
const TEMP: &str = "policies.json.tmp";

/// What the API changed: laid over the config file's policies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Policies created or replaced over the API.
    #[serde(default)]
    pub upserts: BTreeMap<String, PolicyConfig>,
    /// Policies deleted over the API.
    #[serde(default)]
    pub deletes: BTreeSet<String>,
    /// The file's format, when it is not 1 ([`FORMAT`]).
    #[serde(default, skip_serializing)]
    pub format: Option<u32>,
}

/// A file's format alone, read before the rest (which a newer format may lay out otherwise).
#[derive(Deserialize)]
struct FormatOnly {
    #[serde(default)]
    format: Option<u32>,
}

impl Overlay {
    /// `base` with this overlay's deletions and replacements applied, in base order, then the
    /// overlay's new policies in name order.
    pub fn apply(&self, base: Vec<PolicyConfig>) -> Vec<PolicyConfig> {
        let mut seen = BTreeSet::new();
        let mut out: Vec<PolicyConfig> = base
            .into_iter()
            .filter(|p| !self.deletes.contains(&p.name))
            .map(|p| {
                seen.insert(p.name.clone());
                self.upserts.get(&p.name).cloned().unwrap_or(p)
            })
            .collect();
        out.extend(
            self.upserts
                .values()
                .filter(|p| !seen.contains(&p.name))
                .cloned(),
        );
        out
    }

    /// This overlay with `config` created or replaced.
    pub fn with_upsert(&self, config: PolicyConfig) -> Overlay {
        let mut next = self.clone();
        next.deletes.remove(&config.name);
        next.upserts.insert(config.name.clone(), config);
        next
    }

    /// This overlay with `name` deleted.
    pub fn with_delete(&self, name: &str) -> Overlay {
        let mut next = self.clone();
        next.upserts.remove(name);
        next.deletes.insert(name.to_owned());
        next
    }

    /// Whether a change made over the API holds `name` (a replacement or a deletion).
    pub fn touches(&self, name: &str) -> bool {
        self.upserts.contains_key(name) || self.deletes.contains(name)
    }

    /// This overlay without any change to `name`: the config file's version (or none) again.
    pub fn without(&self, name: &str) -> Overlay {
        let mut next = self.clone();
        next.upserts.remove(name);
        next.deletes.remove(name);
        next
    }
}

/// A problem with the data dir.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The data dir or its file could not be read or written.
    #[error("data dir {path}: {source}")]
    Io {
        /// The path at fault.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Another process holds the data dir.
    #[error(
        "the data dir {dir} is in use by another weir serve ({holder}): two processes sharing a data dir would overwrite each other's policy changes. Give each node its own --data-dir (WEIR_DATA_DIR), or stop the other one first"
    )]
    Locked {
        /// The data dir.
        dir: PathBuf,
        /// Who holds it, as it wrote itself in the lock file.
        holder: String,
    },
    /// The file is of a newer format than this build reads: written by a newer Weir.
    #[error(transparent)]
    Newer(crate::data_file::DataFileError),
    /// The file does not parse. It is left as it is for the operator to inspect.
    #[error(
        "{path} is not a valid policy file ({detail}). It holds the policy changes made over the API; Weir does not overwrite it. To start without them, move it away (e.g. to {path}.corrupt): the config file's policies then apply as written"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        detail: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> DurableError + '_ {
    move |source| DurableError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads the overlay from `dir` (creating `dir` if needed; no file: an empty overlay).
pub fn load(dir: &Path) -> Result<Overlay, DurableError> {
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let path = dir.join(FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Overlay::default()),
        Err(e) => return Err(io_error(&path)(e)),
    };
    let text = String::from_utf8(bytes).map_err(|e| DurableError::Corrupt {
        path: path.clone(),
        detail: format!(
            "not UTF-8 text: byte {} is not part of a character",
            e.utf8_error().valid_up_to()
        ),
    })?;
    if let Ok(FormatOnly {
        format: Some(found),
    }) = serde_json::from_str(&text)
        && found > FORMAT
    {
        return Err(DurableError::Newer(
            crate::data_file::DataFileError::Newer {
                path,
                found,
                reads: FORMAT,
            },
        ));
    }
    serde_json::from_str(&text).map_err(|e| DurableError::Corrupt {
        path,
        detail: e.to_string(),
    })
}

/// The lock on a data dir, held for as long as this lives (see the [module docs](self)).
#[derive(Debug)]
pub struct DataDirLock {
    _dir: File,
    _file: File,
}

/// Takes the lock on `dir` (creating `dir` if needed) and writes `holder` (who this process
/// is: its pid, node and address) into the lock file; refuses if another process holds it,
/// naming what that one wrote.
///
/// The lock is taken on the directory itself: an operator may delete a file named `lock`,
/// but not the directory a running node has open, so a second process can never run on the
/// same data dir. The `lock` file only says who holds it.
pub fn lock(dir: &Path, holder: &str) -> Result<DataDirLock, DurableError> {
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let directory = File::open(dir).map_err(io_error(dir))?;
    let path = dir.join(LOCK);
    match directory.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let written = fs::read_to_string(&path).unwrap_or_default();
            let holder = match written.trim() {
                "" => "it did not say who it is: its `lock` file is empty or gone".to_owned(),
                said => said.to_owned(),
            };
            return Err(DurableError::Locked {
                dir: dir.to_owned(),
                holder,
            });
        }
        Err(fs::TryLockError::Error(error)) => return Err(io_error(dir)(error)),
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(io_error(&path))?;
    file.write_all(holder.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .map_err(io_error(&path))?;
    Ok(DataDirLock {
        _dir: directory,
        _file: file,
    })
}

/// Checks that changes can be written to `dir`, the way [`store`] writes them (a temporary
/// file created, flushed and removed), so that a read-only or unwritable data dir is found at
/// start rather than at the first change.
pub fn check_writable(dir: &Path) -> Result<(), DurableError> {
    let probe = dir.join(TEMP);
    let written = File::create(&probe)
        .and_then(|mut file| {
            file.write_all(b"{}")?;
            file.sync_all()
        })
        .map_err(io_error(&probe));
    let _ = fs::remove_file(&probe);
    written
}

/// Writes `overlay` to `dir` atomically and durably (see the [module docs](self)).
pub fn store(dir: &Path, overlay: &Overlay) -> Result<(), DurableError> {
    let temp = dir.join(TEMP);
    let path = dir.join(FILE);
    let bytes = serde_json::to_vec_pretty(overlay).map_err(|e| DurableError::Io {
        path: temp.clone(),
        source: io::Error::other(e),
    })?;
    let written = File::create(&temp)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .map_err(io_error(&temp))
        .and_then(|()| fs::rename(&temp, &path).map_err(io_error(&path)));
    if let Err(e) = written {
        // A failed write (a full disk, say) leaves no partial file behind.
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir::policy::{KeyedSpec, Limiter};

    fn policy(name: &str, qps: f64) -> PolicyConfig {
        toml::from_str(&format!("name = \"{name}\"\nstrict = {{ qps = {qps} }}")).unwrap()
    }

    #[test]
    fn the_overlay_replaces_deletes_and_adds() {
        let base = vec![policy("a", 1.0), policy("b", 2.0), policy("c", 3.0)];
        let overlay = Overlay::default()
            .with_upsert(policy("b", 20.0))
            .with_delete("c")
            .with_upsert(policy("d", 4.0));
        let applied = overlay.apply(base);
        let names: Vec<_> = applied.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "d"]);
        assert!(matches!(
            &applied[1].limiter,
            Limiter::Keyed(KeyedSpec::Strict(s)) if s.qps == 20.0
        ));
        // Re-creating a deleted policy undoes the deletion.
        let again = overlay.with_upsert(policy("c", 30.0));
        assert!(!again.deletes.contains("c"));
    }

    #[test]
    fn store_then_load_round_trips_and_ignores_a_leftover_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), Overlay::default());
        let overlay = Overlay::default().with_upsert(policy("a", 5.0));
        store(dir.path(), &overlay).unwrap();
        fs::write(dir.path().join(TEMP), b"{ half a wri").unwrap();
        assert_eq!(load(dir.path()).unwrap(), overlay);
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file_and_the_old_file_intact() {
        let dir = tempfile::tempdir().unwrap();
        let before = Overlay::default().with_upsert(policy("a", 5.0));
        store(dir.path(), &before).unwrap();
        // A directory where the rename must land: the write succeeds, the rename fails.
        let blocked = tempfile::tempdir().unwrap();
        fs::create_dir(blocked.path().join(FILE)).unwrap();
        assert!(store(blocked.path(), &before).is_err());
        assert!(
            !blocked.path().join(TEMP).exists(),
            "the partial file is removed"
        );
        assert!(check_writable(dir.path()).is_ok());
        assert!(!dir.path().join(TEMP).exists(), "the probe is removed");
        assert_eq!(load(dir.path()).unwrap(), before);
    }

    #[test]
    fn a_locked_data_dir_is_refused_naming_its_holder_and_free_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path(), "pid 41, node a, http 127.0.0.1:8080").unwrap();
        let refused = lock(dir.path(), "pid 42, node b").unwrap_err().to_string();
        assert!(
            refused.contains("in use by another weir serve (pid 41, node a, http 127.0.0.1:8080)"),
            "{refused}"
        );
        assert!(refused.contains("--data-dir"), "{refused}");
        drop(held);
        let again = lock(dir.path(), "pid 42, node b").unwrap();
        let said = fs::read_to_string(dir.path().join(LOCK)).unwrap();
        assert_eq!(
            said, "pid 42, node b\n",
            "the new holder's words, the old ones gone"
        );
        drop(again);
    }

    #[test]
    fn a_file_of_a_newer_format_is_refused_by_name_and_one_of_this_format_says_none() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &Overlay::default().with_delete("gone")).unwrap();
        let written = fs::read_to_string(dir.path().join(FILE)).unwrap();
        // Format 1 is written as every build before formats wrote it: a rollback reads it.
        assert!(!written.contains("format"), "{written}");
        let newer = r#"{"format": 2, "deletes": ["gone"], "renamed": {}}"#;
        fs::write(dir.path().join(FILE), newer).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("policies.json was written by a newer Weir: its data format is 2"),
            "{err}"
        );
        assert_eq!(fs::read_to_string(dir.path().join(FILE)).unwrap(), newer);
        fs::write(
            dir.path().join(FILE),
            r#"{"format": 1, "deletes": ["gone"]}"#,
        )
        .unwrap();
        assert!(load(dir.path()).unwrap().deletes.contains("gone"));
    }

    #[test]
    fn an_unwritable_dir_is_found_by_the_probe() {
        let dir = tempfile::tempdir().unwrap();
        // Where the temporary file must be created there is a directory (root can write
        // anywhere a mode bit forbids, so this is how a test makes a write fail).
        fs::create_dir(dir.path().join(TEMP)).unwrap();
        let err = check_writable(dir.path()).unwrap_err();
        assert!(err.to_string().contains("policies.json.tmp"), "{err}");
    }

    #[test]
    fn random_bytes_are_named_as_not_text_with_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), [0x7b, 0xff, 0xfe, 0x00]).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not UTF-8 text: byte 1"), "{err}");
        assert!(err.contains("policies.json"), "{err}");
        assert!(err.contains("move it away"), "{err}");
    }

    #[test]
    fn a_corrupt_file_is_reported_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), b"{ not json").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(matches!(err, DurableError::Corrupt { .. }));
        assert!(err.to_string().contains("policies.json"), "{err}");
        assert_eq!(fs::read(dir.path().join(FILE)).unwrap(), b"{ not json");
    }
}
