//! Live config reload: the config file watched, and its policies re-applied when it changes or
//! on SIGHUP.
//!
//! Kubernetes mounts a ConfigMap as a symlink (`weir.toml → ..data/weir.toml`) through a
//! `..data` symlink that it swaps atomically for a new directory: the file's own inode never
//! changes, so a watch on the file would miss every update. The directory holding the path is
//! watched instead (`notify`), and any event in it has the file read again through its path;
//! the text is applied only if it differs from the last one read. Editors that write a
//! temporary file and rename it over the old one are seen the same way. SIGHUP reads the file at
//! once.
//!
//! Only the `[[policy]]` tables are applied live ([`App::reload_policies`]); `[server]` and
//! `[rls]` take effect at the next start. A file that does not parse or check keeps the running
//! config: the reason is logged (with the line, for TOML) and counted in
//! `weir_config_reloads_total{outcome="failed"}`; the node stays ready. So does a file with no
//! `[[policy]]` table at all while policies it defined run — an empty or comment-only file, or
//! one cut short by a write that was not atomic — unless it says `policy = []`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use notify::Watcher as _;
use tokio::signal::unix::Signal;
use tokio::sync::mpsc;

use crate::app::App;
use crate::config::ConfigFile;

/// How long events are let settle before the file is read: a swap or an editor's save is
/// several events in a row.
pub(crate) const SETTLE: Duration = Duration::from_millis(100);

/// Watches `file` — the config file `weir serve` was started with, and the text it parsed —
/// and applies its policies to `app` when it changes or on `hangups` (SIGHUP), until the
/// process ends. `None`: the embedded default, which never changes; SIGHUP is then logged.
///
/// A watcher that cannot be made (the system's limit on inotify instances, say) does not stop
/// the node: it is logged, and SIGHUP still reloads.
pub fn watch(app: Arc<App>, file: Option<(PathBuf, String)>, mut hangups: Signal) {
    let Some((path, started)) = file else {
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::warn!("SIGHUP: no config file to reload (running the embedded default)");
            }
        });
        return;
    };
    let (changed, mut changes) = mpsc::channel::<()>(1);
    let watcher = match watch_files(&[&path], changed) {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(
                file = %path.display(),
                "config changes will not be seen (SIGHUP still reloads): {error:#}"
            );
            None
        }
    };
    tokio::spawn(async move {
        // Kept for as long as the loop runs: dropped, it would stop watching.
        let _watcher = watcher;
        let mut last = started;
        // A change made between the file's first reading and the watch's start is applied
        // now; with none, this finds the text unchanged and does nothing.
        reload(&app, &path, &mut last, false).await;
        loop {
            let forced = tokio::select! {
                Some(()) = changes.recv() => false,
                Some(()) = hangups.recv() => true,
                else => break,
            };
            tokio::time::sleep(SETTLE).await;
            while changes.try_recv().is_ok() {}
            reload(&app, &path, &mut last, forced).await;
        }
    });
}

/// Whether the config text has a top-level `policy` key, if only `policy = []`: a file that
/// means to have no policies says so.
fn names_policies(text: &str) -> bool {
    text.parse::<toml::Table>()
        .is_ok_and(|table| table.contains_key("policy"))
}

/// Watches the directories holding `paths`, signalling `changed` at each event that can change
/// what one of them reads: a change to the file's own name there, or to a `..`-named entry (a
/// mounted ConfigMap's or Secret's `..data` and its versions). Opening and reading files —
/// this node's own reads included — are not changes. [`crate::tls`] watches its certificates
/// with it too.
pub(crate) fn watch_files(
    paths: &[&Path],
    changed: mpsc::Sender<()>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    let mut watched: Vec<(PathBuf, Vec<std::ffi::OsString>)> = Vec::new();
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
    let names: Vec<std::ffi::OsString> = watched
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

/// Reads `path` and applies its policies if its text is not `last` (or if `forced`).
async fn reload(app: &App, path: &Path, last: &mut String, forced: bool) {
    let text = match tokio::fs::read_to_string(path).await {
        Ok(text) => text,
        Err(error) => {
            // Mid-swap, or removed: the running config stays, and the next event reads again.
            tracing::warn!(file = %path.display(), "config not reloaded: reading it: {error}");
            app.metrics().count_reload("failed");
            return;
        }
    };
    if text == *last && !forced {
        return;
    }
    if text.trim().is_empty() {
        // Caught between an editor's truncation and its write, most likely: an empty file
        // would remove every policy the file defines.
        tracing::warn!(file = %path.display(), "config not reloaded: the file is empty");
        app.metrics().count_reload("failed");
        return;
    }
    // Remembered even if it fails: the same bad text is reported once, not at every event.
    *last = text.clone();
    let config = match ConfigFile::parse(&text) {
        Ok(config) => config,
        Err(problems) => {
            let list: Vec<String> = problems.iter().map(|p| format!("  - {p}")).collect();
            tracing::warn!(
                file = %path.display(),
                "config not reloaded, the running one is kept: it is not valid:\n{}",
                list.join("\n")
            );
            app.metrics().count_reload("failed");
            return;
        }
    };
    if config.policy.is_empty()
        && !names_policies(&text)
        && app.an_empty_file_would_remove_policies().await
    {
        // A comment-only file, or one cut short by a write that was not atomic: taken as is, it
        // would remove every policy, leases and all.
        tracing::warn!(
            file = %path.display(),
            "config not reloaded, the running one is kept: the file has no [[policy]] tables, which would remove every policy; to remove them all, say so with `policy = []`"
        );
        app.metrics().count_reload("failed");
        return;
    }
    match app.reload_policies(config.policy).await {
        Ok(reloaded) if reloaded.is_empty() => {
            tracing::info!(file = %path.display(), "config reloaded: its policies are as running");
            app.metrics().count_reload("unchanged");
        }
        Ok(reloaded) if !reloaded.failed.is_empty() => {
            tracing::warn!(
                file = %path.display(),
                created = ?reloaded.created,
                changed = ?reloaded.changed,
                removed = ?reloaded.removed,
                "config reloaded in part; not applied: {}",
                reloaded.failed.join("; ")
            );
            app.metrics().count_reload("failed");
        }
        Ok(reloaded) => {
            tracing::info!(
                file = %path.display(),
                created = ?reloaded.created,
                changed = ?reloaded.changed,
                removed = ?reloaded.removed,
                "config reloaded"
            );
            app.metrics().count_reload("applied");
        }
        Err(error) => {
            tracing::warn!(
                file = %path.display(),
                "config not reloaded, the running one is kept: {error}"
            );
            app.metrics().count_reload("failed");
        }
    }
}
