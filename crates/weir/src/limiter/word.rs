//! The one compare-and-swap loop every limiter's state goes through.
//!
//! A rate limiter's whole state is one `u64`: a GCRA bucket's theoretical arrival time (with its
//! shape's epoch packed beside it), or a strict limiter's next free slot. Every decision reads
//! that word, computes the next one, and swaps it in only if nobody changed it meanwhile. That
//! loop lives here, once; the algorithms pass it the step.

use std::sync::atomic::Ordering;

use crate::sync::AtomicU64;

/// Applies `step` to `word` atomically: `step` sees the current value and returns the next one
/// and a result, or an error that leaves the word untouched. `step` may run more than once (each
/// time another thread won the race), so it must not have side effects.
#[inline]
pub(crate) fn update<R, E>(
    word: &AtomicU64,
    mut step: impl FnMut(u64) -> Result<(u64, R), E>,
) -> Result<R, E> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let (next, out) = step(current)?;
        match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(out),
            Err(actual) => current = actual,
        }
    }
}

/// [`update`] for a step that cannot fail.
#[inline]
pub(crate) fn apply<R>(word: &AtomicU64, mut step: impl FnMut(u64) -> (u64, R)) -> R {
    match update(word, |current| {
        Ok::<_, std::convert::Infallible>(step(current))
    }) {
        Ok(out) => out,
        Err(never) => match never {},
    }
}
