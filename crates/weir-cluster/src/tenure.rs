//! An owner's tenure of its buckets: since when it has owned each one, without a gap and
//! without a pause of its own — the fence that keeps a change of owner from doubling the
//! shared limit.
//!
//! A bucket's shared permits are counted by its owner alone. When the bucket changes hands —
//! the ring moved it, or this node was paused long enough for the others to move it away and
//! back — the new owner's count starts without the leases the previous owner granted and
//! nobody handed over: a holder paused, a handoff that failed, an owner that crashed. Those
//! leases are still capacity until their TTL has passed. So, for a policy that must never
//! exceed its ceiling (`on_unavailable = "closed"`), an owner grants only once it has held the
//! bucket for one `lease_ttl`: every lease anyone else could have granted for it has expired
//! by then, or has been handed over and is counted here.
//!
//! What counts as *held* is this node's own view. [`Tenure::observe`] records every ring it
//! publishes, stamped with the instant it first saw it; a bucket is held since the oldest
//! instant from which every ring seen names this node its owner. A ring seen late only makes
//! the tenure shorter, which is safe; rings missed between two looks (the ring's generation
//! jumped) make the node vouch for nothing before the look.
//!
//! A paused process cannot see its own pause while it lasts, only after: the gap between two
//! beats. [`Tenure::observe`] is called on a short period; when more than `pause_after` has
//! passed since the previous call, this node may have been paused while the others gave its
//! buckets to someone else, so its tenure of every bucket restarts. The start of the process
//! is such a restart: a node that crashed and came back has lost its count.
//!
//! Pure logic: time comes in as an argument, the ring through [`SharedRing`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use weir::Nanos;

use crate::ring::{Ring, SharedRing};

/// Rings remembered: beyond them the node vouches only for the oldest one kept.
const RINGS_KEPT: usize = 64;

/// When a pause has ended: more than this between two beats, by default (2 s). Shorter than
/// the failure detector needs to declare a node departed (several seconds), so a pause long
/// enough for the others to move this node's buckets is always seen.
pub const DEFAULT_PAUSE_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Seen {
    /// The ring's generation in [`SharedRing`].
    generation: u64,
    /// When this node first saw it.
    at: Nanos,
    ring: Arc<Ring>,
}

#[derive(Debug, Default)]
struct State {
    /// Rings seen, oldest first.
    seen: VecDeque<Seen>,
    /// The previous beat, once beats have started.
    last_beat: Option<Nanos>,
    /// The end of the last pause, or the first look: nothing before it is vouched for.
    awake_since: Option<Nanos>,
}

/// One node's tenure of the buckets it owns; see the [module docs](self).
#[derive(Debug)]
pub struct Tenure {
    node_id: String,
    /// `pause_after` in ns.
    pause_after_ns: u64,
    state: Mutex<State>,
}

impl Tenure {
    /// The tenure of node `node_id`, which counts a gap of more than `pause_after` ns between
    /// two beats as a pause.
    pub fn new(node_id: &str, pause_after: Duration) -> Self {
        Tenure {
            node_id: node_id.to_owned(),
            pause_after_ns: weir::clock::duration_to_nanos(pause_after),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A beat at `now`: records the ring in force and notices a pause since the previous
    /// beat. Called on a period well under `pause_after`.
    pub fn observe(&self, ring: &SharedRing, now: Nanos) {
        let mut state = self.lock();
        if let Some(last) = state.last_beat
            && now.saturating_sub(last) > self.pause_after_ns
        {
            state.awake_since = Some(now);
        }
        state.last_beat = Some(now.max(state.last_beat.unwrap_or(0)));
        Self::look(&mut state, ring, now);
    }

    /// Records the ring in force, if it is new.
    fn look(state: &mut State, ring: &SharedRing, now: Nanos) {
        state.awake_since.get_or_insert(now);
        let (generation, current) = ring.load_versioned();
        match state.seen.back() {
            Some(last) if last.generation == generation => return,
            Some(last) if last.generation + 1 != generation => {
                // Rings came and went unseen: nothing before now can be vouched for.
                state.seen.clear();
            }
            _ => {}
        }
        state.seen.push_back(Seen {
            generation,
            at: now,
            ring: current,
        });
        if state.seen.len() > RINGS_KEPT {
            state.seen.pop_front();
        }
    }

    /// Since when this node has owned `bucket` without a gap or a pause, as of `now`; `None` if
    /// it does not own it now.
    pub fn held_since(&self, bucket: &str, ring: &SharedRing, now: Nanos) -> Option<Nanos> {
        let mut state = self.lock();
        if let Some(last) = state.last_beat {
            // A pause noticed here rather than by the next beat: after a resume, a request can
            // run before the ticker does.
            if now.saturating_sub(last) > self.pause_after_ns {
                state.awake_since = Some(now);
                state.last_beat = Some(now);
            }
        }
        Self::look(&mut state, ring, now);
        let mut since = None;
        for seen in state.seen.iter().rev() {
            if seen.ring.owner_of(bucket) != Some(self.node_id.as_str()) {
                break;
            }
            since = Some(seen.at);
        }
        Some(since?.max(state.awake_since.unwrap_or(now)))
    }

    /// Since when this node has seen no other ring and no pause of its own, as of `now`: no
    /// bucket it owns has been held for less.
    pub fn unchanged_since(&self, ring: &SharedRing, now: Nanos) -> Nanos {
        let mut state = self.lock();
        Self::look(&mut state, ring, now);
        let seen = state.seen.back().map_or(now, |seen| seen.at);
        seen.max(state.awake_since.unwrap_or(now))
    }

    /// Vouches for nothing before `now`, as after a pause: every tenure restarts. An owner
    /// cut off from a majority calls it (see `Owner::beat`): the others may have given its
    /// buckets to an owner on their side, whatever its own ring says.
    pub fn restart(&self, now: Nanos) {
        let mut state = self.lock();
        state.awake_since = Some(now.max(state.awake_since.unwrap_or(0)));
    }

    /// Since when this node has run without a pause of its own, as of `now` (its first look,
    /// if none).
    pub fn awake_since(&self, now: Nanos) -> Nanos {
        self.lock().awake_since.unwrap_or(now)
    }

    /// How long until this node may grant `bucket` leases of `ttl`: zero if it has held the
    /// bucket for `ttl` already; `None` if it does not own it.
    pub fn wait(
        &self,
        bucket: &str,
        ttl: Duration,
        ring: &SharedRing,
        now: Nanos,
    ) -> Option<Duration> {
        let since = self.held_since(bucket, ring, now)?;
        Some(weir::clock::between(now, weir::clock::after(since, ttl)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{DEFAULT_VNODES, Member};

    const S: Nanos = 1_000_000_000;

    fn ring(ids: &[&str]) -> Ring {
        Ring::new(
            ids.iter().map(|id| Member::owner(*id, 1)),
            DEFAULT_VNODES,
            1,
        )
    }

    fn buckets() -> impl Iterator<Item = String> {
        (0..1000).map(|i| format!("bucket-{i}"))
    }

    /// A bucket that `before` gives to `was` and `after` to `is`.
    fn bucket_moving(before: &[&str], was: &str, after: &[&str], is: &str) -> String {
        let (before, after) = (ring(before), ring(after));
        buckets()
            .find(|k| before.owner_of(k) == Some(was) && after.owner_of(k) == Some(is))
            .expect("such a bucket")
    }

    /// Beats once a second from `from` s to `to` s, inclusive.
    fn beat(tenure: &Tenure, shared: &SharedRing, from: u64, to: u64) {
        for t in from..=to {
            tenure.observe(shared, t * S);
        }
    }

    #[test]
    fn a_node_vouches_for_nothing_before_it_started() {
        let shared = SharedRing::new(ring(&["a", "b"]));
        let tenure = Tenure::new("a", Duration::from_secs(2));
        let mine = bucket_moving(&["a", "b"], "a", &["a", "b"], "a");
        beat(&tenure, &shared, 100, 100);
        assert_eq!(
            tenure.wait(&mine, Duration::from_secs(20), &shared, 100 * S),
            Some(Duration::from_secs(20))
        );
        beat(&tenure, &shared, 101, 119);
        assert_eq!(
            tenure.wait(&mine, Duration::from_secs(20), &shared, 119 * S),
            Some(Duration::from_secs(1))
        );
        beat(&tenure, &shared, 120, 120);
        assert_eq!(
            tenure.wait(&mine, Duration::from_secs(20), &shared, 120 * S),
            Some(Duration::ZERO)
        );
        let theirs = bucket_moving(&["a", "b"], "b", &["a", "b"], "b");
        assert_eq!(
            tenure.wait(&theirs, Duration::from_secs(20), &shared, 120 * S),
            None
        );
    }

    #[test]
    fn a_bucket_that_moves_here_waits_one_ttl_and_the_others_do_not() {
        let shared = SharedRing::new(ring(&["a", "b", "c"]));
        let tenure = Tenure::new("a", Duration::from_secs(2));
        let moved = bucket_moving(&["a", "b", "c"], "b", &["a", "c"], "a");
        let kept = bucket_moving(&["a", "b", "c"], "a", &["a", "c"], "a");
        beat(&tenure, &shared, 0, 29);
        shared.publish(ring(&["a", "c"]));
        beat(&tenure, &shared, 30, 40);
        assert_eq!(
            tenure.wait(&kept, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::ZERO)
        );
        assert_eq!(
            tenure.wait(&moved, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::from_secs(10))
        );
        beat(&tenure, &shared, 41, 50);
        assert_eq!(
            tenure.wait(&moved, Duration::from_secs(20), &shared, 50 * S),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn the_ring_is_unchanged_since_its_last_change_or_the_last_pause_and_no_bucket_held_longer() {
        let shared = SharedRing::new(ring(&["a", "b", "c"]));
        let tenure = Tenure::new("a", Duration::from_secs(2));
        let kept = bucket_moving(&["a", "b", "c"], "a", &["a", "c"], "a");
        beat(&tenure, &shared, 10, 29);
        assert_eq!(tenure.unchanged_since(&shared, 29 * S), 10 * S);
        shared.publish(ring(&["a", "c"]));
        beat(&tenure, &shared, 30, 40);
        assert_eq!(tenure.unchanged_since(&shared, 40 * S), 30 * S);
        // A bucket kept through the change has been held longer than the ring is unchanged.
        assert_eq!(tenure.held_since(&kept, &shared, 40 * S), Some(10 * S));
        // A pause (no beat for 5 s) restarts both.
        beat(&tenure, &shared, 45, 46);
        assert_eq!(tenure.unchanged_since(&shared, 46 * S), 45 * S);
        assert_eq!(tenure.held_since(&kept, &shared, 46 * S), Some(45 * S));
    }

    #[test]
    fn a_bucket_lost_and_regained_restarts_its_tenure_even_unseen() {
        let stolen = bucket_moving(&["a", "b"], "a", &["a", "b", "d"], "d");
        let untouched = bucket_moving(&["a", "b"], "a", &["a", "b", "d"], "a");
        // d joins and leaves between two beats: the node saw only the last ring, so it
        // vouches for nothing before it.
        let shared = SharedRing::new(ring(&["a", "b"]));
        let tenure = Tenure::new("a", Duration::from_secs(2));
        beat(&tenure, &shared, 0, 30);
        shared.publish(ring(&["a", "b", "d"]));
        shared.publish(ring(&["a", "b"]));
        beat(&tenure, &shared, 31, 40);
        assert_eq!(
            tenure.wait(&stolen, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::from_secs(11))
        );
        assert_eq!(
            tenure.wait(&untouched, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::from_secs(11))
        );
        // Seen one by one, only the bucket d held restarts.
        let shared = SharedRing::new(ring(&["a", "b"]));
        let tenure = Tenure::new("a", Duration::from_secs(2));
        beat(&tenure, &shared, 0, 30);
        shared.publish(ring(&["a", "b", "d"]));
        beat(&tenure, &shared, 31, 31);
        shared.publish(ring(&["a", "b"]));
        beat(&tenure, &shared, 32, 40);
        assert_eq!(
            tenure.wait(&stolen, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::from_secs(12))
        );
        assert_eq!(
            tenure.wait(&untouched, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn a_pause_restarts_every_tenure_whoever_notices_it_first() {
        let shared = SharedRing::new(ring(&["a"]));
        let mine = bucket_moving(&["a"], "a", &["a"], "a");
        for ticker_first in [true, false] {
            let tenure = Tenure::new("a", Duration::from_secs(2));
            beat(&tenure, &shared, 0, 30);
            assert_eq!(
                tenure.wait(&mine, Duration::from_secs(20), &shared, 30 * S),
                Some(Duration::ZERO)
            );
            // Stopped from 30 s to 42 s.
            if ticker_first {
                tenure.observe(&shared, 42 * S);
            }
            assert_eq!(
                tenure.wait(&mine, Duration::from_secs(20), &shared, 42 * S),
                Some(Duration::from_secs(20))
            );
            beat(&tenure, &shared, 43, 62);
            assert_eq!(
                tenure.wait(&mine, Duration::from_secs(20), &shared, 62 * S),
                Some(Duration::ZERO)
            );
        }
    }

    #[test]
    fn beats_within_pause_after_are_no_pause() {
        let shared = SharedRing::new(ring(&["a"]));
        let mine = bucket_moving(&["a"], "a", &["a"], "a");
        let tenure = Tenure::new("a", Duration::from_secs(2));
        for t in 0..=20 {
            tenure.observe(&shared, t * 2 * S);
        }
        assert_eq!(
            tenure.wait(&mine, Duration::from_secs(20), &shared, 40 * S),
            Some(Duration::ZERO)
        );
        assert_eq!(
            tenure.wait(&mine, Duration::from_secs(20), &shared, 42 * S + 1),
            Some(Duration::from_secs(20)),
            "one nanosecond more is a pause"
        );
    }
}
