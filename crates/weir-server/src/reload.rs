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
//! `weir_config_reloads_total{outcome="failed"}`; the node stays ready.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use notify::Watcher as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::app::App;
use crate::config::ConfigFile;

/// How long events are let settle before the file is read: a swap or an editor's save is
/// several events in a row.
const SETTLE: Duration = Duration::from_millis(100);

/// Watches `path` (the config file `weir serve` was started with; `None`: the embedded
/// default, which never changes) and applies its policies to `app` when it changes or on
/// SIGHUP, until the process ends.
pub fn watch(app: Arc<App>, path: Option<PathBuf>) -> anyhow::Result<()> {
    let mut hangups = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    let Some(path) = path else {
        // SIGHUP's default action would end the process: a reload asked of a node without a
        // file is said to be one, not obeyed by dying.
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::warn!("SIGHUP: no config file to reload (running the embedded default)");
            }
        });
        return Ok(());
    };
    // What the node started with, as near as can be read: a change made since is seen at the
    // next event.
    let started = std::fs::read_to_string(&path).unwrap_or_default();
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let (changed, mut changes) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            // A change already signalled and not yet read covers this one.
            let _ = changed.try_send(());
        }
    })
    .context("starting the config file's watcher")?;
    watcher
        .watch(&dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {} for config changes", dir.display()))?;
    tokio::spawn(async move {
        // Kept for as long as the loop runs: dropped, it would stop watching.
        let _watcher = watcher;
        let mut last = started;
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
    Ok(())
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
    match app.reload_policies(config.policy).await {
        Ok(reloaded) if reloaded.is_empty() => {
            tracing::info!(file = %path.display(), "config reloaded: its policies are as running");
            app.metrics().count_reload("unchanged");
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
