//! What a keyed limiter tells a bucket's next owner and takes on from the previous one in
//! cluster mode: the keys not whole, what another node spent, the learning period's hold.

use super::{AtomicU64, Buckets, Clock, Duration, KeyedLimiter, Nanos, Ordering, Quota};

impl<C: Clock> KeyedLimiter<C> {
    /// Every tracked rate key that is not whole now, with what it has left, for the keys
    /// `moving` picks: what this node hands a bucket's next owner when the ring moves the
    /// bucket away ([`absorb`](Self::absorb) on the other side). A walk over every key: for
    /// membership changes, never per request. Empty for a concurrency limiter.
    pub fn spent_keys(&self, mut moving: impl FnMut(&str) -> bool) -> Vec<(String, Quota)> {
        let mut spent = Vec::new();
        self.visit_spent(|key, _, quota| {
            if moving(key) {
                spent.push((key.to_owned(), quota));
            }
        });
        spent
    }

    /// Calls `visit` with every tracked rate key that is not whole now: the key, its cell's
    /// state as one word — which changes when a decision changes the bucket, never as time
    /// passes, so a caller that keeps buckets elsewhere can tell which changed since it last
    /// looked — and what the key has left. A walk over every key that holds each shard's read
    /// lock while it visits the shard's keys: `visit` should be quick. Nothing for a
    /// concurrency limiter.
    pub fn visit_spent(&self, mut visit: impl FnMut(&str, u64, Quota)) {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => store.for_each(|key, shape, cell| {
                let word = cell.value.load(Ordering::Acquire);
                let quota = shape.quota(word, now);
                if !quota.reset_after.is_zero() {
                    visit(key, word, quota);
                }
            }),
            Buckets::Window(store) => store.for_each(|key, shape, cell| {
                let word = cell.value.load(Ordering::Acquire);
                let quota = shape.quota(word, now);
                if quota.used > 0 {
                    visit(key, word, quota);
                }
            }),
            Buckets::Concurrency(_) => {}
        }
    }

    /// Takes on what another node spent of `key` (its [`spent_keys`](Self::spent_keys)
    /// entry): the bucket is left no fuller than `handed` says, and never made fuller than it
    /// is. A rate bucket takes the time until it is whole again; a window takes the count as
    /// its count says (a fixed window, only if `handed` is of the window in force here). A key
    /// past the cap is taken on in the sketch; with a shared overflow cell it is left alone
    /// (that cell is everyone's).
    pub fn absorb(&self, key: &str, handed: Quota) {
        let now = self.clock.now();
        match &self.buckets {
            Buckets::Rate(store) => {
                let whole_at =
                    now.saturating_add(crate::clock::duration_to_nanos(handed.reset_after));
                let _ = store.with(key, now, |found| {
                    if !found.overflowed || found.sketched {
                        raise_to(&found.cell.value, whole_at);
                    }
                });
            }
            Buckets::Window(store) => {
                let _ = store.with(key, now, |found| {
                    if !found.overflowed || found.sketched {
                        found.shape.take_on(&found.cell.value, handed, now);
                    }
                });
            }
            Buckets::Concurrency(_) => {}
        }
    }

    /// Sets aside part of `key`'s bucket for what its owner has lent other nodes (rate
    /// assignments in cluster mode): `before` of its refill over `elapsed` is taken out, and it
    /// is left holding no more than `1 − after` of its capacity. Shares are in `0..=1`. Returns
    /// the whole tokens the second part took out — what the node whose share grew may start
    /// with. A window, a concurrency limiter, or a key past the cap with a shared overflow cell
    /// is left alone.
    pub fn set_aside(&self, key: &str, before: f64, elapsed: Duration, after: f64) -> u64 {
        let Buckets::Rate(store) = &self.buckets else {
            return 0;
        };
        let now = self.clock.now();
        let debit = (before.clamp(0.0, 1.0) * crate::clock::duration_to_nanos(elapsed) as f64)
            .ceil() as u64;
        store
            .with(key, now, |found| {
                if found.overflowed && !found.sketched {
                    return 0;
                }
                let params = found.shape.params();
                let floor =
                    now.saturating_add(
                        (after.clamp(0.0, 1.0) * params.tolerance as f64).ceil() as u64
                    );
                let debited = |tat: u64| tat.max(now).saturating_add(debit);
                match found
                    .cell
                    .value
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                        Some(debited(tat).max(floor))
                    }) {
                    Ok(tat) | Err(tat) => floor.saturating_sub(debited(tat)) / params.interval,
                }
            })
            .unwrap_or(0)
    }

    /// What a bucket's new owner allows while it cannot know what the previous owner spent:
    /// leaves `key` holding the share of its capacity that `held_for` is of its refill time
    /// (or of `learning`, if shorter), never making it fuller than it is. With `learning` at
    /// least the refill time, the bucket holds what it refilled in `held_for` and refills at
    /// its rate from there, so it admits no more than one bucket would have; a shorter
    /// `learning` lets it fill sooner. A window is held as its count says (a fixed window begun
    /// before `held_for` ago is full until it ends).
    pub fn hold_to_tenure(&self, key: &str, held_for: Duration, learning: Duration) {
        let now = self.clock.now();
        let held_for = crate::clock::duration_to_nanos(held_for);
        let learning = crate::clock::duration_to_nanos(learning);
        match &self.buckets {
            Buckets::Rate(store) => {
                let _ = store.with(key, now, |found| {
                    let tolerance = found.shape.params().tolerance;
                    let window = tolerance.min(learning).max(1);
                    let share = (held_for as f64 / window as f64).min(1.0);
                    // Rounded up: the bucket only ever comes out emptier.
                    let missing = (tolerance as f64 * (1.0 - share)).ceil() as u64;
                    if !found.overflowed || found.sketched {
                        raise_to(&found.cell.value, now.saturating_add(missing));
                    }
                });
            }
            Buckets::Window(store) => {
                let _ = store.with(key, now, |found| {
                    if !found.overflowed || found.sketched {
                        found
                            .shape
                            .hold_for_tenure(&found.cell.value, held_for, now);
                    }
                });
            }
            Buckets::Concurrency(_) => {}
        }
    }
}

/// Moves a rate cell's TAT (or next slot) to `at` if it is earlier: the bucket only empties.
pub(super) fn raise_to(value: &AtomicU64, at: Nanos) {
    let _ = value.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
        (tat < at).then_some(at)
    });
}
