//! Rate buckets that outlive the process: a day's quota is not given afresh by a restart.
//!
//! A bucket that refills in a second loses less than a second to a restart; one that refills
//! in a day would give a whole day's quota again. So the buckets of every policy whose shape
//! takes longer than `durable_after` to refill are kept in the data dir
//! ([`crate::bucket_file`]) and taken on again at start, before the node says it is ready.
//!
//! They are written *behind* the decisions, never in their path: every `durable_flush` a walk
//! visits those buckets, picks the ones a decision changed since the last walk (each bucket's
//! state is one word that changes only with a decision, remembered here by a hash of the
//! bucket's name), and writes them in one durable commit. A crash loses what was decided
//! since the last commit — at most one `durable_flush` and one write. A graceful stop writes
//! once more after the last request, so nothing is lost. A bucket whole again needs no
//! record: whole records are removed every 60 walks, and skipped at start.
//!
//! `CL.THROTTLE`'s keys are kept alike, each with the shape its last call gave it: a key of
//! an hour's period is as spent after a restart as before.
//!
//! A bucket is kept as when it is whole again, in wall-clock time, and what it had left: at
//! start it is taken on as a handover from the previous run ([`Policy::restore`]), left as
//! empty as it was then and refilled for the time the node was down. A record of a policy
//! not running yet (one the cluster's policy log has still to apply) waits for it, until the
//! bucket would be whole.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foldhash::fast::RandomState;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use weir::SystemClock;
use weir::limiter::Quota;
use weir::policy::{Policy, PolicySet};

use super::App;
use super::cells::Cells;
use crate::bucket_file::{BucketFile, BucketFileError, Changes, KeptBucket, KeptCell};
use crate::log_gate::LogGate;

/// How often whole buckets' records are removed, in walks.
const REMOVE_WHOLE_EVERY: u32 = 60;

/// The kept buckets: the file, what was last written, what waits for its policy.
#[derive(Debug)]
pub struct KeptBuckets {
    file: BucketFile,
    /// Buckets refilling slower than this are kept.
    slower_than: Duration,
    walks: Mutex<Walks>,
    /// Records whose policy is not running yet, by policy.
    waiting: Mutex<HashMap<String, Vec<KeptBucket>>>,
    /// Failed writes, logged once a minute: a full disk fails every walk.
    failed_writes: LogGate,
    /// What the last write's failure was, until a write succeeds.
    failing: Mutex<Option<String>>,
    /// What the walks did, for `/metrics`.
    pub counters: KeptCounters,
}

/// What the walks remember between them.
#[derive(Debug, Default)]
struct Walks {
    /// How many walks were made.
    count: u32,
    /// Each kept bucket's word when last written, and the walk that last saw it, by a hash of
    /// its policy, kind and key: a hash rather than the names, so that remembering a bucket
    /// costs 24 bytes rather than a copy of its key. foldhash, seeded per process: a walk
    /// hashes every kept bucket twice, and SipHash made it twice as slow.
    written: HashMap<u64, (u64, u32), RandomState>,
    hasher: RandomState,
}

/// Counters of the kept buckets.
#[derive(Debug, Default)]
pub struct KeptCounters {
    /// Buckets taken on at start (and later, when their policy came).
    pub restored: AtomicU64,
    /// Walks over the kept buckets, written or not.
    pub walks: AtomicU64,
    /// Bucket records written.
    pub written: AtomicU64,
    /// Walks whose write succeeded.
    pub flushes: AtomicU64,
    /// Walks whose write failed (the buckets are written again by the next).
    pub failures: AtomicU64,
    /// Buckets kept at the last walk.
    pub kept: AtomicU64,
    /// How long the last walk took, write included, in microseconds.
    pub last_walk_us: AtomicU64,
}

/// Now, in nanoseconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

impl KeptBuckets {
    /// Opens the data dir's kept buckets and takes on every one whose policy is in
    /// `policies` (the others wait for their policy), and every `CL.THROTTLE` key into `cells`,
    /// whose clock reads `cells_now`.
    pub fn open(
        dir: &Path,
        slower_than: Duration,
        policies: &PolicySet<SystemClock>,
        (cells, cells_now): (&Cells, i64),
    ) -> Result<KeptBuckets, BucketFileError> {
        let file = BucketFile::open(dir)?;
        let now = unix_now();
        let mut restored_cells = 0;
        for cell in file.read_cells()? {
            if cell.whole_at > now {
                let whole_in = i64::try_from(cell.whole_at - now).unwrap_or(i64::MAX);
                let [interval, tolerance] =
                    [cell.interval, cell.tolerance].map(|n| i64::try_from(n).unwrap_or(0));
                if cells.restore(&cell.key, interval, tolerance, whole_in, cells_now) {
                    restored_cells += 1;
                }
            }
        }
        let mut waiting: HashMap<String, Vec<KeptBucket>> = HashMap::new();
        for bucket in file.read_all()? {
            if bucket.whole_at > now {
                waiting
                    .entry(bucket.policy.clone())
                    .or_default()
                    .push(bucket);
            }
        }
        let kept = KeptBuckets {
            file,
            slower_than,
            walks: Mutex::default(),
            waiting: Mutex::new(waiting),
            failed_writes: LogGate::new(),
            failing: Mutex::new(None),
            counters: KeptCounters::default(),
        };
        kept.counters
            .restored
            .fetch_add(restored_cells, Ordering::Relaxed);
        let restored = kept.restore_waiting(policies) + restored_cells;
        if restored > 0 {
            tracing::info!(restored, "buckets taken on from the last run");
        }
        Ok(kept)
    }

    /// What the last write's failure was, while no write has succeeded since.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Buckets that take longer than this to refill are kept.
    pub fn slower_than(&self) -> Duration {
        self.slower_than
    }

    /// Takes on the waiting records of every policy now in `policies`; how many.
    pub(super) fn restore_waiting(&self, policies: &PolicySet<SystemClock>) -> u64 {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.is_empty() {
            return 0;
        }
        let now = unix_now();
        let mut restored = 0;
        waiting.retain(|name, buckets| {
            let Some(policy) = policies.get(name) else {
                buckets.retain(|bucket| bucket.whole_at > now);
                return !buckets.is_empty();
            };
            for bucket in buckets.iter().filter(|bucket| bucket.whole_at > now) {
                restore(&policy, bucket, now);
                restored += 1;
            }
            false
        });
        self.counters
            .restored
            .fetch_add(restored, Ordering::Relaxed);
        restored
    }

    /// One walk: takes on what waited for a policy that has come, and writes every kept
    /// bucket and `CL.THROTTLE` key (in `cells`, whose clock reads `cells_now`) a decision
    /// changed since the last walk, in one durable commit. Blocks on the disk: run it off the
    /// runtime's threads.
    pub fn flush(
        &self,
        policies: &PolicySet<SystemClock>,
        (cells, cells_now): (&Cells, i64),
    ) -> Result<(), BucketFileError> {
        let started = std::time::Instant::now();
        self.restore_waiting(policies);
        let mut walks = self.walks.lock().unwrap_or_else(|p| p.into_inner());
        walks.count = walks.count.wrapping_add(1);
        let Walks {
            count,
            written,
            hasher,
        } = &mut *walks;
        let walk = *count;
        let now = unix_now();
        let mut changed = Vec::new();
        let mut changed_ids = Vec::new();
        for policy in policies.policies() {
            let name = policy.name();
            policy.visit_spent(self.slower_than, |bucket| {
                let id = hasher.hash_one((name, bucket.kind, bucket.key));
                match written.get_mut(&id) {
                    Some((word, seen)) if *word == bucket.word => *seen = walk,
                    _ => {
                        written.insert(id, (bucket.word, walk));
                        changed_ids.push(id);
                        changed.push(KeptBucket {
                            policy: name.to_owned(),
                            kind: bucket.kind.map(str::to_owned),
                            key: bucket.key.to_owned(),
                            whole_at: now
                                .saturating_add(bucket.quota.reset_after.as_nanos() as u64),
                            used: bucket.quota.used,
                            remaining: bucket.quota.remaining,
                        });
                    }
                }
            });
        }
        let mut changed_cells = Vec::new();
        let slower_than = i64::try_from(self.slower_than.as_nanos()).unwrap_or(i64::MAX);
        cells.visit_spent(slower_than, cells_now, |key, interval, tolerance, tat| {
            // Apart from every policy's: no policy is named with a byte string.
            let id = hasher.hash_one((0u8, key));
            let word = tat as u64;
            match written.get_mut(&id) {
                Some((kept, seen)) if *kept == word => *seen = walk,
                _ => {
                    written.insert(id, (word, walk));
                    changed_ids.push(id);
                    changed_cells.push(KeptCell {
                        key: key.to_vec(),
                        whole_at: now.saturating_add(tat.saturating_sub(cells_now) as u64),
                        interval: interval as u64,
                        tolerance: tolerance as u64,
                    });
                }
            }
        });
        // A bucket not seen is whole again (or gone with its policy): its record is removed
        // once whole, and a bucket spent again later is written again.
        written.retain(|_, (_, seen)| *seen == walk);
        self.counters
            .kept
            .store(written.len() as u64, Ordering::Relaxed);
        let remove_whole = (walk % REMOVE_WHOLE_EVERY == 1).then_some(now);
        let changes = Changes {
            buckets: &changed,
            cells: &changed_cells,
            whole_by: remove_whole,
        };
        let outcome = if changed.is_empty() && changed_cells.is_empty() && remove_whole.is_none() {
            Ok(())
        } else {
            self.write(changes, written, changed_ids)
        };
        self.counters.walks.fetch_add(1, Ordering::Relaxed);
        self.counters
            .last_walk_us
            .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        outcome
    }

    /// Makes `changes`; if that fails, forgets what they wrote from `written` (their `ids`),
    /// so that the next walk writes it.
    fn write(
        &self,
        changes: Changes<'_>,
        written: &mut HashMap<u64, (u64, u32), RandomState>,
        ids: Vec<u64>,
    ) -> Result<(), BucketFileError> {
        let count = (changes.buckets.len() + changes.cells.len()) as u64;
        let outcome = self.file.write(changes);
        *self.failing.lock().unwrap_or_else(|p| p.into_inner()) =
            outcome.as_ref().err().map(ToString::to_string);
        match outcome {
            Ok(()) => {
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                self.counters.written.fetch_add(count, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                for id in ids {
                    written.remove(&id);
                }
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }
}

impl App {
    /// Writes the kept buckets every `every` until stopped (see `app::kept_buckets`); a
    /// failed write is logged, and its buckets are written by the next.
    pub fn spawn_keeping(self: &Arc<Self>, every: Duration) -> Option<JoinHandle<()>> {
        self.kept.as_ref()?;
        let app = Arc::clone(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                app.keep_buckets_now().await;
            }
        }))
    }

    /// One walk of the kept buckets, now; whether what it had to write was written. A failed
    /// write is counted (`weir_kept_bucket_writes_total{outcome="failed"}`) and logged at
    /// most once a minute; its buckets are written by the next walk.
    pub async fn keep_buckets_now(self: &Arc<Self>) -> bool {
        let Some(kept) = self.kept.clone() else {
            return true;
        };
        let app = Arc::clone(self);
        let walker = Arc::clone(&kept);
        let written = tokio::task::spawn_blocking(move || {
            walker.flush(&app.policies, (&app.cells, app.cell_now()))
        })
        .await;
        match written {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                if let Some(unlogged) = kept.failed_writes.pass() {
                    tracing::warn!(
                        unlogged,
                        "the kept buckets were not written (logged at most once a minute; see weir_kept_bucket_writes_total): {error}"
                    );
                }
                false
            }
            Err(panicked) => {
                tracing::error!("writing the kept buckets failed: {panicked}");
                false
            }
        }
    }

    /// The last walk of a graceful stop, after the last request: tried again a few times
    /// (the file is opened again before each), since what it does not write is lost.
    pub async fn keep_buckets_at_stop(self: &Arc<Self>) {
        let mut pause = Duration::from_millis(100);
        for attempt in 1..=STOP_ATTEMPTS {
            if self.keep_buckets_now().await {
                return;
            }
            if attempt < STOP_ATTEMPTS {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        tracing::error!(
            attempts = STOP_ATTEMPTS,
            "the kept buckets changed since the last walk could not be written at stop: they start whole at the next start"
        );
    }
}

/// Tries of the last write at a graceful stop (over about 1.5 s).
const STOP_ATTEMPTS: u32 = 5;

/// Takes on `bucket` in `policy`, counted from `now`.
fn restore(policy: &Policy<SystemClock>, bucket: &KeptBucket, now: u64) {
    policy.restore(
        bucket.kind.as_deref(),
        &bucket.key,
        Quota {
            used: bucket.used,
            remaining: bucket.remaining,
            reset_after: Duration::from_nanos(bucket.whole_at.saturating_sub(now)),
        },
    );
}

#[cfg(test)]
mod tests;
