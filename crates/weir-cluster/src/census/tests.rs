use super::*;

const S: Nanos = 1_000_000_000;
const WINDOW: Duration = Duration::from_secs(10);

fn live(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

fn quiet(awake_s: u64, unclean_s: Option<u64>) -> Quiet {
    Quiet {
        awake: Duration::from_secs(awake_s),
        unclean_departure: unclean_s.map(Duration::from_secs),
        first_run: false,
    }
}

/// The same, from a node on its first run.
fn first(awake_s: u64) -> Quiet {
    Quiet {
        first_run: true,
        ..quiet(awake_s, None)
    }
}

#[test]
fn settled_once_every_live_member_answered_on_the_same_ring() {
    let mut census = Census::new();
    census.expect(7, live(&["a", "b", "c"]));
    let own = quiet(100, None);
    assert_eq!(census.missing(7, "a"), live(&["b", "c"]));
    assert!(!census.settled("a", 7, own, WINDOW));
    assert!(census.answer("b", 7, quiet(100, None)));
    assert!(!census.settled("a", 7, own, WINDOW), "c has not answered");
    // An answer on another ring counts for nothing.
    assert!(!census.answer("c", 8, quiet(100, None)));
    assert!(!census.settled("a", 7, own, WINDOW));
    assert!(!census.answered_all("a", 7));
    assert!(census.answer("c", 7, quiet(1, None)));
    assert!(census.answered_all("a", 7));
    assert!(census.settled("a", 7, own, WINDOW));
    // A ring this census does not count is not settled.
    assert!(!census.settled("a", 8, own, WINDOW));
}

#[test]
fn a_new_ring_starts_the_count_over_and_the_same_ring_keeps_it() {
    let mut census = Census::new();
    census.expect(7, live(&["a", "b"]));
    census.answer("b", 7, quiet(100, None));
    // A member that stepped down and left: the same ring, one member fewer.
    census.expect(7, live(&["a"]));
    assert!(census.settled("a", 7, quiet(100, None), WINDOW));
    census.expect(7, live(&["a", "b"]));
    assert!(census.settled("a", 7, quiet(100, None), WINDOW));
    census.expect(9, live(&["a", "b"]));
    assert_eq!(census.missing(9, "a"), live(&["b"]));
    assert!(!census.settled("a", 9, quiet(100, None), WINDOW));
}

#[test]
fn an_unclean_departure_within_the_window_anywhere_leaves_it_to_the_tenure() {
    let mut census = Census::new();
    census.expect(7, live(&["a", "b", "c"]));
    census.answer("b", 7, quiet(100, Some(3)));
    census.answer("c", 7, quiet(100, None));
    assert!(
        !census.settled("a", 7, quiet(100, None), WINDOW),
        "b saw a crash 3 s ago"
    );
    // Answered once per ring: b's next answer counts on the next ring.
    assert!(!census.answer("b", 7, quiet(100, Some(10))));
    census.expect(8, live(&["a", "b", "c"]));
    census.answer("b", 8, quiet(100, Some(10)));
    census.answer("c", 8, quiet(100, None));
    assert!(census.settled("a", 8, quiet(100, None), WINDOW));
    // Seen here.
    census.departed(false, 50 * S);
    let own = census.quiet(0, 55 * S);
    assert_eq!(own, quiet(55, Some(5)));
    assert!(!census.settled("a", 8, own, WINDOW));
    assert!(census.settled("a", 8, census.quiet(0, 60 * S), WINDOW));
}

#[test]
fn a_member_that_stepped_down_first_departs_cleanly() {
    let mut census = Census::new();
    census.departed(true, 50 * S);
    assert_eq!(census.quiet(0, 51 * S), quiet(51, None));
}

#[test]
fn someone_must_have_watched_the_whole_window() {
    let mut census = Census::new();
    census.expect(7, live(&["a", "b"]));
    census.answer("b", 7, quiet(4, None));
    // A cluster restarted: nobody has been awake for a window.
    assert!(!census.settled("a", 7, quiet(4, None), WINDOW));
    // A restarted node among members that have run all along.
    assert!(census.settled("a", 7, quiet(10, None), WINDOW));
    census.expect(8, live(&["a", "b"]));
    census.answer("b", 8, quiet(40, None));
    assert!(census.settled("a", 8, quiet(1, None), WINDOW));
}

#[test]
fn a_cluster_on_its_first_run_needs_no_watched_window() {
    let mut census = Census::new();
    census.expect(7, live(&["a", "b", "c"]));
    census.answer("b", 7, first(1));
    census.answer("c", 7, first(1));
    // Deployed for the first time: no lease can predate any of them.
    assert!(census.settled("a", 7, first(1), WINDOW));
    // One of them ran before (its clients may still hold what it granted): the window must
    // have been watched.
    assert!(!census.settled("a", 7, quiet(1, None), WINDOW));
    census.expect(8, live(&["a", "b", "c"]));
    census.answer("b", 8, first(1));
    census.answer("c", 8, quiet(1, None));
    assert!(!census.settled("a", 8, first(1), WINDOW));
    // An unclean departure seen by a first-run node still counts.
    census.expect(9, live(&["a", "b"]));
    census.answer(
        "b",
        9,
        Quiet {
            unclean_departure: Some(Duration::from_secs(2)),
            ..first(3)
        },
    );
    assert!(!census.settled("a", 9, first(3), WINDOW));
    // What a node says of itself.
    let mut census = Census::new();
    census.first_run();
    assert_eq!(census.quiet(0, 5 * S), first(5));
}

#[test]
fn a_departure_seen_before_a_pause_is_still_reported() {
    let mut census = Census::new();
    census.departed(false, 15 * S);
    // Paused from 16 s to 20 s: awake since 20 s, and the crash it saw 7 s ago still counts.
    assert_eq!(census.quiet(20 * S, 22 * S), quiet(2, Some(7)));
}
