//! The unit tests of `pool.rs`.

use std::sync::{Arc, Barrier};

use super::*;
use crate::messages::Ask;

const TTL: Duration = Duration::from_nanos(1_000);

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

fn granted(grant: Grant) -> u64 {
    match grant {
        Grant::Granted { id, .. } => id,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn limit_2_grants_two_and_refuses_the_third() {
    let pool = SharedPool::new(100);
    granted(pool.acquire("b", 2, "a", TTL, 0));
    granted(pool.acquire("b", 2, "b", TTL, 0));
    assert_eq!(pool.acquire("b", 2, "c", TTL, 0), Grant::Full);
}

#[test]
fn a_release_lets_exactly_one_in_and_is_idempotent() {
    let pool = SharedPool::new(100);
    let a = granted(pool.acquire("b", 1, "a", TTL, 0));
    assert_eq!(pool.acquire("b", 1, "b", TTL, 0), Grant::Full);
    assert!(pool.release("b", a));
    assert!(!pool.release("b", a), "twice is a no-op");
    assert!(!pool.release("b", 999), "unknown ids too");
    granted(pool.acquire("b", 1, "c", TTL, 0));
    assert_eq!(pool.acquire("b", 1, "d", TTL, 0), Grant::Full);
}

#[test]
fn expiry_is_inclusive_and_needs_no_sweep() {
    let pool = SharedPool::new(100);
    granted(pool.acquire("b", 1, "a", ns(100), 0));
    assert_eq!(pool.acquire("b", 1, "b", ns(100), 99), Grant::Full);
    granted(pool.acquire("b", 1, "b", ns(100), 100));
}

#[test]
fn a_sweep_drops_what_expired_and_empty_buckets() {
    let pool = SharedPool::new(100);
    granted(pool.acquire("b", 1, "a", ns(100), 0));
    assert_eq!(pool.sweep(99), 0);
    assert_eq!(pool.buckets(), 1);
    assert_eq!(pool.sweep(100), 1);
    assert_eq!(pool.buckets(), 0);
    assert_eq!(pool.sweep(100), 0, "sweeping twice changes nothing");
}

#[test]
fn renewal_extends_live_leases_only() {
    let pool = SharedPool::new(100);
    let a = granted(pool.acquire("b", 1, "a", ns(100), 0));
    assert_eq!(pool.renew("b", a, ns(100), 50), Some(150));
    assert_eq!(pool.acquire("b", 1, "b", ns(100), 120), Grant::Full);
    assert_eq!(pool.renew("b", a, ns(100), 150), None, "expired at 150");
}

#[test]
fn sixty_four_threads_racing_on_limit_10_get_exactly_10() {
    for _ in 0..20 {
        let pool = Arc::new(SharedPool::new(100));
        let start = Arc::new(Barrier::new(64));
        let threads: Vec<_> = (0..64)
            .map(|i| {
                let (pool, start) = (Arc::clone(&pool), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    matches!(
                        pool.acquire("b", 10, &format!("n{i}"), TTL, 0),
                        Grant::Granted { .. }
                    )
                })
            })
            .collect();
        let grants = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&g| g)
            .count();
        assert_eq!(grants, 10);
        assert_eq!(pool.in_use("b", 0), 10);
    }
}

#[test]
fn adopted_leases_count_against_the_limit() {
    let pool = SharedPool::new(100);
    pool.adopt("b", "a", 1_000, 1, false);
    pool.adopt("b", "a", 1_000, 1, false);
    assert_eq!(pool.in_use("b", 0), 2);
    assert_eq!(pool.acquire("b", 2, "c", TTL, 0), Grant::Full);
    assert_eq!(
        pool.acquire("b", 2, "c", TTL, 1_000),
        Grant::Granted {
            id: 2,
            expires_at: weir::clock::after(1_000, TTL),
            units: 1,
            keep: 0,
        }
    );
}

#[test]
fn a_holder_has_one_loan_per_bucket_which_lends_grow_and_plain_leases_do_not() {
    let pool = SharedPool::new(100);
    let lend = |holder: &str, units| LeaseRequest {
        ask: Ask::borrow(units),
        ..LeaseRequest::one("b", 100, holder, TTL, 0)
    };
    // Two requests racing to start a loan grow the same one.
    let first = granted(pool.lend(&lend("a", 3)));
    let second = granted(pool.lend(&lend("a", 2)));
    assert_eq!(first, second);
    assert_ne!(granted(pool.lend(&lend("z", 1))), first, "another holder's");
    assert_ne!(
        granted(pool.acquire("b", 100, "a", TTL, 0)),
        first,
        "a plain lease"
    );
    assert_eq!(pool.in_use("b", 0), 3 + 2 + 1 + 1);
    // A renewal of a loan the holder does not have is refused.
    assert_eq!(pool.lend(&lend("y", 0)), Grant::Full);
    // An adopted loan is the holder's loan here.
    let adopted = pool.adopt("b2", "a", 1_000, 4, true);
    assert_eq!(
        granted(pool.lend(&LeaseRequest {
            bucket: "b2".into(),
            ..lend("a", 1)
        })),
        adopted
    );
}

#[test]
fn a_loan_adopted_replaces_what_was_left_here_of_the_holders_earlier_loan() {
    // A partition of this owner, healed: holder `n1` had a loan here before the cut (kept
    // here, the hand-away never arrived), took it to the interim owner, and hands it back.
    let pool = SharedPool::new(100);
    let ttl = ns(5_000);
    let lend = |ask: Ask, now| LeaseRequest {
        ask,
        ..LeaseRequest::one("b", 3, "n1", ttl, now)
    };
    let before_cut = granted(pool.lend(&lend(Ask::borrow(1), 0)));
    let adopted = pool.adopt("b", "n1", 4_000, 1, true);
    assert_ne!(adopted, before_cut);
    assert_eq!(pool.in_use("b", 100), 1, "one unit in use, counted once");
    // The holder's loan requests (by holder) and renewals (by id) reach the same loan…
    assert_eq!(
        pool.lend(&lend(Ask::RenewLoan, 3_000)),
        Grant::Renewed {
            id: adopted,
            expires_at: weir::clock::after(3_000, ttl),
            keep: 0,
        }
    );
    assert!(pool.renew("b", adopted, ttl, 3_500).is_some());
    assert!(pool.renew("b", before_cut, ttl, 3_500).is_none());
    // …and once it is given back, nothing of the holder's stays lent here.
    assert!(pool.release("b", adopted));
    assert_eq!(pool.lent(3_600).get("n1"), None);
    assert_eq!(pool.in_use("b", 3_600), 0);
    // Plain leases are not loans: a holder may have many.
    let plain = pool.adopt("c", "n1", 4_000, 1, false);
    let other = pool.adopt("c", "n1", 4_000, 1, false);
    assert_ne!(plain, other);
    assert_eq!(pool.in_use("c", 0), 2);
}

#[test]
fn a_loan_grows_by_a_quarter_of_what_is_free_and_says_what_to_keep() {
    let pool = SharedPool::new(100);
    let long = Duration::from_secs(10);
    let lend = |units, now| LeaseRequest {
        ask: Ask::borrow(units),
        ..LeaseRequest::one("b", 8, "a", long, now)
    };
    let grant = pool.lend(&lend(16, 0));
    assert!(
        matches!(
            grant,
            Grant::Granted {
                units: 2,
                keep: 1,
                ..
            }
        ),
        "{grant:?}"
    );
    // Nearly full: one unit a call, and less and less to keep.
    let keeps: Vec<u64> = (0..6)
        .map(|_| match pool.lend(&lend(16, 0)) {
            Grant::Granted { units: 1, keep, .. } => keep,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(keeps, [1, 1, 0, 0, 0, 0]);
    assert_eq!(pool.lend(&lend(1, 0)), Grant::Full);
    assert_eq!(
        pool.refused_while_lent(),
        0,
        "its own loan is not lent elsewhere"
    );
    // Another holder refused while `a` holds a loan: counted, and a recall for two seconds.
    assert_eq!(pool.acquire("b", 8, "z", long, 0), Grant::Full);
    assert_eq!(pool.refused_while_lent(), 1);
    let id = match pool.lend(&lend(0, 0)) {
        Grant::Renewed { id, .. } => id,
        other => panic!("{other:?}"),
    };
    assert!(pool.give_back("b", id, 4));
    let renewed = pool.lend(&lend(0, 1));
    assert!(
        matches!(renewed, Grant::Renewed { keep: 0, .. }),
        "recalled: {renewed:?}"
    );
    let later = pool.lend(&lend(0, weir::clock::after(0, RECALL_FOR)));
    assert!(
        matches!(later, Grant::Renewed { keep: 1, .. }),
        "the recall is over: {later:?}"
    );
}

#[test]
fn the_number_of_buckets_is_bounded() {
    let pool = SharedPool::new(2);
    granted(pool.acquire("b1", 1, "a", ns(100), 0));
    granted(pool.acquire("b2", 1, "a", ns(200), 0));
    assert_eq!(
        pool.acquire("b3", 1, "a", ns(100), 0),
        Grant::TooManyBuckets
    );
    // Once b1's lease has expired, its bucket makes room.
    granted(pool.acquire("b3", 1, "a", ns(100), 100));
    assert_eq!(pool.buckets(), 2);
}
