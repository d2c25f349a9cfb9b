//! What went wrong asking Redis, told apart: an *outage* (Redis not there to decide: no
//! connection, no answer in time, loading its data, a replica where the master was) is decided
//! by `on_unavailable`; an *answer* (Redis there, saying no: out of memory, a key of another
//! type, a wrong password) is an error by name — a Redis that refuses writes under
//! `maxmemory` must not turn an exhausted quota into a fail-open admission.
//!
//! Each kind is counted (`weir_redis_errors_total{kind}`) and logged at most once a minute.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use redis::{ErrorKind, RedisError};

use crate::log_gate::LogGate;

/// One kind of failure: the label `kind` of `weir_redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisErrorKind {
    /// No answer within the timeout.
    Timeout,
    /// No connection, or one dropped: Redis down, restarting, unreachable.
    Connection,
    /// Redis is loading its data set, or busy running a script.
    Loading,
    /// The server asked is a replica (a failover moved the master).
    ReadOnly,
    /// `maxmemory` reached with a policy that evicts nothing: writes are refused.
    OutOfMemory,
    /// The bucket's key holds a value of another type.
    WrongType,
    /// The password (or user) is wrong, or missing.
    Auth,
    /// The script is not in Redis's cache and could not be loaded.
    NoScript,
    /// Redis answered something the decision cannot read (a damaged bucket).
    Reply,
    /// Any other error Redis answered.
    Other,
}

impl RedisErrorKind {
    /// Every kind, in the order of their counters.
    pub const ALL: [RedisErrorKind; 10] = [
        RedisErrorKind::Timeout,
        RedisErrorKind::Connection,
        RedisErrorKind::Loading,
        RedisErrorKind::ReadOnly,
        RedisErrorKind::OutOfMemory,
        RedisErrorKind::WrongType,
        RedisErrorKind::Auth,
        RedisErrorKind::NoScript,
        RedisErrorKind::Reply,
        RedisErrorKind::Other,
    ];

    /// Its label.
    pub fn name(self) -> &'static str {
        match self {
            RedisErrorKind::Timeout => "timeout",
            RedisErrorKind::Connection => "connection",
            RedisErrorKind::Loading => "loading",
            RedisErrorKind::ReadOnly => "read_only",
            RedisErrorKind::OutOfMemory => "out_of_memory",
            RedisErrorKind::WrongType => "wrong_type",
            RedisErrorKind::Auth => "auth",
            RedisErrorKind::NoScript => "no_script",
            RedisErrorKind::Reply => "reply",
            RedisErrorKind::Other => "other",
        }
    }

    /// Whether Redis was not there to decide (`on_unavailable` decides), rather than there
    /// and answering with an error (the request is refused, naming it).
    pub fn is_outage(self) -> bool {
        matches!(
            self,
            RedisErrorKind::Timeout
                | RedisErrorKind::Connection
                | RedisErrorKind::Loading
                | RedisErrorKind::ReadOnly
        )
    }

    /// The kind of `error`, from what the client saw and the code Redis answered.
    pub fn of(error: &RedisError) -> RedisErrorKind {
        if error.is_timeout() {
            return RedisErrorKind::Timeout;
        }
        match error.code() {
            Some("OOM") => return RedisErrorKind::OutOfMemory,
            Some("WRONGTYPE") => return RedisErrorKind::WrongType,
            Some("NOAUTH" | "WRONGPASS" | "NOPERM") => return RedisErrorKind::Auth,
            Some("BUSY" | "LOADING") => return RedisErrorKind::Loading,
            Some("READONLY") => return RedisErrorKind::ReadOnly,
            Some("NOSCRIPT") => return RedisErrorKind::NoScript,
            _ => {}
        }
        // A script's error carries the code of the command that failed inside it.
        let detail = error.detail().unwrap_or_default();
        if detail.contains("WRONGTYPE") {
            return RedisErrorKind::WrongType;
        }
        if detail.contains("OOM command not allowed") {
            return RedisErrorKind::OutOfMemory;
        }
        match error.kind() {
            ErrorKind::IoError
            | ErrorKind::ClusterDown
            | ErrorKind::MasterDown
            | ErrorKind::TryAgain
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::NoValidReplicasFoundBySentinel => RedisErrorKind::Connection,
            ErrorKind::BusyLoadingError => RedisErrorKind::Loading,
            ErrorKind::ReadOnly => RedisErrorKind::ReadOnly,
            ErrorKind::AuthenticationFailed => RedisErrorKind::Auth,
            ErrorKind::NoScriptError => RedisErrorKind::NoScript,
            ErrorKind::TypeError | ErrorKind::ParseError => RedisErrorKind::Reply,
            _ if error.is_connection_dropped() || error.is_connection_refusal() => {
                RedisErrorKind::Connection
            }
            _ => RedisErrorKind::Other,
        }
    }
}

/// The failures seen, by kind: counted, logged once a minute a kind, and whether Redis is
/// unreachable now (for `/readyz`).
#[derive(Debug, Default)]
pub struct RedisErrors {
    counts: [AtomicU64; RedisErrorKind::ALL.len()],
    gates: [LogGate; RedisErrorKind::ALL.len()],
    /// Set by an outage, cleared by the next decision Redis makes.
    unreachable: AtomicBool,
    last_outage: Mutex<Option<(Instant, String)>>,
}

impl RedisErrors {
    /// Counts `error` of `kind`, logs it if its kind was not logged within a minute, and
    /// notes an outage.
    pub fn saw(&self, kind: RedisErrorKind, error: &dyn std::fmt::Display) {
        let at = RedisErrorKind::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("every kind is in ALL");
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        if kind.is_outage() {
            self.unreachable.store(true, Ordering::Relaxed);
            *self.last_outage.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((Instant::now(), error.to_string()));
        }
        if let Some(unlogged) = self.gates[at].pass() {
            let kind = kind.name();
            tracing::warn!(
                kind,
                unlogged,
                "Redis could not decide (logged at most once a minute a kind; see weir_redis_errors_total): {error}"
            );
        }
    }

    /// A decision Redis made: it is reachable.
    pub fn answered(&self) {
        // A load, not a store, on the hot path: the flag is written only by failures.
        if self.unreachable.load(Ordering::Relaxed) {
            self.unreachable.store(false, Ordering::Relaxed);
        }
    }

    /// Failures so far, by kind.
    pub fn counts(&self) -> impl Iterator<Item = (RedisErrorKind, u64)> + '_ {
        RedisErrorKind::ALL
            .iter()
            .zip(&self.counts)
            .map(|(kind, count)| (*kind, count.load(Ordering::Relaxed)))
    }

    /// While the last thing asked of Redis was an outage: since when, and what it was.
    pub fn unreachable(&self) -> Option<(Instant, String)> {
        if !self.unreachable.load(Ordering::Relaxed) {
            return None;
        }
        self.last_outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
