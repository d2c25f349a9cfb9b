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
//! never a mix; a leftover temporary file is ignored. A `policies.json` that does not parse is
//! not silently replaced: the server refuses to start and names the file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weir::policy::PolicyConfig;

const FILE: &str = "policies.json";
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
    /// The file does not parse. It is left as it is for the operator to inspect.
    #[error(
        "{path} is not a valid policy file ({detail}); move it away to start without the changes it holds"
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
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Overlay::default()),
        Err(e) => return Err(io_error(&path)(e)),
    };
    serde_json::from_str(&text).map_err(|e| DurableError::Corrupt {
        path,
        detail: e.to_string(),
    })
}

/// Writes `overlay` to `dir` atomically and durably (see the [module docs](self)).
pub fn store(dir: &Path, overlay: &Overlay) -> Result<(), DurableError> {
    let temp = dir.join(TEMP);
    let path = dir.join(FILE);
    let bytes = serde_json::to_vec_pretty(overlay).map_err(|e| DurableError::Io {
        path: temp.clone(),
        source: io::Error::other(e),
    })?;
    let mut file = File::create(&temp).map_err(io_error(&temp))?;
    file.write_all(&bytes).map_err(io_error(&temp))?;
    file.sync_all().map_err(io_error(&temp))?;
    drop(file);
    fs::rename(&temp, &path).map_err(io_error(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(applied[1].strict.as_ref().unwrap().qps, 20.0);
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
    fn a_corrupt_file_is_reported_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), b"{ not json").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(matches!(err, DurableError::Corrupt { .. }));
        assert!(err.to_string().contains("policies.json"), "{err}");
        assert_eq!(fs::read(dir.path().join(FILE)).unwrap(), b"{ not json");
    }
}
