//! Log lines that a client, an attacker or a lasting fault could otherwise repeat without end,
//! kept to at most one a minute for each kind.
//!
//! A line an outsider can cause (a report naming an unknown bucket, a reset HTTP/2 stream) or
//! that a fault repeats every second (a full disk, an unreachable voter) is worth reading once:
//! after that, a log that scrolls hides everything else and costs disk. So each kind of such a
//! line is *counted* every time (in a metric beside it) and *logged* at most once a minute,
//! the logged line saying how many went unlogged since the last.
//!
//! [`LogGate`] does it for Weir's own lines. [`ForeignLines`] does it for the libraries under
//! Weir (HTTP/2, Raft, gRPC), whose lines Weir does not write: each of their call sites logs at
//! most once a minute, and what it held back is counted by library in
//! `weir_log_lines_suppressed_total`. One kind of theirs is held back always: the Raft
//! library's ERROR that a member is unreachable, which every restart of a member causes —
//! Weir says that itself, at INFO, where it calls the member.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Metadata;
use tracing::callsite::Identifier;
use tracing_subscriber::layer::{Context, Filter};

/// How often one kind of line is logged at most.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// One kind of line: counted every time it happens, logged at most once per [`LOG_EVERY`].
#[derive(Debug)]
pub struct LogGate {
    last_logged: Mutex<Option<Instant>>,
    seen: AtomicU64,
    unlogged: AtomicU64,
}

impl Default for LogGate {
    fn default() -> Self {
        LogGate::new()
    }
}

impl LogGate {
    /// A gate that has logged nothing yet.
    pub const fn new() -> Self {
        LogGate {
            last_logged: Mutex::new(None),
            seen: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence now; `Some(unlogged)` when it is to be logged, with how many
    /// occurrences went unlogged since the last logged line.
    pub fn pass(&self) -> Option<u64> {
        self.pass_at(Instant::now())
    }

    /// [`pass`](Self::pass), at `now`.
    pub fn pass_at(&self, now: Instant) -> Option<u64> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| now.saturating_duration_since(at) < LOG_EVERY) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }

    /// Occurrences counted so far, logged or not.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

/// Lines from outside Weir's own crates held back so far, by the library that would have
/// written them (the first part of its target: `h2`, `openraft`…).
static SUPPRESSED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Lines held back so far, by library: what `weir_log_lines_suppressed_total` shows.
pub fn suppressed() -> Vec<(&'static str, u64)> {
    let suppressed = SUPPRESSED.lock().unwrap_or_else(|p| p.into_inner());
    suppressed.iter().map(|(k, v)| (*k, *v)).collect()
}

/// A filter for a log layer: the lines of libraries under Weir pass at most once a minute for
/// each of their call sites; Weir's own lines always pass (they are gated where written, with
/// `LogGate`, when an outsider can repeat them).
#[derive(Debug, Default)]
pub struct ForeignLines {
    last_logged: Mutex<HashMap<Identifier, Instant>>,
}

impl ForeignLines {
    /// A filter that has let nothing through yet.
    pub fn new() -> Self {
        ForeignLines::default()
    }

    /// Whether a line of `meta` may be logged at `now`; counts it if not.
    fn passes_at(&self, meta: &'static Metadata<'static>, now: Instant) -> bool {
        if !meta.is_event() || is_weirs(meta.target()) {
            return true;
        }
        let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        let id = meta.callsite();
        match last.get(&id) {
            Some(at) if now.saturating_duration_since(*at) < LOG_EVERY => {
                drop(last);
                count_suppressed(meta);
                false
            }
            _ => {
                // Bounded by the call sites compiled in.
                last.insert(id, now);
                true
            }
        }
    }
}

/// Counts a line of a library held back, by library.
fn count_suppressed(meta: &'static Metadata<'static>) {
    let library = meta.target().split("::").next().unwrap_or("");
    let mut suppressed = SUPPRESSED.lock().unwrap_or_else(|p| p.into_inner());
    *suppressed.entry(library).or_default() += 1;
}

/// Whether `event` is the Raft library's report of a member it could not reach, which Weir
/// logs itself (`policy_log::network`).
fn said_by_weir(event: &tracing::Event<'_>) -> bool {
    struct Unreachable(bool);
    impl tracing::field::Visit for Unreachable {
        fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0 |= format!("{value:?}").contains("Unreachable");
        }
    }
    if !event.metadata().target().starts_with("openraft") {
        return false;
    }
    let mut found = Unreachable(false);
    event.record(&mut found);
    found.0
}

/// Whether `target` is one of Weir's own crates'.
fn is_weirs(target: &str) -> bool {
    target.split("::").next().is_some_and(|krate| {
        krate == "weir" || krate.starts_with("weir_") || krate.starts_with("weir-")
    })
}

impl<S> Filter<S> for ForeignLines {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        // Whether a line passes depends on when it comes: decided per line, below.
        true
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        // It holds back no level: the layer's level filter alone sets the process's maximum
        // level (without a hint, every disabled `trace!` would be looked at per call).
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, _: &Context<'_, S>) -> bool {
        if said_by_weir(event) {
            count_suppressed(event.metadata());
            return false;
        }
        self.passes_at(event.metadata(), Instant::now())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if meta.is_event() && !is_weirs(meta.target()) {
            // Each line is looked at: whether it passes depends on when it comes.
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::always()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_logs_the_first_then_once_a_minute_saying_how_many_it_held_back() {
        let gate = LogGate::new();
        let t0 = Instant::now();
        assert_eq!(gate.pass_at(t0), Some(0));
        for s in 1..60 {
            assert_eq!(gate.pass_at(t0 + Duration::from_secs(s)), None, "{s} s");
        }
        assert_eq!(gate.pass_at(t0 + Duration::from_secs(60)), Some(59));
        assert_eq!(gate.pass_at(t0 + Duration::from_secs(61)), None);
        assert_eq!(gate.seen(), 62);
    }

    /// A writer that keeps what a log layer writes.
    #[derive(Clone, Default)]
    struct Kept(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What a log layer filtered by [`ForeignLines`] writes of the lines `log` emits.
    fn written_through_the_filter(log: impl FnOnce()) -> String {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::{Layer as _, fmt};
        let kept = Kept::default();
        let writer = kept.clone();
        let layer = fmt::layer()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_filter(ForeignLines::new());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), log);
        String::from_utf8(kept.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_librarys_line_repeated_is_written_once_and_the_rest_counted() {
        let before = suppressed()
            .into_iter()
            .find(|(source, _)| *source == "h2")
            .map_or(0, |(_, n)| n);
        let text = written_through_the_filter(|| {
            for _ in 0..1000 {
                tracing::warn!(target: "h2::proto::streams", "locally-reset streams reached limit");
            }
            for _ in 0..3 {
                tracing::warn!(target: "weir_server::connections", "a line of Weir's own");
            }
        });
        assert_eq!(text.matches("locally-reset streams").count(), 1, "{text}");
        assert_eq!(text.matches("a line of Weir's own").count(), 3, "{text}");
        let after = suppressed()
            .into_iter()
            .find(|(source, _)| *source == "h2")
            .map_or(0, |(_, n)| n);
        assert_eq!(after - before, 999);
    }

    #[test]
    fn the_raft_librarys_unreachable_member_is_held_back_and_its_other_errors_pass() {
        let text = written_through_the_filter(|| {
            let err = "Unreachable node: calling http://127.0.0.1:1: tcp connect error";
            tracing::error!(target: "openraft::replication", err, "RPCError");
            tracing::error!(target: "openraft::storage", "a log entry could not be read");
        });
        assert!(!text.contains("RPCError"), "{text}");
        assert!(text.contains("a log entry could not be read"), "{text}");
    }

    #[test]
    fn the_filter_leaves_the_process_s_maximum_level_to_the_level_filter() {
        use tracing_subscriber::filter::{EnvFilter, FilterExt as _};
        let filter = EnvFilter::new("warn").and(ForeignLines::new());
        let hint = Filter::<tracing_subscriber::Registry>::max_level_hint(&filter);
        assert_eq!(hint, Some(tracing::level_filters::LevelFilter::WARN));
    }

    #[test]
    fn weirs_own_targets_are_told_from_libraries() {
        for ours in [
            "weir",
            "weir_server::policy_log",
            "weir_cluster",
            "weir::admission",
        ] {
            assert!(is_weirs(ours), "{ours}");
        }
        for theirs in [
            "h2::proto::connection",
            "openraft::core",
            "hyper",
            "weirdo",
            "tonic",
        ] {
            assert!(!is_weirs(theirs), "{theirs}");
        }
    }
}
