//! Fair lines in a build without the `tokio` feature, where nothing waits: every line is
//! empty, and these stand-ins answer as an empty line does. The limiters name their lines the
//! same way in both builds (`fair_line::FairLine`, `keyed`'s `lines::Lines`), so what waiting
//! adds to a decision is written once, not once per build.

/// A fair bucket's line, always empty.
#[derive(Debug, Default)]
pub(crate) struct FairLine;

impl FairLine {
    /// Nobody waits.
    pub fn len(&self) -> usize {
        0
    }

    /// Nothing is queued ahead.
    pub fn unclaimed_cost(&self) -> u64 {
        0
    }

    /// `change`, with no head's claim to hand back.
    pub fn with_claim_released<R>(
        &self,
        _give_back: impl FnOnce(u64),
        change: impl FnOnce() -> R,
    ) -> R {
        change()
    }
}

/// A keyed limiter's lines, all empty.
#[derive(Debug, Default)]
pub(crate) struct Lines;

impl Lines {
    /// Nothing is queued ahead of any key.
    pub fn unclaimed_cost(&self, _key: &str, _overflowed: bool) -> u64 {
        0
    }

    /// `change`, with no head's claim to hand back.
    pub fn with_claims_released<S, R>(&self, _store: &S, change: impl FnOnce() -> R) -> R {
        change()
    }
}
