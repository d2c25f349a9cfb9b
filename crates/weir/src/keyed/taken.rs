//! What an admission took (to give it back if another policy refuses), and why a keyed limiter
//! refused.

use super::{KeysExhausted, Nanos, OwnedPermit, Refused};

/// What an admission took, so that it can be given back if another policy refuses the request.
///
/// For a concurrency limiter it holds the permits, released when this is dropped.
#[derive(Debug)]
#[must_use = "dropping a concurrency admission releases its permit"]
pub struct Taken {
    pub(super) what: What,
    /// The request went to the shared overflow bucket, or was decided in the sketch.
    pub(super) overflowed: bool,
}

#[derive(Debug)]
pub(super) enum What {
    /// GCRA tokens (converted to time with the shape in force when given back).
    Tokens(u64),
    /// A strict slot starting at `slot`, `span` nanoseconds long.
    Slot { slot: Nanos, span: u64 },
    /// Hits counted in the window of `at`.
    Hits { cost: u64, at: Nanos },
    /// In-flight permits, released when dropped.
    Permit(#[allow(dead_code)] OwnedPermit),
    /// Nothing.
    Nothing,
}

impl Taken {
    /// An admission that took nothing (monitor mode, an unlimited kind).
    pub fn nothing() -> Self {
        Taken {
            what: What::Nothing,
            overflowed: false,
        }
    }

    /// Whether the request was counted against the shared overflow bucket.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub(super) fn new(what: What, overflowed: bool) -> Self {
        Taken { what, overflowed }
    }
}

/// Why a keyed limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedRefusal {
    /// The key's bucket refused.
    Limited(Refused),
    /// The map was at `max_keys` with nothing idle, and the policy refuses overflowing keys.
    KeysExhausted,
    /// A waiting acquire waited its whole `max_wait` without getting its turn.
    TimedOut,
}

impl From<KeysExhausted> for KeyedRefusal {
    fn from(_: KeysExhausted) -> Self {
        KeyedRefusal::KeysExhausted
    }
}
