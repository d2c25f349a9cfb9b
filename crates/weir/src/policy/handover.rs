//! What a policy's buckets carry from one owner to the next.
//!
//! A cluster-scoped rate bucket is decided by one node, its owner on the ring. When the ring
//! moves the bucket — a node joins, or leaves gracefully — the old owner knows how much of it
//! has been spent and the new one does not: a new owner that started the bucket full would
//! admit a whole burst the old owner had already admitted. So the old owner hands over each
//! moving bucket that is not whole ([`Policy::spent_buckets`]) and the new owner takes it on
//! ([`Policy::absorb`]), keeping whichever of the two is emptier.
//!
//! A crashed owner hands nothing over. For that case a new owner can hold each bucket to the
//! capacity it has refilled since the new owner took it on ([`Policy::hold_to_tenure`]): held
//! so, it admits no more than one bucket would have, whatever the crashed owner spent. A
//! learning period shorter than the refill time trades some of that exactness for a bucket
//! that fills sooner.
//!
//! A restart is a handover to the process's own next run: buckets that take long to refill (a
//! day's quota) are visited as they change ([`Policy::visit_spent`]), kept by the caller, and
//! taken on again at start ([`Policy::restore`]).

use std::time::Duration;

use crate::clock::Clock;
use crate::limiter::Quota;

use super::Policy;
use super::state::{Engine, KindBuckets};

/// One bucket of a policy that is not whole, as its owner hands it to the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpentBucket {
    /// The kind whose own buckets it is in (`None`: the policy's default buckets).
    pub kind: Option<String>,
    /// The bucket's key.
    pub key: String,
    /// What it had left when it was handed over.
    pub quota: Quota,
}

/// A bucket that is not whole, as [`Policy::visit_spent`] visits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpentState<'a> {
    /// The kind whose own buckets it is in (`None`: the policy's default buckets).
    pub kind: Option<&'a str>,
    /// The bucket's key.
    pub key: &'a str,
    /// The bucket's state as one word: it changes when a decision changes the bucket, never
    /// as time passes (see [`KeyedLimiter::visit_spent`](crate::keyed::KeyedLimiter::visit_spent)).
    pub word: u64,
    /// What it has left now.
    pub quota: Quota,
}

impl<C: Clock + Clone> Policy<C> {
    /// Every rate bucket not whole now whose key `moving` picks, in the default buckets and in
    /// each kind's own. A walk over every key: for membership changes, never per request.
    pub fn spent_buckets(&self, mut moving: impl FnMut(&str) -> bool) -> Vec<SpentBucket> {
        let mut spent = Vec::new();
        self.visit_spent(Duration::ZERO, |bucket| {
            if moving(bucket.key) {
                spent.push(SpentBucket {
                    kind: bucket.kind.map(str::to_owned),
                    key: bucket.key.to_owned(),
                    quota: bucket.quota,
                });
            }
        });
        spent
    }

    /// Calls `visit` with every bucket not whole now, in the default buckets and in each
    /// kind's own, whose shape takes longer than `slower_than` to refill
    /// ([`Shape::refill_time`](crate::keyed::Shape::refill_time)). A walk over every key of
    /// those buckets.
    pub fn visit_spent(&self, slower_than: Duration, mut visit: impl FnMut(SpentState<'_>)) {
        let state = self.state.load();
        let Engine::Keyed { default, kinds } = &state.engine else {
            return;
        };
        let own = kinds.iter().filter_map(|(kind, buckets)| match buckets {
            KindBuckets::Own(limiter) => Some((Some(kind.as_str()), limiter)),
            KindBuckets::Unlimited => None,
        });
        for (kind, limiter) in std::iter::once((None, default)).chain(own) {
            if limiter
                .shape()
                .refill_time()
                .is_none_or(|refill| refill <= slower_than)
            {
                continue;
            }
            limiter.visit_spent(|key, word, quota| {
                visit(SpentState {
                    kind,
                    key,
                    word,
                    quota,
                })
            });
        }
    }

    /// Takes on a bucket this policy's previous run kept ([`visit_spent`](Self::visit_spent)
    /// then, `quota` counted from now): as [`absorb`](Self::absorb), but never left empty for
    /// longer than the bucket's own refill time, since the policy may have changed shape
    /// between the two runs (a day's quota cut to an hour's).
    pub fn restore(&self, kind: Option<&str>, key: &str, mut quota: Quota) {
        let state = self.state.load();
        let Some(limiter) = state.limiter_of(kind) else {
            return;
        };
        if let Some(refill) = limiter.shape().refill_time() {
            quota.reset_after = quota.reset_after.min(refill);
            limiter.absorb(key, quota);
        }
    }

    /// Takes on a bucket another node handed over: it is left no fuller than the handed one
    /// was (see [`KeyedLimiter::absorb`](crate::keyed::KeyedLimiter::absorb)). A kind this
    /// policy has no own buckets for (a config change rolling through) is left alone.
    pub fn absorb(&self, kind: Option<&str>, key: &str, quota: Quota) {
        if let Some(limiter) = self.state.load().limiter_of(kind) {
            limiter.absorb(key, quota);
        }
    }

    /// Takes on what a bucket's owner answered about the bucket a request of `kind` for `key`
    /// is counted in (as [`absorb`](Self::absorb)), if that bucket takes longer than
    /// `slower_than` to refill: a node that forwards a long quota's requests keeps a copy as
    /// spent as the owner's last answer, to decide on should the owner crash.
    pub fn absorb_answer(
        &self,
        kind: Option<&str>,
        key: &str,
        quota: Quota,
        slower_than: Duration,
    ) {
        let state = self.state.load();
        if let Some(Some(limiter)) = state.buckets(kind)
            && limiter
                .shape()
                .refill_time()
                .is_some_and(|refill| refill > slower_than)
        {
            limiter.absorb(key, quota);
        }
    }

    /// Sets aside part of the bucket a request of `kind` for `key` is counted in, for what its
    /// owner lent other nodes; the tokens it took out of the capacity (see
    /// [`KeyedLimiter::set_aside`](crate::keyed::KeyedLimiter::set_aside)).
    pub fn set_aside(
        &self,
        kind: Option<&str>,
        key: &str,
        (before, elapsed, after): (f64, Duration, f64),
    ) -> u64 {
        let state = self.state.load();
        match state.buckets(kind) {
            Some(Some(limiter)) => limiter.set_aside(key, before, elapsed, after),
            _ => 0,
        }
    }

    /// Holds the bucket a request of `kind` for `key` is counted in to what its new owner
    /// may allow after `held_for` of a `learning` period (see
    /// [`KeyedLimiter::hold_to_tenure`](crate::keyed::KeyedLimiter::hold_to_tenure)).
    pub fn hold_to_tenure(
        &self,
        kind: Option<&str>,
        key: &str,
        held_for: Duration,
        learning: Duration,
    ) {
        let state = self.state.load();
        if let Some(Some(limiter)) = state.buckets(kind) {
            limiter.hold_to_tenure(key, held_for, learning);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::ManualClock;
    use crate::policy::{Policy, PolicyConfig, Request};

    fn policy(toml: &str, clock: &ManualClock) -> Policy<ManualClock> {
        let config: PolicyConfig = toml::from_str(toml).unwrap();
        Policy::new(config, clock.clone()).unwrap()
    }

    const BUCKET: &str = r#"
        name = "p"
        on_exhausted = "reject"
        token_bucket = { rate = 10, burst = 10, overrides = { bulk = 4 } }
    "#;

    const WINDOW: &str = r#"
        name = "w"
        on_exhausted = "reject"
        fixed_window = { limit = 10, window = "1m" }
    "#;

    fn admitted(policy: &Policy<ManualClock>, kind: Option<&str>, key: &str) -> u32 {
        let mut request = Request::new(key);
        request.kind = kind;
        let mut n = 0;
        while policy.try_acquire(&request).is_ok() {
            n += 1;
        }
        n
    }

    #[test]
    fn a_handed_over_bucket_is_as_spent_on_its_new_owner() {
        let clock = ManualClock::new(0);
        let old = policy(BUCKET, &clock);
        let new = policy(BUCKET, &clock);
        for _ in 0..7 {
            drop(old.try_acquire(&Request::new("a")).unwrap());
        }
        drop(old.try_acquire(&Request::new("b").kind("bulk")).unwrap());
        let mut handed = old.spent_buckets(|_| true);
        handed.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(handed.len(), 2);
        assert_eq!(
            (handed[0].kind.as_deref(), handed[0].quota.remaining),
            (None, 3)
        );
        assert_eq!(
            (handed[1].kind.as_deref(), handed[1].quota.remaining),
            (Some("bulk"), 3)
        );
        for bucket in &handed {
            new.absorb(bucket.kind.as_deref(), &bucket.key, bucket.quota);
        }
        assert_eq!(admitted(&new, None, "a"), 3);
        assert_eq!(admitted(&new, Some("bulk"), "b"), 3);
        // Refilling goes on at the rate from where the old owner left it.
        clock.advance(Duration::from_millis(500));
        assert_eq!(admitted(&new, None, "a"), 5);
    }

    #[test]
    fn absorbing_never_fills_a_bucket() {
        let clock = ManualClock::new(0);
        let old = policy(BUCKET, &clock);
        let new = policy(BUCKET, &clock);
        drop(old.try_acquire(&Request::new("a")).unwrap());
        for _ in 0..9 {
            drop(new.try_acquire(&Request::new("a")).unwrap());
        }
        for bucket in old.spent_buckets(|_| true) {
            new.absorb(bucket.kind.as_deref(), &bucket.key, bucket.quota);
        }
        assert_eq!(admitted(&new, None, "a"), 1);
    }

    #[test]
    fn only_the_moving_keys_are_handed_over_and_whole_ones_never() {
        let clock = ManualClock::new(0);
        let old = policy(BUCKET, &clock);
        drop(old.try_acquire(&Request::new("stays")).unwrap());
        drop(old.try_acquire(&Request::new("moves")).unwrap());
        drop(old.try_acquire(&Request::new("refilled")).unwrap());
        clock.advance(Duration::from_millis(100));
        // `refilled` is whole again 100 ms after one token was taken; the others took again.
        drop(old.try_acquire(&Request::new("stays")).unwrap());
        drop(old.try_acquire(&Request::new("moves")).unwrap());
        let handed = old.spent_buckets(|key| key != "stays");
        let keys: Vec<&str> = handed.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["moves"]);
    }

    #[test]
    fn a_window_takes_on_a_count_of_its_own_window_only() {
        let clock = ManualClock::new(0);
        let old = policy(WINDOW, &clock);
        let new = policy(WINDOW, &clock);
        for _ in 0..6 {
            drop(old.try_acquire(&Request::new("a")).unwrap());
        }
        let handed = old.spent_buckets(|_| true);
        assert_eq!(handed.len(), 1);
        new.absorb(None, "a", handed[0].quota);
        assert_eq!(admitted(&new, None, "a"), 4);
        // A count from a window that has ended since is not carried into the next one.
        let other = policy(WINDOW, &clock);
        clock.advance(Duration::from_secs(100));
        other.absorb(None, "a", handed[0].quota);
        assert_eq!(admitted(&other, None, "a"), 10);
    }

    #[test]
    fn a_bucket_held_to_its_tenure_refills_at_its_rate_from_there() {
        let clock = ManualClock::new(0);
        let new = policy(BUCKET, &clock);
        let learning = Duration::from_secs(60);
        // 300 ms into a 1 s refill time: at most 3 of 10.
        new.hold_to_tenure(None, "a", Duration::from_millis(300), learning);
        assert_eq!(admitted(&new, None, "a"), 3);
        // Holding again, later, gives nothing back: the bucket refills only at its rate.
        clock.advance(Duration::from_millis(200));
        new.hold_to_tenure(None, "a", Duration::from_millis(500), learning);
        assert_eq!(admitted(&new, None, "a"), 2);
        // A tenure past the refill time holds nothing.
        clock.advance(Duration::from_millis(1000));
        new.hold_to_tenure(None, "a", Duration::from_millis(1500), learning);
        assert_eq!(admitted(&new, None, "a"), 10);
    }

    #[test]
    fn a_learning_period_shorter_than_the_refill_time_fills_the_bucket_sooner() {
        let clock = ManualClock::new(0);
        let new = policy(BUCKET, &clock);
        // 100 ms of a 200 ms learning period: half the bucket, not a tenth.
        new.hold_to_tenure(
            None,
            "a",
            Duration::from_millis(100),
            Duration::from_millis(200),
        );
        assert_eq!(admitted(&new, None, "a"), 5);
    }

    #[test]
    fn a_window_begun_before_the_tenure_is_full_until_it_ends() {
        let clock = ManualClock::new(0);
        let new = policy(WINDOW, &clock);
        clock.advance(Duration::from_secs(20));
        new.hold_to_tenure(None, "a", Duration::from_secs(5), Duration::from_secs(60));
        assert_eq!(admitted(&new, None, "a"), 0);
        // The next window began within the tenure: nothing to hold.
        clock.advance(Duration::from_secs(45));
        new.hold_to_tenure(None, "a", Duration::from_secs(50), Duration::from_secs(60));
        assert_eq!(admitted(&new, None, "a"), 10);
    }

    const DAY: &str = r#"
        name = "d"
        on_exhausted = "reject"
        token_bucket = { rate = 0.001, burst = 10 }
    "#;

    #[test]
    fn a_walk_visits_only_the_buckets_slower_to_refill_than_asked() {
        let clock = ManualClock::new(0);
        let slow = policy(DAY, &clock);
        let fast = policy(BUCKET, &clock);
        for p in [&slow, &fast] {
            drop(p.try_acquire(&Request::new("a")).unwrap());
        }
        let visited = |p: &Policy<ManualClock>, slower_than| {
            let mut keys = Vec::new();
            p.visit_spent(slower_than, |bucket| keys.push(bucket.key.to_owned()));
            keys.len()
        };
        // 10 at one per 1 000 s refill in 10 000 s; 10 at 10 a second, in one.
        let minute = Duration::from_secs(60);
        assert_eq!((visited(&slow, minute), visited(&fast, minute)), (1, 0));
        assert_eq!(visited(&fast, Duration::ZERO), 1);
    }

    #[test]
    fn a_bucket_s_word_changes_with_a_decision_and_not_with_time() {
        let clock = ManualClock::new(0);
        let p = policy(DAY, &clock);
        let word = |p: &Policy<ManualClock>| {
            let mut word = None;
            p.visit_spent(Duration::ZERO, |bucket| word = Some(bucket.word));
            word.unwrap()
        };
        drop(p.try_acquire(&Request::new("a")).unwrap());
        let first = word(&p);
        clock.advance(Duration::from_secs(5));
        assert_eq!(word(&p), first);
        drop(p.try_acquire(&Request::new("a")).unwrap());
        assert_ne!(word(&p), first);
    }

    #[test]
    fn a_restored_bucket_is_never_empty_longer_than_its_own_refill_time() {
        let clock = ManualClock::new(0);
        let before = policy(DAY, &clock);
        for _ in 0..7 {
            drop(before.try_acquire(&Request::new("a")).unwrap());
        }
        let mut kept = Vec::new();
        before.visit_spent(Duration::ZERO, |b| kept.push(b.quota));
        assert_eq!(kept[0].remaining, 3);
        // The same shape takes on exactly what was left.
        let same = policy(DAY, &clock);
        same.restore(None, "a", kept[0]);
        assert_eq!(admitted(&same, None, "a"), 3);
        // Restored into a policy changed to refill in a second: empty for at most that
        // second, not for the slow bucket's 7 000 s.
        let fast = policy(BUCKET, &clock);
        fast.restore(None, "a", kept[0]);
        assert_eq!(admitted(&fast, None, "a"), 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(admitted(&fast, None, "a"), 10);
    }
}
