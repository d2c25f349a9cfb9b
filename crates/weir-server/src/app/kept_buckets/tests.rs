use super::*;
use crate::app::cells::Cells;
use std::sync::atomic::Ordering::Relaxed;

use weir::policy::{PolicyConfig, Request};

/// Ten a day: one back every 8 640 s, so the milliseconds a test takes give nothing back.
const DAY: &str = r#"
    name = "day"
    on_exhausted = "reject"
    token_bucket = { rate = 0.000115740740, burst = 10 }
"#;

/// Ten a second: whole again within a second, never kept.
const SECOND: &str = r#"
    name = "second"
    on_exhausted = "reject"
    token_bucket = { rate = 10, burst = 10 }
"#;

fn policies(configs: &[&str]) -> PolicySet<SystemClock> {
    let configs: Vec<PolicyConfig> = configs.iter().map(|c| toml::from_str(c).unwrap()).collect();
    PolicySet::new(configs, SystemClock::new()).unwrap()
}

fn spend(policies: &PolicySet<SystemClock>, policy: &str, key: &str, n: usize) {
    let policy = policies.get(policy).unwrap();
    for _ in 0..n {
        drop(policy.try_acquire(&Request::new(key)).unwrap());
    }
}

fn left(policies: &PolicySet<SystemClock>, policy: &str, key: &str) -> usize {
    let policy = policies.get(policy).unwrap();
    let mut n = 0;
    while policy.try_acquire(&Request::new(key)).is_ok() {
        n += 1;
    }
    n
}

const MINUTE: Duration = Duration::from_secs(60);

fn no_cells() -> Cells {
    Cells::new(100)
}

#[test]
fn a_day_quota_is_as_spent_after_a_restart_and_a_fast_bucket_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let running = policies(&[DAY, SECOND]);
        let kept = KeptBuckets::open(dir.path(), MINUTE, &running, (&no_cells(), 0)).unwrap();
        spend(&running, "day", "tenant", 7);
        spend(&running, "second", "tenant", 7);
        kept.flush(&running, (&no_cells(), 0)).unwrap();
        assert_eq!(kept.counters.written.load(Relaxed), 1);
        assert_eq!(kept.counters.kept.load(Relaxed), 1);
    }
    let restarted = policies(&[DAY, SECOND]);
    let kept = KeptBuckets::open(dir.path(), MINUTE, &restarted, (&no_cells(), 0)).unwrap();
    assert_eq!(kept.counters.restored.load(Relaxed), 1);
    assert_eq!(left(&restarted, "day", "tenant"), 3);
    assert_eq!(left(&restarted, "second", "tenant"), 10);
}

#[test]
fn a_walk_writes_only_the_buckets_a_decision_changed() {
    let dir = tempfile::tempdir().unwrap();
    let running = policies(&[DAY]);
    let kept = KeptBuckets::open(dir.path(), MINUTE, &running, (&no_cells(), 0)).unwrap();
    spend(&running, "day", "a", 1);
    spend(&running, "day", "b", 1);
    kept.flush(&running, (&no_cells(), 0)).unwrap();
    kept.flush(&running, (&no_cells(), 0)).unwrap();
    assert_eq!(kept.counters.written.load(Relaxed), 2);
    spend(&running, "day", "b", 1);
    kept.flush(&running, (&no_cells(), 0)).unwrap();
    assert_eq!(kept.counters.written.load(Relaxed), 3);
    // A write per walk that had something to write; the first walk also removes whole ones.
    assert_eq!(kept.counters.flushes.load(Relaxed), 2);
}

#[test]
fn a_kept_bucket_waits_for_its_policy_to_come() {
    let dir = tempfile::tempdir().unwrap();
    {
        let running = policies(&[DAY]);
        let kept = KeptBuckets::open(dir.path(), MINUTE, &running, (&no_cells(), 0)).unwrap();
        spend(&running, "day", "tenant", 8);
        kept.flush(&running, (&no_cells(), 0)).unwrap();
    }
    // The policy comes later (a cluster's policy log applying it): taken on at the next walk.
    let restarted = policies(&[]);
    let kept = KeptBuckets::open(dir.path(), MINUTE, &restarted, (&no_cells(), 0)).unwrap();
    assert_eq!(kept.counters.restored.load(Relaxed), 0);
    kept.flush(&restarted, (&no_cells(), 0)).unwrap();
    restarted.upsert(toml::from_str(DAY).unwrap()).unwrap();
    kept.flush(&restarted, (&no_cells(), 0)).unwrap();
    assert_eq!(kept.counters.restored.load(Relaxed), 1);
    assert_eq!(left(&restarted, "day", "tenant"), 2);
}

#[test]
fn a_cl_throttle_key_of_an_hour_is_as_spent_after_a_restart() {
    use crate::app::cells::Throttle;
    let dir = tempfile::tempdir().unwrap();
    let none = policies(&[]);
    // 10 an hour, a burst of 10; and 10 a second, never kept.
    let hour = Throttle {
        max_burst: 9,
        count: 10,
        period: 3600,
        quantity: 1,
    };
    let second = Throttle { period: 1, ..hour };
    let second_ns = 1_000_000_000;
    {
        let cells = Cells::new(100);
        let kept = KeptBuckets::open(dir.path(), MINUTE, &none, (&cells, 0)).unwrap();
        for _ in 0..7 {
            assert!(!cells.throttle(b"h", &hour, second_ns).unwrap().limited);
            assert!(!cells.throttle(b"s", &second, second_ns).unwrap().limited);
        }
        kept.flush(&none, (&cells, second_ns)).unwrap();
        assert_eq!(kept.counters.written.load(Relaxed), 1);
    }
    // Another clock, started anew: the key is taken on as of the wall clock.
    let cells = Cells::new(100);
    let kept = KeptBuckets::open(dir.path(), MINUTE, &none, (&cells, 5 * second_ns)).unwrap();
    assert_eq!(kept.counters.restored.load(Relaxed), 1);
    let first = cells.throttle(b"h", &hour, 5 * second_ns).unwrap();
    assert_eq!((first.limited, first.remaining), (false, 2));
    let fresh = cells.throttle(b"s", &second, 5 * second_ns).unwrap();
    assert_eq!(fresh.remaining, 9);
}
