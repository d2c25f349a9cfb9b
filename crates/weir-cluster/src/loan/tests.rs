//! The unit tests of `loan.rs`.

use super::*;

const S: u64 = 1_000_000_000;

fn book() -> LoanBook {
    LoanBook::new(8)
}

#[test]
fn units_are_taken_only_from_a_live_loan_of_the_current_owner() {
    let mut book = book();
    assert_eq!(book.take("b", "a", 0, 0), None, "nothing lent");
    assert_eq!(book.ask("b", "a", 0), Ask::borrow(1));
    assert_eq!(book.granted("b", "a", 7, 2, 2, 10 * S), None);
    let one = book.take("b", "a", 10 * S, 0).expect("lent");
    assert!(
        book.take("b", "z", 0, 0).is_none(),
        "another owner's bucket now"
    );
    assert!(
        book.take("b", "a", 10 * S + 1, 0).is_none(),
        "would outlive the loan"
    );
    let _two = book.take("b", "a", 0, 0).expect("the second unit");
    assert!(book.take("b", "a", 0, 0).is_none(), "both in use");
    assert_eq!(book.put_back(&one), None, "kept: the owner lets it keep 2");
    assert!(book.take("b", "a", 0, 0).is_some());
}

#[test]
fn a_busy_loan_asks_for_as_many_more_as_it_has_in_use_within_max_loan() {
    let mut book = book();
    book.granted("b", "a", 1, 3, 8, S);
    for _ in 0..3 {
        book.take("b", "a", 0, 0).unwrap();
    }
    assert_eq!(book.ask("b", "a", 0), Ask::borrow(4));
    book.granted("b", "a", 1, 4, 8, S);
    for _ in 0..4 {
        book.take("b", "a", 0, 0).unwrap();
    }
    assert_eq!(
        book.ask("b", "a", 0).units(),
        1,
        "7 lent: one more reaches 8"
    );
    book.granted("b", "a", 1, 1, 8, S);
    book.take("b", "a", 0, 0).unwrap();
    assert_eq!(
        book.ask("b", "a", 0).units(),
        1,
        "past max_loan: one at a time"
    );
    assert_eq!(
        book.totals(),
        Totals {
            loans: 1,
            units: 8,
            in_use: 8
        }
    );
}

#[test]
fn units_beyond_keep_go_back_when_put_back_and_at_upkeep() {
    let mut book = book();
    book.granted("b", "a", 1, 4, 1, S);
    let units: Vec<Unit> = (0..4).map(|_| book.take("b", "a", 0, 0).unwrap()).collect();
    assert_eq!(book.put_back(&units[0]), None, "one idle: kept");
    assert_eq!(
        book.put_back(&units[1]),
        Some(Owed::GiveBack {
            bucket: "b".into(),
            owner: "a".into(),
            id: 1,
            units: 1
        })
    );
    // A recall: the owner's renewal says keep none.
    assert_eq!(
        book.renewed("b", "a", 1, 0, S),
        Some(Owed::GiveBack {
            bucket: "b".into(),
            owner: "a".into(),
            id: 1,
            units: 1
        })
    );
    assert_eq!(book.totals().units, 2);
    assert_eq!(
        book.renewed("b", "a", 99, 5, S),
        None,
        "another loan's answer"
    );
    assert_eq!(
        book.renewed("b", "z", 1, 5, S),
        None,
        "another owner's lease 1"
    );
}

#[test]
fn upkeep_renews_busy_loans_and_returns_idle_ones_whole() {
    let mut book = book();
    book.granted("busy", "a", 1, 2, 2, 10 * S);
    book.granted("idle", "a", 2, 2, 2, 10 * S);
    let _held = book.take("busy", "a", 0, S).unwrap();
    let put = book.take("idle", "a", 0, S).unwrap();
    book.put_back(&put);
    assert_eq!(
        book.upkeep(S + S / 4, IDLE_AFTER, 9 * S),
        vec![],
        "neither is due: both live past 9 s"
    );
    assert_eq!(
        book.upkeep(S + S / 2, IDLE_AFTER, u64::MAX).len(),
        2,
        "both renewed before the idle time"
    );
    let mut owed = book.upkeep(2 * S, IDLE_AFTER, u64::MAX);
    owed.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        owed,
        vec![
            Owed::GiveBack {
                bucket: "idle".into(),
                owner: "a".into(),
                id: 2,
                units: 2
            },
            Owed::Renew {
                bucket: "busy".into(),
                owner: "a".into(),
                id: 1,
            },
        ]
    );
    assert_eq!(book.totals().loans, 1);
}

#[test]
fn a_loan_gone_on_its_owner_lends_nothing_more_and_is_forgotten_once_put_back() {
    let mut book = book();
    book.granted("b", "a", 1, 2, 2, 10 * S);
    let unit = book.take("b", "a", 0, 0).unwrap();
    book.gone("b", "a", 1);
    assert!(book.take("b", "a", 0, 0).is_none());
    assert_eq!(
        book.upkeep(S, IDLE_AFTER, u64::MAX),
        vec![],
        "expired: not renewed"
    );
    assert_eq!(book.totals().loans, 1, "a unit is still in use");
    book.put_back(&unit);
    assert_eq!(book.upkeep(S, IDLE_AFTER, u64::MAX), vec![]);
    assert_eq!(book.totals().loans, 0);
}

#[test]
fn a_loan_the_owner_dropped_goes_on_under_its_new_id_with_its_units_in_use() {
    let mut book = book();
    book.granted("b", "a", 1, 2, 2, S);
    let old = book.take("b", "a", 0, 0).unwrap();
    let _old2 = book.take("b", "a", 0, 0).unwrap();
    // The owner had dropped lease 1 and lent a new one of 2 units.
    assert_eq!(book.granted("b", "a", 5, 2, 2, S), None);
    assert_eq!(book.loan_id("b", "a"), Some(5));
    assert!(
        book.take("b", "a", 0, 0).is_none(),
        "two units of the old lease are still out"
    );
    assert_eq!(
        book.put_back(&old),
        None,
        "an old unit counts as one of this loan"
    );
    assert!(book.take("b", "a", 0, 0).is_some());
    // Another owner's grant is a new loan; the old one is owed a release once unused.
    let mut book = LoanBook::new(8);
    book.granted("b", "a", 1, 2, 2, S);
    assert_eq!(
        book.granted("b", "c", 3, 1, 0, S),
        Some(Owed::GiveBack {
            bucket: "b".into(),
            owner: "a".into(),
            id: 1,
            units: 2
        })
    );
    assert_eq!(book.loan_id("b", "c"), Some(3));
}

#[test]
fn a_moved_loan_is_handed_over_with_its_units_in_use() {
    let mut book = book();
    book.granted("b", "a", 1, 4, 4, S);
    let unit = book.take("b", "a", 0, 0).unwrap();
    assert!(book.moving("b", "c"), "a unit in use, another owner now");
    assert!(!book.moving("b", "a"));
    assert_eq!(book.loan_of(&unit), Some(("a".to_owned(), 1)));
    let moved = book.moved(|_| Some("c".to_owned()));
    assert_eq!(moved.len(), 1);
    assert_eq!(
        (moved[0].from.clone(), moved[0].to.as_str(), moved[0].in_use),
        (("a".to_owned(), 1), "c", 1)
    );
    assert!(book.moved(|_| Some("a".to_owned())).is_empty());
    assert!(book.rehomed(&moved[0], 9));
    assert_eq!(book.loan_id("b", "c"), Some(9));
    assert_eq!(book.totals().units, 1, "only what was in use moved");
    assert_eq!(
        book.put_back(&unit),
        Some(Owed::GiveBack {
            bucket: "b".into(),
            owner: "c".into(),
            id: 9,
            units: 1
        }),
        "a moved loan keeps nothing idle until its new owner says so"
    );
    assert_eq!(book.totals().loans, 0, "a loan with no unit is forgotten");
}

#[test]
fn a_loan_with_idle_units_but_too_little_life_asks_to_be_renewed() {
    let mut book = book();
    book.granted("b", "a", 1, 2, 2, 3 * S);
    assert!(book.take("b", "a", 4 * S, 0).is_none(), "not 4 s left");
    assert_eq!(book.ask("b", "a", 4 * S), Ask::RenewLoan);
    assert_eq!(
        book.ask("b", "a", 3 * S).units(),
        1,
        "it lives long enough: grow"
    );
}
