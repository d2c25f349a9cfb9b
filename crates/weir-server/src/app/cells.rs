//! `CL.THROTTLE`: redis-cell's command, decided the way redis-cell decides it, over keys a
//! client names as it goes.
//!
//! `CL.THROTTLE key max_burst count period [quantity]` is a GCRA bucket per key: one request
//! every `period / count` seconds (the *emission interval* T), `max_burst + 1` at once (the
//! *limit*; the tolerance is T × limit). The reply is five integers: limited (0 or 1), the
//! limit, what remains, seconds until a refused request could go (−1 when admitted, or when it
//! never could), and seconds until the bucket is whole again. The arithmetic follows
//! redis-cell's — T truncated to whole nanoseconds, `remaining` truncated, seconds rounded up
//! at millisecond resolution (2.0004 s is 2) — so that a client moving from Redis sees the
//! same numbers: on a new key, `CL.THROTTLE user123 15 30 60` replies `0 16 15 -1 2`. One
//! difference: redis-cell divides for `remaining` in whole microseconds, Weir in nanoseconds,
//! so the two differ when T is not a whole number of microseconds (rates above a million a
//! period's second, where redis-cell's figure is the rounding's).
//! A quantity of 0 is a look that takes nothing; one larger than the limit is refused with
//! −1, since no wait would let it through.
//!
//! Unlike redis-cell, bad numbers are refused by name (a negative burst, a zero or negative
//! count or period, a burst × period that no clock can hold), and a key asked with other
//! parameters than last time is reshaped keeping its fill (what it has left) in requests, as
//! every Weir limiter is, rather than read in the new shape; a key whole again is a new key in
//! any shape, as in redis-cell, where its key has expired.
//!
//! Keys are bounded as a policy's are: at most `max_keys`, spread over shards; a key whole
//! again holds nothing a new key would not, so at the cap the whole ones are dropped first,
//! and when none is whole a new key is counted in a fixed-size sketch of TATs
//! ([`weir::keyed::MaxSketch`]) that never lets a key through more than its own bucket would:
//! one client that fills the map with day-long keys does not lock every newcomer out for a
//! day. Keys in the sketch keep no parameters of their own, so one asked with new parameters
//! is read with its TAT unchanged rather than reshaped. Refused keys go to a "who is throttled"
//! table as a policy's do (shown as the policy `CL.THROTTLE`), and the decisions are counted
//! for `/metrics`. Pure: time comes in as an argument.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use hashbrown::HashTable;
use weir::Nanos;
use weir::keyed::MaxSketch;
use weir::policy::ThrottledRow;
use weir::policy::throttled::{DEFAULT_CAPACITY, DEFAULT_WINDOW, ThrottledKeys};

use crate::reserved::CELLS_POLICY;

/// Nanoseconds per second and per millisecond.
const SECOND: i64 = 1_000_000_000;
const MILLI: i64 = 1_000_000;

/// Shards of the key map: enough that connections on every core rarely meet on one lock.
const SHARDS: usize = 16;

/// One shard's keys and their cells, found by a hash computed once per call.
type Shard = HashTable<(Box<[u8]>, Cell)>;

/// One call's numbers, as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Requests allowed at once beyond the first.
    pub max_burst: i64,
    /// Requests per period.
    pub count: i64,
    /// The period, in seconds.
    pub period: i64,
    /// What this request takes (default 1; 0 looks without taking).
    pub quantity: i64,
}

/// The five integers of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Refused.
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: i64,
    /// Requests that could go now.
    pub remaining: i64,
    /// Seconds until a refused request could go; −1 when admitted or never.
    pub retry_after: i64,
    /// Seconds until the bucket is whole again.
    pub reset_after: i64,
}

/// Why a call was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    /// A number out of its range.
    #[error("{name} must be {rule}, got {value}")]
    OutOfRange {
        /// The argument's name.
        name: &'static str,
        /// What it must be.
        rule: &'static str,
        /// What it was.
        value: i64,
    },
    /// A shape no clock can hold.
    #[error(
        "the bucket's tolerance, period / count × (max_burst + 1), does not fit in 292 years of nanoseconds"
    )]
    TooLarge,
}

/// A key's bucket: its shape and its theoretical arrival time.
#[derive(Debug, Clone, Copy)]
struct Cell {
    interval: i64,
    tolerance: i64,
    tat: i64,
    /// In the "who is throttled" table: its admitted requests are counted there too.
    tracked: bool,
}

/// The shape of a call: T and T × limit, in nanoseconds.
fn shape(throttle: &Throttle) -> Result<(i64, i64), CellError> {
    let out = |name, rule, value| Err(CellError::OutOfRange { name, rule, value });
    if throttle.max_burst < 0 {
        return out("max_burst", "0 or more", throttle.max_burst);
    }
    if throttle.count <= 0 {
        return out("count", "1 or more", throttle.count);
    }
    if throttle.period <= 0 {
        return out("period", "1 or more seconds", throttle.period);
    }
    if throttle.quantity < 0 {
        return out("quantity", "0 or more", throttle.quantity);
    }
    let period = throttle
        .period
        .checked_mul(SECOND)
        .ok_or(CellError::TooLarge)?;
    // redis-cell's T: the period over the count as a float, truncated.
    let interval = (period as f64 / throttle.count as f64) as i64;
    if interval == 0 {
        return out(
            "count",
            "at most one a nanosecond over the period",
            throttle.count,
        );
    }
    let limit = throttle
        .max_burst
        .checked_add(1)
        .ok_or(CellError::TooLarge)?;
    let tolerance = interval.checked_mul(limit).ok_or(CellError::TooLarge)?;
    Ok((interval, tolerance))
}

/// Whole seconds in `nanos`, rounded up at millisecond resolution (as redis-cell rounds).
fn seconds(nanos: i64) -> i64 {
    let nanos = nanos.max(0);
    nanos / SECOND + i64::from((nanos % SECOND) / MILLI > 0)
}

/// Decides `throttle` for a bucket whose TAT is `tat` at `now` (all nanoseconds); returns the
/// verdict and the TAT to keep (unchanged when refused).
fn decide(
    throttle: &Throttle,
    interval: i64,
    tolerance: i64,
    tat: i64,
    now: i64,
) -> (Verdict, i64) {
    // `shape` checked that the limit fits.
    let limit = throttle.max_burst + 1;
    // A quantity no clock can hold is larger than any bucket: refused, never saturated into
    // an admission.
    let new_tat = interval
        .checked_mul(throttle.quantity)
        .and_then(|increment| tat.max(now).checked_add(increment));
    let increment = interval.saturating_mul(throttle.quantity);
    let diff = new_tat.map_or(-1, |new_tat| now.saturating_sub(new_tat - tolerance));
    let (limited, ttl, kept) = match new_tat {
        Some(new_tat) if diff >= 0 => (false, new_tat - now, new_tat),
        // A TAT in the past is a bucket already whole: nothing more than whole remains (in
        // redis-cell the key has expired by then).
        _ => (true, tat.max(now) - now, tat),
    };
    let next = tolerance - ttl;
    let remaining = if next > -interval {
        (next as f64 / interval as f64) as i64
    } else {
        0
    };
    let retry_after = match limited && increment <= tolerance && new_tat.is_some() {
        true => seconds(-diff),
        false => -1,
    };
    let verdict = Verdict {
        limited,
        limit,
        remaining: remaining.max(0),
        retry_after,
        reset_after: seconds(ttl),
    };
    (verdict, kept)
}

/// The keys `CL.THROTTLE` has seen, bounded.
#[derive(Debug)]
pub struct Cells {
    shards: Vec<Mutex<Shard>>,
    hasher: std::hash::RandomState,
    max_keys: usize,
    /// Keys past the cap; made when a key first overflows.
    sketch: OnceLock<MaxSketch>,
    sketched: AtomicU64,
    admitted: AtomicU64,
    limited: AtomicU64,
    throttled: ThrottledKeys,
}

impl Cells {
    /// An empty store of at most `max_keys` keys (at least one per shard).
    pub fn new(max_keys: usize) -> Self {
        Cells {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: std::hash::RandomState::new(),
            max_keys: max_keys.max(SHARDS),
            sketch: OnceLock::new(),
            sketched: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            limited: AtomicU64::new(0),
            throttled: ThrottledKeys::new(DEFAULT_CAPACITY, DEFAULT_WINDOW),
        }
    }

    /// Decides `throttle` for `key` at `now` (nanoseconds on any clock that only goes
    /// forward).
    pub fn throttle(
        &self,
        key: &[u8],
        throttle: &Throttle,
        now: i64,
    ) -> Result<Verdict, CellError> {
        let (interval, tolerance) = shape(throttle)?;
        // One hash a call: it picks the shard and finds the key in it.
        let hash = self.hasher.hash_one(key);
        let mut cells = self.shard(hash);
        let stamp = Nanos::try_from(now).unwrap_or(0);
        if let Some((_, cell)) = cells.find_mut(hash, |(k, _)| **k == *key) {
            if (cell.interval, cell.tolerance) != (interval, tolerance) {
                cell.tat = reshaped(cell, interval, tolerance, now);
                (cell.interval, cell.tolerance) = (interval, tolerance);
            }
            let (verdict, kept) = decide(throttle, interval, tolerance, cell.tat, now);
            if verdict.limited {
                let shown = String::from_utf8_lossy(key);
                cell.tracked |= self.throttled.throttled(&shown, None, stamp).added;
            } else if cell.tracked {
                self.throttled
                    .admitted(&String::from_utf8_lossy(key), stamp);
            }
            if kept > now {
                cell.tat = kept;
            }
            drop(cells);
            self.count(&verdict);
            return Ok(verdict);
        }
        let per_shard = self.max_keys / SHARDS;
        if cells.len() >= per_shard {
            cells.retain(|(_, cell)| cell.tat > now);
        }
        if cells.len() >= per_shard {
            // Decided holding the shard's lock: no call for the same key can give it a cell
            // here from the sketch's word while this one decides on that word.
            let verdict = self.throttle_sketched(key, hash, throttle, (interval, tolerance), now);
            drop(cells);
            self.count(&verdict);
            return Ok(verdict);
        }
        // A key the sketch has counted starts from what it spent there.
        let tat = self
            .sketch
            .get()
            .map_or(now, |sketch| from_word(sketch.estimate(hash)).max(now));
        let (verdict, kept) = decide(throttle, interval, tolerance, tat, now);
        if verdict.limited {
            self.throttled
                .throttled(&String::from_utf8_lossy(key), None, stamp);
        }
        if kept > now {
            // Room was made above, under the same lock.
            let cell = Cell {
                interval,
                tolerance,
                tat: kept,
                tracked: false,
            };
            let hasher = &self.hasher;
            cells.insert_unique(hash, (key.into(), cell), |(k, _)| hasher.hash_one(&**k));
        }
        self.count(&verdict);
        Ok(verdict)
    }

    /// Decides for a key the map has no room for, on its estimate in the sketch: its TAT as
    /// the sketch has it, never earlier than an exact cell's.
    fn throttle_sketched(
        &self,
        key: &[u8],
        hash: u64,
        throttle: &Throttle,
        (interval, tolerance): (i64, i64),
        now: i64,
    ) -> Verdict {
        let sketch = self
            .sketch
            .get_or_init(|| MaxSketch::for_max_keys(self.max_keys));
        self.sketched.fetch_add(1, Ordering::Relaxed);
        let verdict = sketch.decide(hash, |estimate| {
            let tat = from_word(estimate).max(now);
            let (verdict, kept) = decide(throttle, interval, tolerance, tat, now);
            (to_word(kept), verdict)
        });
        if verdict.limited {
            let stamp = Nanos::try_from(now).unwrap_or(0);
            self.throttled
                .throttled(&String::from_utf8_lossy(key), None, stamp);
        }
        verdict
    }

    fn count(&self, verdict: &Verdict) {
        let counter = match verdict.limited {
            true => &self.limited,
            false => &self.admitted,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Decisions made in the sketch, and the memory it takes in bytes.
    pub fn sketch_counts(&self) -> (u64, u64) {
        (
            self.sketched.load(Ordering::Relaxed),
            self.sketch.get().map_or(0, |s| s.bytes() as u64),
        )
    }

    /// The shard of a key of hash `hash`, locked. The shard takes the bits just below the
    /// seven hashbrown tags entries with; the table places them by the low bits, which the
    /// shard must not fix.
    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        let index = (hash << 7 >> (64 - SHARDS.trailing_zeros())) as usize;
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key`'s cell in its shard, locked, if it has one, and what to do with it.
    fn with_cell<R>(&self, key: &[u8], f: impl FnOnce(Option<&mut Cell>) -> R) -> R {
        let hash = self.hasher.hash_one(key);
        let mut cells = self.shard(hash);
        f(cells
            .find_mut(hash, |(k, _)| **k == *key)
            .map(|(_, cell)| cell))
    }

    /// Decisions so far: admitted, limited.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.admitted.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
        )
    }

    /// The keys held back within the window at `now`, most requests a second first, at most
    /// `limit`, as rows of the policy [`CELLS_POLICY`].
    pub fn throttled_rows(&self, now: i64, limit: usize) -> Vec<ThrottledRow> {
        let (keys, changes) = self
            .throttled
            .rows(Nanos::try_from(now).unwrap_or(0), limit);
        // The table knows keys as text: a key that is not UTF-8 is found by its shown form
        // only if it reads back the same.
        for (key, _) in changes.removed {
            self.with_cell(key.as_bytes(), |cell| {
                if let Some(cell) = cell {
                    cell.tracked = false;
                }
            });
        }
        keys.into_iter()
            .map(|k| {
                // A cell's limit a second: one request every interval.
                let qps_limit = self.with_cell(k.key.as_bytes(), |cell| {
                    cell.map(|cell| SECOND as f64 / cell.interval as f64)
                });
                ThrottledRow {
                    policy: CELLS_POLICY.to_owned(),
                    key: k.key,
                    kind: k.kind.unwrap_or_default(),
                    qps_limit,
                    current_qps: k.current_qps,
                    throttled_qps: Some(k.throttled_qps),
                    in_flight: 0,
                    waiters: 0,
                }
            })
            .collect()
    }

    /// Calls `visit` with every key whose bucket is not whole at `now` and takes longer than
    /// `slower_than` nanoseconds to refill: its key, interval, tolerance and TAT. Holds each
    /// shard's lock while it visits the shard's keys: `visit` should be quick.
    pub fn visit_spent(
        &self,
        slower_than: i64,
        now: i64,
        mut visit: impl FnMut(&[u8], i64, i64, i64),
    ) {
        for shard in &self.shards {
            let cells = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (key, cell) in cells.iter() {
                if cell.tat > now && cell.tolerance > slower_than {
                    visit(key, cell.interval, cell.tolerance, cell.tat);
                }
            }
        }
    }

    /// Takes on a key as a previous run kept it: its shape, and a TAT `whole_in` nanoseconds
    /// from `now` (at most its tolerance); whether it was. A key already asked in this run
    /// keeps its own cell, and a full shard takes no more.
    pub fn restore(
        &self,
        key: &[u8],
        interval: i64,
        tolerance: i64,
        whole_in: i64,
        now: i64,
    ) -> bool {
        if interval <= 0 || tolerance < interval || whole_in <= 0 {
            return false;
        }
        let hash = self.hasher.hash_one(key);
        let mut cells = self.shard(hash);
        if cells.find(hash, |(k, _)| **k == *key).is_some() || cells.len() >= self.max_keys / SHARDS
        {
            return false;
        }
        let cell = Cell {
            interval,
            tolerance,
            tat: now.saturating_add(whole_in.min(tolerance)),
            tracked: false,
        };
        let hasher = &self.hasher;
        cells.insert_unique(hash, (key.into(), cell), |(k, _)| hasher.hash_one(&**k));
        true
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// A TAT as a sketch word, in the same order (the sketch keeps the largest).
fn to_word(tat: i64) -> u64 {
    (tat as u64) ^ (1 << 63)
}

/// A sketch word as a TAT; the zero word, which no key has written, is as early as can be.
fn from_word(word: u64) -> i64 {
    (word ^ (1 << 63)) as i64
}

/// The TAT that keeps `cell`'s fill, in requests, in a new shape; a fill above the new limit
/// is capped (the bucket is simply whole).
fn reshaped(cell: &Cell, interval: i64, tolerance: i64, now: i64) -> i64 {
    // Whole again, it is a new key in any shape (as in redis-cell, where it has expired).
    if cell.tat <= now {
        return now;
    }
    let debt = i128::from((cell.tat - now).max(0));
    let fill = i128::from(cell.tolerance) - debt;
    let new_fill =
        (fill * i128::from(interval) / i128::from(cell.interval)).min(i128::from(tolerance));
    let new_debt = i128::from(tolerance) - new_fill;
    i64::try_from(i128::from(now) + new_debt).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
