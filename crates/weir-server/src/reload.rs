//! Live config reload: the config file watched, and its policies re-applied when it changes or
//! on SIGHUP.
//!
//! The file is watched as [`crate::watch`] explains (a ConfigMap's `..data` swap, editors'
//! renames); each change reads it again through its path, and the text is applied only if it
//! differs from the last one read. SIGHUP reads and applies the file at once.
//!
//! Only the `[[policy]]` tables are applied live ([`crate::app::PolicyAdmin::reload_policies`]); `[server]` and
//! `[rls]` take effect at the next start. A file that does not parse or check keeps the running
//! config: the reason is logged (with the line, for TOML) and counted in
//! `weir_config_reloads_total{outcome="failed"}`; the node stays ready. So does a file with no
//! `[[policy]]` table at all while policies it defined run — an empty or comment-only file, or
//! one cut short by a write that was not atomic — unless it says `policy = []`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::signal::unix::Signal;

use crate::app::App;
use crate::config::ConfigFile;
use crate::watch::{Change, Changes};

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
    let mut changes = Changes::new(&[&path], hangups, "config changes");
    tokio::spawn(async move {
        let mut last = started;
        // A change made between the file's first reading and the watch's start is applied
        // now; with none, this finds the text unchanged and does nothing.
        reload(&app, &path, &mut last, false).await;
        while let Some(change) = changes.next().await {
            reload(&app, &path, &mut last, change == Change::Forced).await;
        }
    });
}

/// Whether the config text has a top-level `policy` key, if only `policy = []`: a file that
/// means to have no policies says so.
fn names_policies(text: &str) -> bool {
    text.parse::<toml::Table>()
        .is_ok_and(|table| table.contains_key("policy"))
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
        && app
            .policy_admin()
            .an_empty_file_would_remove_policies()
            .await
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
    match app.policy_admin().reload_policies(config.policy).await {
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
