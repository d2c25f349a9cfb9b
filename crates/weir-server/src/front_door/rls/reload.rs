//! The rules read at start, and reloaded live as the reference server reloads its directory: the rules file, or
//! the directory and everything under it, watched (a mounted ConfigMap's swap, a file added,
//! changed or removed), and read again on SIGHUP too.
//!
//! Each change reads the rules again whole. Rules that read as the running ones change
//! nothing. Rules with a mistake anywhere — or that cannot be read, mid-swap — keep the
//! running ones: every mistake is logged by file and line, the reload is counted `failed` in
//! `weir_rls_reloads_total`, and the node stays ready. Otherwise only the difference is
//! applied ([`LiveRules::reload`]): a rule that stays keeps its counts and its counters.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::signal::unix::Signal;

use super::config::RulesConfig;
use super::files::SameDomain;
use super::live::LiveRules;
use crate::app::App;
use crate::config::ConfigFile;
use crate::watch::{Change, Changes};

/// The RLS rules `[rls] config` names, if any, with every mistake in them listed.
pub fn read_at_start(config: &ConfigFile) -> anyhow::Result<Option<RulesConfig>> {
    let Some(path) = &config.rls.config else {
        return Ok(None);
    };
    RulesConfig::load(path, config.rls.same_domain())
        .map(Some)
        .map_err(|errors| {
            let list: Vec<String> = errors.iter().map(|e| format!("  - {e}")).collect();
            anyhow::anyhow!(
                "the RLS rules in {} are not valid:\n{}",
                path.display(),
                list.join("\n")
            )
        })
}

/// Watches the rules at `path` (read at start as `started`), reloading them into `live` (and
/// `app`'s policies) when they change or on `hangups` (SIGHUP), until the process ends.
pub fn watch(
    app: Arc<App>,
    live: Arc<LiveRules>,
    path: PathBuf,
    same_domain: SameDomain,
    started: RulesConfig,
    hangups: Signal,
) {
    let mut changes = if path.is_dir() {
        Changes::under(&path, hangups, "RLS rule changes")
    } else {
        Changes::new(&[&path], hangups, "RLS rule changes")
    };
    tokio::spawn(async move {
        let mut running = started;
        // A change made between the rules' first reading and the watch's start is applied
        // now; with none, this finds the rules unchanged and does nothing.
        reload((&app, &live), &path, same_domain, &mut running, false).await;
        while let Some(change) = changes.next().await {
            reload(
                (&app, &live),
                &path,
                same_domain,
                &mut running,
                change == Change::Forced,
            )
            .await;
        }
    });
}

/// Reads the rules at `path` and applies them if they are not `running` (or if `forced`).
async fn reload(
    (app, live): (&App, &LiveRules),
    path: &std::path::Path,
    same_domain: SameDomain,
    running: &mut RulesConfig,
    forced: bool,
) {
    let read = {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || RulesConfig::load(&path, same_domain)).await
    };
    let rules = match read {
        Ok(Ok(rules)) => rules,
        Ok(Err(mistakes)) => {
            let list: Vec<String> = mistakes.iter().map(|m| format!("  - {m}")).collect();
            tracing::warn!(
                rules = %path.display(),
                "RLS rules not reloaded, the running ones are kept:\n{}",
                list.join("\n")
            );
            live.count_reload("failed");
            return;
        }
        Err(error) => {
            tracing::warn!(rules = %path.display(), "RLS rules not reloaded: {error}");
            live.count_reload("failed");
            return;
        }
    };
    if rules == *running && !forced {
        return;
    }
    match live.reload(app, &rules).await {
        Ok(reloaded) if !reloaded.failed.is_empty() => {
            tracing::warn!(
                rules = %path.display(),
                created = ?reloaded.created,
                changed = ?reloaded.changed,
                removed = ?reloaded.removed,
                "RLS rules reloaded in part; not applied: {}",
                reloaded.failed.join("; ")
            );
            live.count_reload("failed");
        }
        Ok(reloaded) => {
            let outcome = if rules == *running {
                "unchanged"
            } else {
                "applied"
            };
            tracing::info!(
                rules = %path.display(),
                domains = rules.domains.len(),
                created = ?reloaded.created,
                changed = ?reloaded.changed,
                removed = ?reloaded.removed,
                "RLS rules reloaded"
            );
            live.count_reload(outcome);
        }
        Err(error) => {
            tracing::warn!(
                rules = %path.display(),
                "RLS rules not reloaded, the running ones are kept: {error}"
            );
            live.count_reload("failed");
            return;
        }
    }
    *running = rules;
}
