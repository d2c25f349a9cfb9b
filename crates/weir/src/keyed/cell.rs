//! What a key holds: one word for a rate limiter or a window (with its waiters and
//! whether "who is throttled" follows it), a shared [`Concurrency`] for an in-flight limit.

use super::{
    Arc, AtomicBool, AtomicU32, AtomicU64, Cell, Concurrency, ConcurrencyConfig, InShape, Limit,
    Nanos, Ordering, RateShape, Window,
};

/// The state of one key of a rate limiter: 16 bytes.
#[derive(Debug)]
pub(crate) struct RateCell {
    /// GCRA: the theoretical arrival time. Strict: the next free slot.
    pub(super) value: AtomicU64,
    /// Requests waiting in this key's fair line (the line itself lives in `lines`).
    pub(super) waiting: AtomicU32,
    /// The "who is throttled" table follows this key: report its traffic.
    pub(super) tracked: AtomicBool,
}

impl RateCell {
    /// The cell's GCRA bucket, in `shape`.
    #[inline]
    pub(super) fn bucket(&self, shape: &RateShape) -> InShape<'_> {
        InShape {
            word: &self.value,
            params: shape.params(),
        }
    }
}

impl Cell<RateShape> for RateCell {
    fn new(shape: &RateShape, now: Nanos) -> Self {
        let value = match *shape {
            RateShape::Gcra { initial, .. } => shape.params().tat_holding(initial, now),
            RateShape::Strict { .. } => 0,
        };
        RateCell {
            value: AtomicU64::new(value),
            waiting: AtomicU32::new(0),
            tracked: AtomicBool::new(false),
        }
    }

    fn is_idle(&self, _shape: &RateShape, now: Nanos) -> bool {
        // A GCRA bucket whose TAT has passed is full; a strict limiter whose next slot has
        // passed banks nothing. Either way a fresh cell would be no looser.
        self.waiting.load(Ordering::Acquire) == 0 && self.value.load(Ordering::Acquire) <= now
    }

    /// The TAT, or the next slot: later is emptier.
    fn word(&self, _shape: &RateShape) -> Option<&AtomicU64> {
        Some(&self.value)
    }
}

/// A window's cell: the count's word in `value` (`waiting` stays 0).
impl Cell<Window> for RateCell {
    fn new(_shape: &Window, _now: Nanos) -> Self {
        RateCell {
            // Window 0, no hits: empty whatever the time.
            value: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            tracked: AtomicBool::new(false),
        }
    }

    fn is_idle(&self, window: &Window, now: Nanos) -> bool {
        // A window with no hits now (an ended one) holds nothing a fresh cell would not.
        window.is_empty(self.value.load(Ordering::Acquire), now)
    }

    /// For a count whose word grows as the window fills.
    fn word(&self, window: &Window) -> Option<&AtomicU64> {
        window.word_grows_as_it_fills().then_some(&self.value)
    }
}

/// A concurrency key's cell is shared with its permits and waiters, which hold it directly.
impl Cell<Limit> for Arc<Concurrency> {
    fn new(&Limit(limit): &Limit, _now: Nanos) -> Self {
        Arc::new(Concurrency::new(ConcurrencyConfig { limit }))
    }

    fn is_idle(&self, _shape: &Limit, _now: Nanos) -> bool {
        Arc::strong_count(self) == 1 && self.in_flight() == 0 && self.waiters() == 0
    }
}
