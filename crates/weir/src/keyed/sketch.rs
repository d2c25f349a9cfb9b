//! A fixed-size sketch of bucket state for keys the exact map has no room for.
//!
//! A keyed limiter at its `max_keys` with nothing idle cannot track one more key exactly. Two
//! easy answers both fail someone: refusing every new key lets one client that fills the map
//! lock out everybody else for the length of the window, and one bucket shared by every
//! newcomer does the same as soon as it is spent. The sketch keeps, instead, `depth` rows of
//! `width` words; a key is hashed to one word per row, and its state is read as the *least* of
//! its words.
//!
//! It works because a rate bucket's whole state is one word that only grows as the bucket
//! empties — a GCRA theoretical arrival time, a strict limiter's next slot, a fixed window's
//! number and hits — and because a decision on a fuller bucket never admits less than one on
//! an emptier bucket. Each word holds the largest state any key written to it has reached
//! (a *max*-sketch with conservative update: after a decision every word of the key is raised
//! to the key's new state, never beyond). So every word of a key is at least the key's true
//! state, and so is their least: a key counted here is decided on a bucket **no fuller than
//! the one an exact table would have given it** — the sketch may refuse a key that sharing a
//! word with a busy one has made look spent (a false refusal), but it never admits what an
//! exact bucket would refuse. A newcomer is refused only when each of its `depth` words has
//! been driven past the limit by some key — which a flood of distinct keys does only once it
//! has spent about `width × limit` across them, not after filling the exact map.
//!
//! A key can leave the sketch: when the map has room again, the key gets an exact cell of its
//! own, which starts from its estimate here rather than fresh — otherwise moving in would hand
//! it a new burst.
//!
//! A whole decision — read, decide, raise — runs under one lock, so two decisions for keys
//! that share words cannot both admit on the same estimate. It is the slow path: only keys
//! the map has no room for come here.
//!
//! Pure: words and hashes in, words out; time never enters.

use std::sync::Mutex;

/// The sketch's words: `depth` rows of `width`, `width` a power of two.
#[derive(Debug)]
pub struct MaxSketch {
    words: Mutex<Box<[u64]>>,
    width: usize,
    depth: usize,
}

/// Rows a key is counted in: with four, a newcomer is falsely refused only if all four of its
/// words are shared with spent keys.
pub const DEPTH: usize = 4;

impl MaxSketch {
    /// A sketch of `depth` rows of at least `width` words (rounded up to a power of two), all
    /// zero: every bucket as fresh as a new one.
    pub fn new(width: usize, depth: usize) -> Self {
        let width = width.max(1).next_power_of_two();
        let depth = depth.max(1);
        MaxSketch {
            words: Mutex::new(vec![0; width * depth].into_boxed_slice()),
            width,
            depth,
        }
    }

    /// The sketch for a map of `max_keys`: a word per key of the map in each row, within
    /// 1 024 and 65 536 words a row (8 KiB to 512 KiB a row).
    pub fn for_max_keys(max_keys: usize) -> Self {
        MaxSketch::new(max_keys.clamp(1024, 65_536), DEPTH)
    }

    /// The index of the word of row `row` for a key hashing to `hash`. Rows are told apart by
    /// double hashing, `h1 + row × h2`, which is as good as independent hashes for this use
    /// (Kirsch and Mitzenmacher); `h2` is odd, so rows never land on the same column together.
    fn index(&self, hash: u64, row: usize) -> usize {
        let h1 = hash as u32 as usize;
        let h2 = ((hash >> 32) as u32 | 1) as usize;
        row * self.width + (h1.wrapping_add(row.wrapping_mul(h2)) & (self.width - 1))
    }

    /// Decides for the key hashing to `hash`: `decide` is given the key's estimated state (the
    /// least of its words) and returns its new state and its answer; every word of the key is
    /// then raised to the new state (none is lowered). One decision at a time.
    pub fn decide<R>(&self, hash: u64, decide: impl FnOnce(u64) -> (u64, R)) -> R {
        let mut words = self.words.lock().unwrap_or_else(|p| p.into_inner());
        let estimate = (0..self.depth)
            .map(|row| words[self.index(hash, row)])
            .min()
            .unwrap_or(0);
        let (state, answer) = decide(estimate);
        for row in 0..self.depth {
            let word = &mut words[self.index(hash, row)];
            *word = (*word).max(state);
        }
        answer
    }

    /// The key's estimated state alone: what a key leaving the sketch for an exact cell of its
    /// own starts from, so that moving does not give it a fresh bucket.
    pub fn estimate(&self, hash: u64) -> u64 {
        let words = self.words.lock().unwrap_or_else(|p| p.into_inner());
        (0..self.depth)
            .map(|row| words[self.index(hash, row)])
            .min()
            .unwrap_or(0)
    }

    /// Rewrites every word with `convert` (a reshape: the same bucket in a new shape).
    pub fn convert(&self, mut convert: impl FnMut(u64) -> u64) {
        let mut words = self.words.lock().unwrap_or_else(|p| p.into_inner());
        for word in words.iter_mut() {
            *word = convert(*word);
        }
    }

    /// The memory the words take, in bytes.
    pub fn bytes(&self) -> usize {
        self.width * self.depth * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_key_reads_the_least_of_its_words_and_raises_them_all() {
        let sketch = MaxSketch::new(8, 3);
        assert_eq!(sketch.decide(42, |estimate| (estimate + 5, estimate)), 0);
        assert_eq!(sketch.decide(42, |estimate| (estimate, estimate)), 5);
        // A state lower than what a word holds leaves it as it is.
        sketch.decide(42, |_| (1, ()));
        assert_eq!(sketch.decide(42, |estimate| (estimate, estimate)), 5);
        assert_eq!(sketch.bytes(), 8 * 3 * 8);
    }

    #[test]
    fn rows_of_one_key_use_distinct_columns() {
        let sketch = MaxSketch::new(1024, DEPTH);
        for hash in [0u64, 1, u64::MAX, 0x1234_5678_9abc_def0] {
            let columns: std::collections::BTreeSet<usize> = (0..DEPTH)
                .map(|row| sketch.index(hash, row) - row * 1024)
                .collect();
            assert_eq!(columns.len(), DEPTH, "{hash:#x}");
        }
    }

    proptest! {
        /// The point of the sketch: whatever keys share words, each key's estimate is at least
        /// its own state — its state as an exact table would hold it, each key's state here
        /// growing by its own steps from its own estimate (as a bucket grows from its state).
        #[test]
        fn no_key_is_ever_estimated_below_its_own_state(
            steps in proptest::collection::vec((0u64..40, 0u64..1000), 1..400),
        ) {
            let sketch = MaxSketch::new(4, 2);
            let mut exact = std::collections::HashMap::<u64, u64>::new();
            for (key, step) in steps {
                // A spread hash per key, so small keys meet in every pattern of words.
                let hash = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let own = exact.get(&key).copied().unwrap_or(0);
                let seen = sketch.decide(hash, |estimate| (estimate + step, estimate));
                prop_assert!(seen >= own, "key {key}: estimated {seen}, its state {own}");
                // The exact table grows the key from its own state; the sketch from its
                // estimate, which is never lower.
                exact.insert(key, own + step);
            }
        }
    }
}
