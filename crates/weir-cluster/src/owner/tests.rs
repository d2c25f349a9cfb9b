//! The tests of [`super`].

use super::*;
use crate::ring::{DEFAULT_VNODES, Member, Ring};

fn request(bucket: &str) -> LeaseRequest {
    LeaseRequest::one(bucket, 5, "coordinator", Duration::from_nanos(1_000), 0)
}

const S: u64 = 1_000_000_000;

/// Owner `a` alone on its ring, fenced by a quorum that also knows `b` and `c` (its ring lost
/// them; gossip still counts them).
struct Fenced {
    a: Owner,
    quorum: Arc<crate::quorum::Quorum>,
}

impl Fenced {
    fn new() -> Self {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("a", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let quorum = Arc::new(crate::quorum::Quorum::new(
            "a",
            Duration::from_secs(3),
            false,
        ));
        let a =
            Owner::new("a", ring, Arc::new(SharedPool::new(100))).with_quorum(Arc::clone(&quorum));
        Fenced { a, quorum }
    }

    /// Beats `a` every second from `from` to `to`; `b` and `c` heard at each, or silent: still
    /// at the beat they had at `silent_since`.
    fn beat(&self, from: u64, to: u64, silent_since: Option<u64>) {
        for t in from..=to {
            let beat = u128::from(silent_since.unwrap_or(t));
            self.quorum.observe([("b", beat), ("c", beat)], t * S);
            self.a.beat(t * S);
        }
    }

    /// A fenced request of `ttl` for bucket `b` at `now`.
    fn request(ttl: Duration, now: u64) -> LeaseRequest {
        LeaseRequest {
            fence: Fence::Closed,
            now,
            ttl,
            ..request("b")
        }
    }
}

#[test]
fn an_owner_grants_only_for_buckets_it_owns_in_its_own_view() {
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("a", 1), Member::owner("b", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)));
    let (mine, theirs): (Vec<String>, Vec<String>) = (0..100)
        .map(|i| format!("bucket-{i}"))
        .partition(|b| ring.owner_of(b).as_deref() == Some("a"));
    assert!(!mine.is_empty() && !theirs.is_empty());
    assert!(matches!(
        a.grant(&request(&mine[0])),
        Ok(Grant::Granted { .. })
    ));
    assert_eq!(
        a.grant(&request(&theirs[0])),
        Err(TransportError::NotOwner("a".into()))
    );
    // When its view changes (b left), it owns everything.
    ring.publish(Ring::new([Member::owner("a", 1)], DEFAULT_VNODES, 1));
    assert!(matches!(
        a.grant(&request(&theirs[0])),
        Ok(Grant::Granted { .. })
    ));
}

#[test]
fn a_fenced_request_waits_for_one_ttl_of_tenure() {
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("a", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100)));
    a.beat(0);
    let fenced = |now| LeaseRequest {
        fence: Fence::Closed,
        now,
        ..request("b")
    };
    assert_eq!(
        a.grant(&fenced(400)),
        Err(TransportError::Settling {
            owner: "a".into(),
            wait: Duration::from_nanos(600)
        })
    );
    assert!(
        matches!(a.grant(&request("b")), Ok(Grant::Granted { .. })),
        "an unfenced request does not wait"
    );
    assert!(matches!(a.grant(&fenced(1_000)), Ok(Grant::Granted { .. })));
}

#[test]
fn without_a_majority_fenced_grants_and_renewals_are_refused() {
    let cluster = Fenced::new();
    let a = &cluster.a;
    let fenced = |now| Fenced::request(Duration::from_secs(10), now);
    // Silent, b and c stay at the beat they had at 14 s.
    let beat = |from, to, heard: bool| cluster.beat(from, to, (!heard).then_some(14));
    beat(0, 13, true);
    // The tenure is the TTL plus the quorum's margin (3 s window + 1 s).
    assert_eq!(
        a.grant(&fenced(13 * S)),
        Err(TransportError::Settling {
            owner: "a".into(),
            wait: Duration::from_secs(1)
        })
    );
    beat(14, 14, true);
    let Ok(Grant::Granted { id, .. }) = a.grant(&fenced(14 * S)) else {
        panic!("granted after ttl + margin");
    };
    // b and c fall silent after 14 s: past the 3 s window, a is cut off.
    beat(15, 17, false);
    assert!(
        a.renew("b", id, Duration::from_secs(10), 17 * S, true),
        "still a majority at 17 s"
    );
    beat(18, 18, false);
    assert_eq!(
        a.grant(&fenced(18 * S)),
        Err(TransportError::NoMajority {
            owner: "a".into(),
            heard: 1,
            known: 3
        })
    );
    assert!(
        !a.renew("b", id, Duration::from_secs(10), 18 * S, true),
        "a cut-off owner lets its fenced leases run out"
    );
    assert!(
        a.renew("b", id, Duration::from_secs(10), 18 * S, false),
        "unfenced: renewed"
    );
    assert!(matches!(a.grant(&request("b")), Ok(Grant::Granted { .. })));
    // Cut off until 20 s; heard again from 21 s. Its ring never moved the bucket, but the
    // others may have given it to an owner on their side: a waits a whole tenure again.
    beat(19, 20, false);
    beat(21, 21, true);
    assert_eq!(
        a.grant(&fenced(21 * S)),
        Err(TransportError::Settling {
            owner: "a".into(),
            wait: Duration::from_secs(13)
        })
    );
    beat(22, 34, true);
    assert!(matches!(
        a.grant(&fenced(34 * S)),
        Ok(Grant::Granted { .. })
    ));
}

/// Cut off, an owner's ring may keep no one but itself, and the census of that ring is
/// answered at once — and settled, on a cluster's first run, once the departures it saw are
/// a window old: a heal must still wait out the tenure (the interim owner on the majority's
/// side may have granted), not grant on a census that could not see them.
#[test]
fn a_healed_owner_alone_on_its_ring_waits_its_tenure_whatever_its_census() {
    let cluster = Fenced::new();
    let a = &cluster.a;
    a.expect(["a".to_owned()]);
    // A cluster on its first run: its census needs no one awake for a whole window.
    a.first_run();
    let fenced = |now| Fenced::request(Duration::from_secs(3), now);
    let beat = |from, to, heard: bool| cluster.beat(from, to, (!heard).then_some(10));
    beat(0, 10, true);
    // Cut off from 10 s; the failure detector reports b and c gone at 15 s.
    beat(11, 14, false);
    a.departed(false, 15 * S);
    beat(15, 40, false);
    // Heard again from 41 s, 26 s after the departures: long past a window of 3 + 4 s.
    beat(41, 41, true);
    assert!(
        matches!(
            a.grant(&fenced(41 * S)),
            Err(TransportError::Settling { .. })
        ),
        "granted at the heal"
    );
    beat(42, 46, true);
    assert!(matches!(
        a.grant(&fenced(46 * S)),
        Err(TransportError::Settling { .. })
    ));
    // A whole tenure (3 s TTL and the 4 s margin) after its last beat cut off, at 40 s.
    beat(47, 47, true);
    assert!(matches!(
        a.grant(&fenced(47 * S)),
        Ok(Grant::Granted { .. })
    ));
}

/// A node still joining hears no majority (it assumes another member it has not heard):
/// that is not being cut off, and a cluster deployed for the first time grants at once.
#[test]
fn a_node_that_never_heard_a_majority_has_not_been_cut_off() {
    use crate::quorum::Quorum;
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("a", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let quorum = Arc::new(Quorum::new("a", Duration::from_secs(3), true));
    let a = Owner::new("a", Arc::clone(&ring), Arc::new(SharedPool::new(100))).with_quorum(quorum);
    for t in 0..5 {
        a.beat(t * S);
    }
    assert_eq!(a.quiet(5 * S).unclean_departure, None);
}

#[test]
fn a_settled_census_lets_a_new_owner_grant_before_its_tenure_and_counts_what_is_held() {
    use crate::census::{Answer, Held, Quiet};
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("b", 1)],
        DEFAULT_VNODES,
        1,
    )));
    let pool = Arc::new(SharedPool::new(100));
    let a = Owner::new("a", Arc::clone(&ring), Arc::clone(&pool));
    for t in 0..=100 {
        a.beat(t * S);
    }
    // a joins: the bucket moves to it from b.
    ring.publish(Ring::new(
        [Member::owner("a", 1), Member::owner("b", 1)],
        DEFAULT_VNODES,
        1,
    ));
    let bucket = (0..100)
        .map(|i| format!("bucket-{i}"))
        .find(|b| ring.owner_of(b).as_deref() == Some("a"))
        .expect("a bucket of a's");
    a.beat(101 * S);
    let fenced = |now| LeaseRequest {
        fence: Fence::Closed,
        now,
        ttl: Duration::from_secs(10),
        limit: 3,
        ..request(&bucket)
    };
    let settling = |result: Result<Grant, TransportError>| {
        matches!(result, Err(TransportError::Settling { .. }))
    };
    assert!(settling(a.grant(&fenced(101 * S))));
    a.expect(["a".to_owned(), "b".to_owned()]);
    assert_eq!(a.unanswered(), vec!["b".to_owned()]);
    assert!(settling(a.grant(&fenced(101 * S))), "b has not answered");
    let answer = |fingerprint, unclean: Option<u64>| Answer {
        fingerprint,
        quiet: Quiet {
            awake: Duration::from_secs(500),
            unclean_departure: unclean.map(Duration::from_secs),
            first_run: false,
        },
        // b still holds a lease from its own pool whose handoff failed: counted here.
        held: vec![Held {
            bucket: bucket.clone(),
            owner: "b".to_owned(),
            id: 9,
            units: 2,
            remaining: Duration::from_secs(5),
        }],
    };
    assert!(
        !a.counted("b", &answer(a.fingerprint() + 1, None), 101 * S),
        "an answer on another ring"
    );
    assert_eq!(pool.in_use(&bucket, 101 * S), 0);
    assert!(a.counted("b", &answer(a.fingerprint(), None), 101 * S));
    assert!(a.unanswered().is_empty());
    assert_eq!(pool.in_use(&bucket, 101 * S), 2);
    // Granted 85 s before the tenure would have been long enough, with b's two units
    // counted against the limit of 3.
    assert!(matches!(
        a.grant(&fenced(101 * S)),
        Ok(Grant::Granted { .. })
    ));
    assert!(matches!(a.grant(&fenced(101 * S)), Ok(Grant::Full)));
    // A member that vanished without stepping down: back to the tenure.
    a.departed(false, 102 * S);
    a.beat(102 * S);
    assert!(settling(a.grant(&fenced(102 * S))));
}

#[test]
fn a_census_answer_lists_nothing_twice() {
    use crate::census::{Answer, Held, Quiet};
    let ring = Arc::new(SharedRing::new(Ring::new(
        [Member::owner("a", 1)],
        DEFAULT_VNODES,
        1,
    )));
    // This process numbers its leases from 1000; its previous one numbered below.
    let pool = Arc::new(SharedPool::new(100).with_first_id(1000));
    let a = Owner::new("a", Arc::clone(&ring), Arc::clone(&pool));
    let granted = || match a.grant(&request("b")) {
        Ok(Grant::Granted { id, .. }) => id,
        other => panic!("granted: {other:?}"),
    };
    let (live, released) = (granted(), granted());
    a.release("b", released);
    let listed = |ids: &[u64]| Answer {
        fingerprint: a.fingerprint(),
        quiet: Quiet {
            awake: Duration::from_secs(1),
            unclean_departure: None,
            first_run: false,
        },
        held: ids
            .iter()
            .map(|&id| Held {
                bucket: "b".to_owned(),
                owner: "a".to_owned(),
                id,
                units: 1,
                remaining: Duration::from_nanos(500),
            })
            .collect(),
    };
    a.expect(["a".to_owned(), "c".to_owned(), "d".to_owned()]);
    // A live lease of this pool is counted once; one it released while the answer was on
    // its way is not counted again; one of its previous process is new, and counted.
    assert!(a.counted("c", &listed(&[live, released]), 0));
    assert_eq!(pool.in_use("b", 0), 1);
    assert!(a.counted("d", &listed(&[999]), 0));
    assert_eq!(pool.in_use("b", 0), 2);
    // A member's second answer on the same ring adds nothing.
    assert!(!a.counted("d", &listed(&[998]), 0));
    assert_eq!(pool.in_use("b", 0), 2);
}
