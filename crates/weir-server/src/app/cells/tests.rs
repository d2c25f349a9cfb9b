//! The unit tests of `cells.rs`.

use std::collections::HashMap;

use super::*;

fn call(max_burst: i64, count: i64, period: i64, quantity: i64) -> Throttle {
    Throttle {
        max_burst,
        count,
        period,
        quantity,
    }
}

fn reply(v: Verdict) -> [i64; 5] {
    [
        i64::from(v.limited),
        v.limit,
        v.remaining,
        v.retry_after,
        v.reset_after,
    ]
}

#[test]
fn the_documented_example_replies_as_redis_cell_does() {
    let cells = Cells::new(100);
    let verdict = cells.throttle(b"user123", &call(15, 30, 60, 1), 0).unwrap();
    assert_eq!(reply(verdict), [0, 16, 15, -1, 2]);
}

#[test]
fn a_burst_of_one_a_period_is_limited_then_let_through_again() {
    // redis-cell's end-to-end example: `CL.THROTTLE user123 0 1 2 1`.
    let cells = Cells::new(100);
    let key = b"user123";
    let every_two_seconds = call(0, 1, 2, 1);
    assert_eq!(
        reply(cells.throttle(key, &every_two_seconds, 0).unwrap()),
        [0, 1, 0, -1, 2]
    );
    assert_eq!(
        reply(
            cells
                .throttle(key, &every_two_seconds, SECOND / 10)
                .unwrap()
        ),
        [1, 1, 0, 2, 2]
    );
    assert_eq!(
        reply(cells.throttle(key, &every_two_seconds, 2 * SECOND).unwrap()),
        [0, 1, 0, -1, 2]
    );
}

#[test]
fn one_a_second_with_a_burst_of_five_counts_down_and_refuses_the_sixth() {
    let cells = Cells::new(100);
    let five = call(4, 1, 1, 1);
    for remaining in (0..5).rev() {
        let v = cells.throttle(b"k", &five, 0).unwrap();
        assert_eq!((v.limited, v.remaining), (false, remaining));
    }
    let refused = cells.throttle(b"k", &five, 0).unwrap();
    assert_eq!(reply(refused), [1, 5, 0, 1, 5]);
    // Half a second later none has come back; a second later one has.
    assert!(cells.throttle(b"k", &five, SECOND / 2).unwrap().limited);
    let v = cells.throttle(b"k", &five, SECOND).unwrap();
    assert_eq!((v.limited, v.remaining), (false, 0));
    // The counts are what a scrape shows.
    assert_eq!(cells.counts(), (6, 2));
}

#[test]
fn a_look_takes_nothing_and_more_than_the_limit_never_goes() {
    let cells = Cells::new(100);
    assert_eq!(
        reply(cells.throttle(b"k", &call(4, 1, 1, 0), 0).unwrap()),
        [0, 5, 5, -1, 0]
    );
    assert_eq!(
        reply(cells.throttle(b"k", &call(4, 1, 1, 6), 0).unwrap()),
        [1, 5, 5, -1, 0]
    );
    assert_eq!(cells.len(), 0, "neither left anything to keep");
}

#[test]
fn a_refused_key_is_shown_as_throttled_with_its_rate() {
    let cells = Cells::new(100);
    let one_a_second = call(0, 1, 1, 1);
    cells.throttle(b"noisy", &one_a_second, 0).unwrap();
    assert!(cells.throttle(b"noisy", &one_a_second, 1).unwrap().limited);
    cells.throttle(b"quiet", &one_a_second, 0).unwrap();
    let rows = cells.throttled_rows(2, 10);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            rows[0].policy.as_str(),
            rows[0].key.as_str(),
            rows[0].qps_limit
        ),
        (CELLS_POLICY, "noisy", Some(1.0))
    );
}

#[test]
fn a_quantity_no_clock_can_hold_is_refused_not_admitted() {
    let cells = Cells::new(100);
    // A tolerance near the clock's end, asked for everything: the sum does not fit, and
    // the call is refused as one that never could go.
    let huge = call(9_223_300_000_000_000_000, 1_000_000_000, 1, i64::MAX);
    let v = cells.throttle(b"k", &huge, 72_000 * SECOND).unwrap();
    assert_eq!((v.limited, v.retry_after), (true, -1));
    assert_eq!(cells.len(), 0);
}

#[test]
fn keys_are_bytes() {
    let cells = Cells::new(100);
    let once = call(0, 1, 60, 1);
    assert!(!cells.throttle(b"\xff", &once, 0).unwrap().limited);
    // Another key whose bytes are not UTF-8 either is another bucket.
    assert!(!cells.throttle(b"\xfe", &once, 0).unwrap().limited);
    assert!(cells.throttle(b"\xff", &once, 0).unwrap().limited);
}

#[test]
fn seconds_round_up_at_millisecond_resolution() {
    assert_eq!(seconds(2 * SECOND + 400_000), 2);
    assert_eq!(seconds(2 * SECOND + MILLI), 3);
    assert_eq!(seconds(0), 0);
    assert_eq!(seconds(-5), 0);
}

#[test]
fn bad_numbers_are_refused_by_name() {
    let cells = Cells::new(100);
    for (throttle, text) in [
        (call(-1, 1, 1, 1), "max_burst must be 0 or more, got -1"),
        (call(1, 0, 1, 1), "count must be 1 or more, got 0"),
        (
            call(1, 1, -60, 1),
            "period must be 1 or more seconds, got -60",
        ),
        (call(1, 1, 1, -2), "quantity must be 0 or more, got -2"),
        (
            call(1, 1, i64::MAX, 1),
            "the bucket's tolerance, period / count × (max_burst + 1), does not fit in 292 years of nanoseconds",
        ),
        (
            call(i64::MAX - 1, 1, 1, 1),
            "the bucket's tolerance, period / count × (max_burst + 1), does not fit in 292 years of nanoseconds",
        ),
        (
            call(i64::MAX, 1_000_000_000, 1, 1),
            "the bucket's tolerance, period / count × (max_burst + 1), does not fit in 292 years of nanoseconds",
        ),
    ] {
        assert_eq!(
            cells.throttle(b"k", &throttle, 0).unwrap_err().to_string(),
            text
        );
    }
}

#[test]
fn new_parameters_reshape_a_key_keeping_its_fill() {
    let cells = Cells::new(100);
    // 10 a second, burst 10: spend 6, 4 left.
    for _ in 0..6 {
        cells.throttle(b"k", &call(9, 10, 1, 1), 0).unwrap();
    }
    // Now 20 a second, burst 20: still 4 left (3 after this one), not 20.
    let v = cells.throttle(b"k", &call(19, 20, 1, 1), 0).unwrap();
    assert_eq!((v.limited, v.limit, v.remaining), (false, 20, 3));
}

#[test]
fn a_refusal_on_an_idle_key_reports_no_more_than_the_limit() {
    // redis-cell's numbers: `0 1 1`, then 2.5 s later `0 1 1 5` (more than the limit).
    let cells = Cells::new(100);
    cells.throttle(b"k", &call(0, 1, 1, 1), 0).unwrap();
    let v = cells
        .throttle(b"k", &call(0, 1, 1, 5), 2_500 * MILLI)
        .unwrap();
    assert_eq!(
        (
            v.limited,
            v.limit,
            v.remaining,
            v.retry_after,
            v.reset_after
        ),
        (true, 1, 1, -1, 0)
    );
}

#[test]
fn a_key_whole_again_asked_in_a_new_shape_is_a_new_key() {
    // `0 1 1`, then 1.5 s later (whole again) `9 1 1`: as a new key of that shape, and as
    // redis-cell answers (its key has expired).
    let cells = Cells::new(100);
    cells.throttle(b"k", &call(0, 1, 1, 1), 0).unwrap();
    let v = cells
        .throttle(b"k", &call(9, 1, 1, 1), 1_500 * MILLI)
        .unwrap();
    let fresh = Cells::new(100)
        .throttle(b"k", &call(9, 1, 1, 1), 1_500 * MILLI)
        .unwrap();
    assert_eq!(v, fresh);
    assert_eq!(
        (
            v.limited,
            v.limit,
            v.remaining,
            v.retry_after,
            v.reset_after
        ),
        (false, 10, 9, -1, 1)
    );
}

#[test]
fn at_the_cap_whole_keys_make_room_and_newcomers_are_sketched_not_refused() {
    let cells = Cells::new(SHARDS);
    let slow = call(0, 1, 60, 1);
    // One key per shard at most: fill until a key is decided in the sketch.
    let mut n = 0;
    while cells.sketch_counts().0 == 0 {
        assert!(
            !cells
                .throttle(format!("k{n}").as_bytes(), &slow, 0)
                .unwrap()
                .limited
        );
        n += 1;
    }
    assert!(cells.len() <= SHARDS);
    // The key counted in the sketch was admitted once, and is held to its own limit of one
    // a minute there: its second call is refused with the right wait.
    let newcomer = format!("k{}", n - 1);
    let again = cells.throttle(newcomer.as_bytes(), &slow, SECOND).unwrap();
    assert!(again.limited);
    assert_eq!(again.retry_after, 59);
    // Other newcomers past the cap are still let in (their words are their own here).
    let mut admitted = 0;
    for m in 0..20 {
        let verdict = cells
            .throttle(format!("new{m}").as_bytes(), &slow, SECOND)
            .unwrap();
        admitted += u32::from(!verdict.limited);
    }
    assert!(admitted >= 15, "{admitted} of 20 newcomers admitted");
    // A minute later every key is whole again: a new key is kept exactly.
    let before = cells.sketch_counts().0;
    assert!(
        !cells
            .throttle(b"later", &slow, 61 * SECOND)
            .unwrap()
            .limited
    );
    assert_eq!(cells.sketch_counts().0, before);
}

#[test]
fn the_sketch_never_admits_a_key_more_than_its_own_bucket_would() {
    // A full map, then keys past it asked at random. Each key's admissions are replayed on
    // an exact bucket of its own: every request the sketch admits, that bucket — having
    // admitted the same ones before — admits too, so no key gets past its own limit.
    let cells = Cells::new(SHARDS);
    let hour = call(2, 3, 3600, 1);
    for n in 0..SHARDS * 4 {
        let _ = cells.throttle(format!("filler{n}").as_bytes(), &hour, 0);
    }
    let mut exact: HashMap<String, i64> = HashMap::new();
    let (interval, tolerance) = shape(&hour).unwrap();
    let mut state = 7u64;
    for step in 0..5000i64 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = format!("user{}", (state >> 33) % 300);
        let now = step * 50 * MILLI;
        let sketched = cells.throttle(key.as_bytes(), &hour, now).unwrap();
        let tat = exact.get(&key).copied().unwrap_or(now);
        let (own, kept) = decide(&hour, interval, tolerance, tat, now);
        if !sketched.limited {
            exact.insert(key.clone(), kept);
        }
        assert!(
            sketched.limited || !own.limited,
            "{key} admitted by the sketch at {now} where its own bucket refused"
        );
    }
    assert!(cells.sketch_counts().0 > 0);
}
