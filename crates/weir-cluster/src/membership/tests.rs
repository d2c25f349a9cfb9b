//! The tests of [`super`].

use super::*;
use crate::pool::{Grant, SharedPool};
use crate::ring::DEFAULT_VNODES;

fn node(id: &str) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        grpc: format!("http://{id}:50051"),
        protocol: 1,
        newest: 1,
        owner: true,
    }
}

#[test]
fn applying_members_rebuilds_the_ring_and_keeps_the_departeds_leases_until_they_expire() {
    let ring = SharedRing::default();
    let pool = SharedPool::new(100);
    let mut previous = BTreeSet::new();
    let mut seen = HashMap::new();
    let first = apply(
        &[node("a"), node("b")],
        &mut previous,
        &ring,
        DEFAULT_VNODES,
        Speaks::only(1),
        |a| seen = a,
    );
    assert_eq!(
        first,
        Applied {
            departed: Vec::new(),
            joined: vec!["a".to_owned(), "b".to_owned()],
        }
    );
    assert_eq!(ring.load().members(), ["a", "b"]);
    assert_eq!(seen["b"], "http://b:50051");
    assert!(matches!(
        pool.acquire("x", 5, "b", std::time::Duration::from_nanos(1_000), 0),
        Grant::Granted { .. }
    ));
    assert!(matches!(
        pool.acquire("x", 5, "a", std::time::Duration::from_nanos(1_000), 0),
        Grant::Granted { .. }
    ));
    let second = apply(
        &[node("a")],
        &mut previous,
        &ring,
        DEFAULT_VNODES,
        Speaks::only(1),
        |_| {},
    );
    assert_eq!(second.departed, ["b"]);
    assert!(second.joined.is_empty());
    // "Departed" may be a pause: b's permit is still counted, and the bucket stays full to
    // its limit, until the lease expires.
    assert_eq!(pool.in_use("x", 0), 2);
    assert_eq!(pool.in_use("x", 999), 2);
    assert_eq!(pool.in_use("x", 1_000), 0, "gone at its expiry");
    assert_eq!(ring.load().members(), ["a"]);
}

#[test]
fn a_static_membership_publishes_changes() {
    let membership = StaticMembership::new(vec![node("a")]);
    let mut watch = membership.watch();
    assert_eq!(watch.borrow_and_update().len(), 1);
    membership.set(vec![node("a"), node("b")]);
    assert!(watch.has_changed().unwrap());
    assert_eq!(watch.borrow_and_update().len(), 2);
}

/// A rolling upgrade's mixed window: a member of the previous release (speaking 3 alone)
/// and members of the next (3 to 4, speaking 3 while it is up) are on one ring, whichever
/// release builds it; once it is gone, the next release's members raise their versions and
/// stay on one ring meanwhile.
#[test]
fn releases_that_share_a_version_share_one_ring() {
    let member = |id: &str, protocol: u32, newest: u32| NodeInfo {
        protocol,
        newest,
        ..node(id)
    };
    let (previous_release, next_release) = (
        Speaks::only(3),
        Speaks {
            oldest: 3,
            newest: 4,
        },
    );
    let ring_of = |members: &[NodeInfo], speaks: Speaks| {
        let ring = SharedRing::default();
        apply(
            members,
            &mut BTreeSet::new(),
            &ring,
            DEFAULT_VNODES,
            speaks,
            |_| {},
        );
        ring.load().members().to_vec()
    };
    let mixed = [member("a", 3, 3), member("b", 3, 4), member("c", 3, 4)];
    assert_eq!(next_release.among(mixed.iter().map(|m| m.newest)), 3);
    assert_eq!(ring_of(&mixed, previous_release), ["a", "b", "c"]);
    assert_eq!(ring_of(&mixed, next_release), ["a", "b", "c"]);
    // a restarted on the next release: b has raised its version, c not yet.
    let raising = [member("a", 3, 4), member("b", 4, 4), member("c", 3, 4)];
    assert_eq!(next_release.among(raising.iter().map(|m| m.newest)), 4);
    assert_eq!(ring_of(&raising, next_release), ["a", "b", "c"]);
}
