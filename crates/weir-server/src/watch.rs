//! Files watched for changes the way Kubernetes and editors make them, and SIGHUP beside: what
//! the config file's, the certificates' and the RLS rules' reloads wait on.
//!
//! A mounted ConfigMap or Secret is a symlink (`weir.toml → ..data/weir.toml`) through a
//! `..data` symlink swapped atomically for a new directory: the file's own inode never changes,
//! so a watch on the file would miss every update. The directory holding each path is watched
//! instead (`notify`); an event naming the file, or a `..`-named entry, is a change. Editors that
//! write a temporary file and rename it over the old one are seen the same way. Events are let
//! settle before a change is reported: a swap or a save is several events in a row.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use notify::Watcher as _;
use tokio::signal::unix::Signal;
use tokio::sync::mpsc;

/// How long events are let settle before a change is reported.
const SETTLE: Duration = Duration::from_millis(100);

/// What woke a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// A file event: its reader may skip a text it has already seen.
    Seen,
    /// SIGHUP: read again, whatever the text.
    Forced,
}

/// The changes to a set of files, and SIGHUPs, as one stream.
pub(crate) struct Changes {
    // Kept for as long as the changes are read: dropped, it would stop watching.
    _watcher: Option<notify::RecommendedWatcher>,
    events: mpsc::Receiver<()>,
    hangups: Signal,
}

impl Changes {
    /// Watches `paths` and listens to `hangups`. A watcher that cannot be made (the system's
    /// limit on inotify instances, say) is logged, naming `what` would go unseen, and SIGHUP
    /// still reports.
    pub(crate) fn new(paths: &[&Path], hangups: Signal, what: &str) -> Changes {
        let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        Changes::of(|changed| watch_files(paths, changed), hangups, what, &files)
    }

    /// Watches everything under `dir`, in its subdirectories too (a directory of files read
    /// whole, such as RLS rules), and listens to `hangups`; as [`Changes::new`] otherwise.
    pub(crate) fn under(dir: &Path, hangups: Signal, what: &str) -> Changes {
        let files = [dir.display().to_string()];
        Changes::of(|changed| watch_tree(dir, changed), hangups, what, &files)
    }

    /// The changes `watch` reports, beside `hangups`; a watch that cannot start is logged,
    /// naming `files`.
    fn of(
        watch: impl FnOnce(mpsc::Sender<()>) -> anyhow::Result<notify::RecommendedWatcher>,
        hangups: Signal,
        what: &str,
        files: &[String],
    ) -> Changes {
        let (changed, events) = mpsc::channel::<()>(1);
        let watcher = match watch(changed) {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(
                    files = ?files,
                    "{what} will not be seen (SIGHUP still reloads): {error:#}"
                );
                None
            }
        };
        Changes {
            _watcher: watcher,
            events,
            hangups,
        }
    }

    /// The next change, once its events have settled; `None` once neither files nor signals
    /// can report any more.
    pub(crate) async fn next(&mut self) -> Option<Change> {
        let change = tokio::select! {
            Some(()) = self.events.recv() => Change::Seen,
            Some(()) = self.hangups.recv() => Change::Forced,
            else => return None,
        };
        tokio::time::sleep(SETTLE).await;
        while self.events.try_recv().is_ok() {}
        Some(change)
    }
}

/// Watches the directories holding `paths`, signalling `changed` at each event that can change
/// what one of them reads: a change to the file's own name there, or to a `..`-named entry (a
/// mounted ConfigMap's or Secret's `..data` and its versions). Opening and reading files —
/// this node's own reads included — are not changes.
fn watch_files(
    paths: &[&Path],
    changed: mpsc::Sender<()>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    let mut watched: Vec<(PathBuf, Vec<OsString>)> = Vec::new();
    for path in paths {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = path.file_name().map(|name| name.to_owned());
        match watched.iter_mut().find(|(d, _)| *d == dir) {
            Some((_, names)) => names.extend(name),
            None => watched.push((dir, name.into_iter().collect())),
        }
    }
    let names: Vec<OsString> = watched
        .iter()
        .flat_map(|(_, names)| names.clone())
        .collect();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            return;
        };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        let concerns_a_file = event.paths.iter().any(|changed| {
            changed.file_name().is_some_and(|changed| {
                names.iter().any(|name| name == changed)
                    || changed.as_encoded_bytes().starts_with(b"..")
            })
        });
        if concerns_a_file {
            // A change already signalled and not yet read covers this one.
            let _ = changed.try_send(());
        }
    })
    .context("starting a file watcher")?;
    for (dir, _) in &watched {
        watcher
            .watch(dir, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {} for changes", dir.display()))?;
    }
    Ok(watcher)
}

/// Watches `dir` and everything under it, signalling `changed` at each event but a read.
fn watch_tree(dir: &Path, changed: mpsc::Sender<()>) -> anyhow::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| !matches!(event.kind, notify::EventKind::Access(_))) {
            let _ = changed.try_send(());
        }
    })
    .context("starting a file watcher")?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .with_context(|| format!("watching {} for changes", dir.display()))?;
    Ok(watcher)
}
