use super::*;

fn policy(name: &str, qps: f64) -> PolicyConfig {
    toml::from_str(&format!("name = \"{name}\"\nstrict = {{ qps = {qps} }}")).unwrap()
}

fn put(config: PolicyConfig, if_match: Option<&str>, base: Option<PolicyConfig>) -> Change {
    Change::Put {
        config,
        expect: Expect {
            if_match: if_match.map(str::to_owned),
            base,
        },
    }
}

#[test]
fn of_two_writes_against_one_version_exactly_the_first_applied_wins() {
    let base = policy("global", 40.0);
    let tag = etag_of(&base);
    let mut overlay = Overlay::default();
    // Two members read the same version and both propose against it; the log orders them.
    let first = put(policy("global", 5.0), Some(&tag), Some(base.clone()));
    let second = put(policy("global", 7.0), Some(&tag), Some(base.clone()));
    assert_eq!(
        apply(&mut overlay, first),
        Outcome::Written { created: false }
    );
    assert_eq!(
        apply(&mut overlay, second),
        Outcome::PreconditionFailed {
            current: Some(etag_of(&policy("global", 5.0)))
        }
    );
    assert_eq!(overlay.upserts["global"], policy("global", 5.0));
}

#[test]
fn the_base_counts_until_the_overlay_holds_the_name() {
    let mut overlay = Overlay::default();
    // No base, `If-Match: *`: there is nothing to match.
    assert_eq!(
        apply(&mut overlay, put(policy("new", 1.0), Some("*"), None)),
        Outcome::PreconditionFailed { current: None }
    );
    assert_eq!(
        apply(&mut overlay, put(policy("new", 1.0), None, None)),
        Outcome::Written { created: true }
    );
    // Once written, the overlay's version is what a write is checked against, whatever base
    // the proposer carried.
    assert_eq!(
        apply(
            &mut overlay,
            put(
                policy("new", 2.0),
                Some(&etag_of(&policy("other", 9.0))),
                Some(policy("other", 9.0))
            )
        ),
        Outcome::PreconditionFailed {
            current: Some(etag_of(&policy("new", 1.0)))
        }
    );
}

#[test]
fn a_delete_hides_the_base_and_a_second_one_finds_nothing() {
    let base = policy("file", 3.0);
    let mut overlay = Overlay::default();
    let delete = || Change::Delete {
        name: "file".into(),
        expect: Expect {
            if_match: None,
            base: Some(base.clone()),
        },
    };
    assert_eq!(
        apply(&mut overlay, delete()),
        Outcome::Deleted {
            previous: base.clone()
        }
    );
    assert!(overlay.deletes.contains("file"));
    assert_eq!(apply(&mut overlay, delete()), Outcome::NotFound);
    // A conditional delete of what is gone fails its precondition rather than "not found".
    let conditional = Change::Delete {
        name: "file".into(),
        expect: Expect {
            if_match: Some(etag_of(&base)),
            base: Some(base.clone()),
        },
    };
    assert_eq!(
        apply(&mut overlay, conditional),
        Outcome::PreconditionFailed { current: None }
    );
}

#[test]
fn a_seed_replaces_the_overlay_whole() {
    let mut overlay = Overlay::default().with_upsert(policy("a", 1.0));
    let seed = Overlay::default().with_delete("b");
    assert_eq!(
        apply(
            &mut overlay,
            Change::Seed {
                overlay: seed.clone()
            }
        ),
        Outcome::Seeded
    );
    assert_eq!(overlay, seed);
}

#[test]
fn a_revert_drops_a_replacement_or_a_deletion_and_finds_nothing_the_second_time() {
    let mut overlay = Overlay::default();
    let base = policy("global", 40.0);
    apply(
        &mut overlay,
        put(policy("global", 5.0), None, Some(base.clone())),
    );
    let delete = Change::Delete {
        name: "other".to_owned(),
        expect: Expect {
            if_match: None,
            base: Some(policy("other", 1.0)),
        },
    };
    apply(&mut overlay, delete);
    for name in ["global", "other"] {
        let revert = Change::Revert {
            name: name.to_owned(),
        };
        assert_eq!(apply(&mut overlay, revert.clone()), Outcome::Reverted);
        assert!(!overlay.touches(name));
        assert_eq!(apply(&mut overlay, revert), Outcome::NotFound);
    }
    // The file's versions apply again.
    assert_eq!(
        overlay.apply(vec![base.clone(), policy("other", 1.0)]),
        [base, policy("other", 1.0)]
    );
}
