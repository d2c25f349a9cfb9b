//! Gubernator's functional tests (`functional_test.go`), translated: the same requests, in the
//! same order, with the same expected answers. Where Gubernator's tests freeze and advance the
//! server's clock, these advance the time the table is asked at — exact, no sleeping.
//! The tests of its cluster (forwarding, GLOBAL's broadcast, peers' health) have no
//! counterpart on one node; `docs/gubernator.md` says what Weir does instead. The batch limit
//! and the wire (grpcio, curl) are tested from outside, against a running server
//! (`weir-cli`'s `tests/gubernator.rs`).

use super::buckets::Buckets;
use super::hit::Behaviors;
use super::wire::{Algorithm, RateLimitReq, RateLimitResp, Status};

const SECOND: i64 = 1000;
const UNDER: i32 = Status::UnderLimit as i32;
const OVER: i32 = Status::OverLimit as i32;
const TOKEN: i32 = Algorithm::TokenBucket as i32;
const LEAKY: i32 = Algorithm::LeakyBucket as i32;

/// A server whose clock the test moves: 2026-03-10T12:00:01Z, a second into a minute.
struct Server {
    buckets: Buckets,
    now: i64,
}

impl Server {
    fn new() -> Self {
        Server {
            buckets: Buckets::new(50_000),
            now: 1_773_144_001_000,
        }
    }

    fn ask(&self, request: RateLimitReq) -> RateLimitResp {
        self.buckets.answer(&request, self.now)
    }

    fn advance(&mut self, millis: i64) {
        self.now += millis;
    }
}

fn request(
    name: &str,
    key: &str,
    algorithm: i32,
    duration: i64,
    limit: i64,
    hits: i64,
) -> RateLimitReq {
    RateLimitReq {
        name: name.to_owned(),
        unique_key: key.to_owned(),
        algorithm,
        duration,
        limit,
        hits,
        ..RateLimitReq::default()
    }
}

/// One step of a table test: what to send, what to expect, how long to wait after.
struct Step {
    hits: i64,
    remaining: i64,
    status: i32,
    sleep: i64,
}

const fn step(hits: i64, remaining: i64, status: i32, sleep: i64) -> Step {
    Step {
        hits,
        remaining,
        status,
        sleep,
    }
}

#[test]
fn over_the_limit() {
    let server = Server::new();
    for (remaining, status) in [(1, UNDER), (0, UNDER), (0, OVER)] {
        let answer = server.ask(request(
            "test_over_limit",
            "account:1234",
            TOKEN,
            9 * SECOND,
            2,
            1,
        ));
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (status, remaining, 2)
        );
        assert_ne!(answer.reset_time, 0);
    }
}

#[test]
fn multiple_keys_in_one_batch() {
    let server = Server::new();
    let first = server.ask(request(
        "test_multiple_async",
        "account:9234",
        TOKEN,
        9 * SECOND,
        2,
        1,
    ));
    let second = server.ask(request(
        "test_multiple_async",
        "account:5678",
        TOKEN,
        9 * SECOND,
        10,
        5,
    ));
    assert_eq!((first.status, first.remaining, first.limit), (UNDER, 1, 2));
    assert_eq!(
        (second.status, second.remaining, second.limit),
        (UNDER, 5, 10)
    );
}

#[test]
fn token_bucket() {
    let mut server = Server::new();
    for (remaining, sleep) in [(1, 0), (0, 100), (1, 0)] {
        let answer = server.ask(request("test_token_bucket", "account:1234", TOKEN, 5, 2, 1));
        assert_eq!(answer.error, "");
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (UNDER, remaining, 2)
        );
        assert_ne!(answer.reset_time, 0);
        server.advance(sleep);
    }
}

#[test]
fn token_bucket_gregorian() {
    let mut server = Server::new();
    let steps = [
        step(1, 59, UNDER, 0),
        step(1, 58, UNDER, 0),
        step(58, 0, UNDER, 0),
        step(1, 0, OVER, 61 * SECOND),
        step(0, 60, UNDER, 0),
    ];
    for step in steps {
        let mut asked = request(
            "test_token_bucket_greg",
            "account:12345",
            TOKEN,
            0,
            60,
            step.hits,
        );
        asked.behavior = Behaviors::DURATION_IS_GREGORIAN;
        let answer = server.ask(asked);
        assert_eq!(answer.error, "");
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (step.status, step.remaining, 60)
        );
        assert_ne!(answer.reset_time, 0);
        server.advance(step.sleep);
    }
}

#[test]
fn token_bucket_negative_hits() {
    let server = Server::new();
    for (hits, remaining) in [(-1, 3), (-1, 4), (4, 0), (-1, 1)] {
        let answer = server.ask(request(
            "test_token_bucket_negative",
            "account:12345",
            TOKEN,
            5,
            2,
            hits,
        ));
        assert_eq!(answer.error, "");
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (UNDER, remaining, 2)
        );
        assert_ne!(answer.reset_time, 0);
    }
}

#[test]
fn drain_over_limit() {
    let server = Server::new();
    let steps = [
        step(0, 10, UNDER, 0),
        step(1, 9, UNDER, 0),
        step(100, 0, OVER, 0),
        step(0, 0, UNDER, 0),
    ];
    for (index, algorithm) in [TOKEN, LEAKY].into_iter().enumerate() {
        for step in &steps {
            let key = format!("account:1234:{index}");
            let mut asked = request(
                "test_drain_over_limit",
                &key,
                algorithm,
                30 * SECOND,
                10,
                step.hits,
            );
            asked.behavior = Behaviors::DRAIN_OVER_LIMIT;
            let answer = server.ask(asked);
            assert_eq!(
                (answer.status, answer.remaining, answer.limit),
                (step.status, step.remaining, 10)
            );
            assert_ne!(answer.reset_time, 0);
        }
    }
}

/// Both algorithms: a request for more than is left is refused and spends nothing.
fn more_than_available(algorithm: i32, name: &str) {
    let server = Server::new();
    for (status, remaining, hits) in [
        (UNDER, 1000, 1000),
        (OVER, 1000, 1500),
        (UNDER, 500, 500),
        (UNDER, 100, 400),
        (UNDER, 0, 100),
        (OVER, 0, 1),
    ] {
        let answer = server.ask(request(name, "account:123456", algorithm, 1000, 2000, hits));
        assert_eq!(answer.error, "");
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (status, remaining, 2000),
            "{hits} hits"
        );
    }
}

#[test]
fn token_bucket_request_more_than_available() {
    more_than_available(TOKEN, "test_token_more_than_available");
}

#[test]
fn leaky_bucket_request_more_than_available() {
    more_than_available(LEAKY, "test_leaky_more_than_available");
}

/// A leaky bucket's steps; `reset_time` is Gubernator's: now + (limit − remaining) × 3 s.
fn leaky_steps(name: &str, burst: i64, steps: &[Step]) {
    let mut server = Server::new();
    for (index, step) in steps.iter().enumerate() {
        let mut asked = request(name, "account:1234", LEAKY, 30 * SECOND, 10, step.hits);
        asked.burst = burst;
        let answer = server.ask(asked);
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (step.status, step.remaining, 10),
            "step {index}"
        );
        assert_eq!(
            answer.reset_time,
            server.now + (answer.limit - answer.remaining) * 3 * SECOND,
            "step {index}"
        );
        server.advance(step.sleep);
    }
}

#[test]
fn leaky_bucket() {
    leaky_steps(
        "test_leaky_bucket",
        0,
        &[
            step(1, 9, UNDER, SECOND),
            step(1, 8, UNDER, SECOND),
            step(1, 7, UNDER, 1500),
            step(0, 8, UNDER, 3 * SECOND),
            step(0, 9, UNDER, 0),
            step(9, 0, UNDER, 0),
            step(1, 0, OVER, 3 * SECOND),
            step(0, 1, UNDER, 60 * SECOND),
            step(0, 10, UNDER, 60 * SECOND),
            step(10, 0, UNDER, 29 * SECOND),
            step(9, 0, UNDER, 3 * SECOND),
            step(1, 0, UNDER, SECOND),
        ],
    );
}

#[test]
fn leaky_bucket_with_burst() {
    let steps = [
        step(1, 19, UNDER, SECOND),
        step(1, 18, UNDER, SECOND),
        step(1, 17, UNDER, 1500),
        step(0, 18, UNDER, 3 * SECOND),
        step(0, 19, UNDER, 0),
        step(19, 0, UNDER, 0),
        step(1, 0, OVER, 3 * SECOND),
        step(0, 1, UNDER, 60 * SECOND),
        step(0, 20, UNDER, SECOND),
    ];
    leaky_steps("test_leaky_bucket_with_burst", 20, &steps);
}

#[test]
fn leaky_bucket_gregorian() {
    let mut server = Server::new();
    let now = server.now;
    for step in [
        step(1, 59, UNDER, 500),
        step(1, 58, UNDER, 1200),
        step(1, 58, UNDER, 0),
    ] {
        let mut asked = request(
            "TestLeakyBucketGregorian",
            "x8kd02kdla",
            LEAKY,
            0,
            60,
            step.hits,
        );
        asked.behavior = Behaviors::DURATION_IS_GREGORIAN;
        let answer = server.ask(asked);
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (step.status, step.remaining, 60)
        );
        assert!(answer.reset_time > now / 1000);
        server.advance(step.sleep);
    }
}

#[test]
fn leaky_bucket_negative_hits() {
    let server = Server::new();
    for (hits, remaining) in [(1, 9), (-1, 10), (10, 0), (-1, 1)] {
        let answer = server.ask(request(
            "test_leaky_bucket_negative",
            "account:12345",
            LEAKY,
            30 * SECOND,
            10,
            hits,
        ));
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (UNDER, remaining, 10)
        );
        assert_eq!(
            answer.reset_time,
            server.now + (10 - remaining) * 3 * SECOND
        );
    }
}

#[test]
fn missing_fields() {
    let server = Server::new();
    let no_name = RateLimitReq {
        name: String::new(),
        ..request("", "account:1234", TOKEN, 10_000, 5, 1)
    };
    let no_key = request("test_missing_fields", "", TOKEN, 10_000, 5, 1);
    for (asked, error, status) in [
        (
            request("test_missing_fields", "account:1234", TOKEN, 0, 10, 1),
            "",
            UNDER,
        ),
        (
            request("test_missing_fields", "account:12345", TOKEN, 10_000, 0, 1),
            "",
            OVER,
        ),
        (no_name, "field 'namespace' cannot be empty", UNDER),
        (no_key, "field 'unique_key' cannot be empty", UNDER),
    ] {
        let answer = server.ask(asked);
        assert_eq!((answer.error.as_str(), answer.status), (error, status));
    }
}

#[test]
fn change_limit() {
    let server = Server::new();
    for (algorithm, remaining, limit) in [
        (TOKEN, 99, 100),
        (TOKEN, 98, 100),
        (TOKEN, 7, 10),
        (TOKEN, 6, 10),
        (TOKEN, 195, 200),
        (LEAKY, 99, 100),
        (LEAKY, 9, 10),
        (LEAKY, 8, 10),
    ] {
        let answer = server.ask(request(
            "test_change_limit",
            "account:1234",
            algorithm,
            9000,
            limit,
            1,
        ));
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (UNDER, remaining, limit)
        );
        assert_ne!(answer.reset_time, 0);
    }
}

#[test]
fn reset_remaining() {
    let server = Server::new();
    for (behavior, remaining) in [(0, 99), (0, 98), (Behaviors::RESET_REMAINING, 100), (0, 99)] {
        let mut asked = request("test_reset_remaining", "account:1234", TOKEN, 9000, 100, 1);
        asked.behavior = behavior;
        let answer = server.ask(asked);
        assert_eq!(
            (answer.status, answer.remaining, answer.limit),
            (UNDER, remaining, 100)
        );
    }
}

#[test]
fn leaky_bucket_div_bug() {
    let server = Server::new();
    let first = server.ask(request(
        "TestLeakyBucketDivBug",
        "q0s9d8f7g6",
        LEAKY,
        1000,
        2000,
        1,
    ));
    assert_eq!(
        (
            first.error.as_str(),
            first.status,
            first.remaining,
            first.limit
        ),
        ("", UNDER, 1999, 2000)
    );
    // A rate of half a millisecond a hit.
    let second = server.ask(request(
        "TestLeakyBucketDivBug",
        "q0s9d8f7g6",
        LEAKY,
        1000,
        2000,
        100,
    ));
    assert_eq!((second.remaining, second.limit), (1899, 2000));
}

// Beyond Gubernator's own tests: what its docs promise and the tests above do not reach.

#[test]
fn created_at_stands_for_the_clock() {
    let server = Server::new();
    let mut asked = request("created_at", "k", TOKEN, 10 * SECOND, 1, 1);
    asked.created_at = Some(server.now);
    assert_eq!(server.ask(asked.clone()).status, UNDER);
    assert_eq!(server.ask(asked.clone()).status, OVER);
    // The client says ten seconds and a millisecond have passed: a new bucket, whatever the
    // server's clock says.
    asked.created_at = Some(server.now + 10 * SECOND + 1);
    let answer = server.ask(asked);
    assert_eq!((answer.status, answer.remaining), (UNDER, 0));
    assert_eq!(answer.reset_time, server.now + 20 * SECOND + 1);
}

#[test]
fn token_bucket_reset_time_is_the_end_of_its_duration() {
    let server = Server::new();
    let answer = server.ask(request("reset_time", "k", TOKEN, 9 * SECOND, 2, 1));
    assert_eq!(answer.reset_time, server.now + 9 * SECOND);
}

#[test]
fn gregorian_ends_and_refusals() {
    let server = Server::new();
    let mut asked = request("gregorian", "k", TOKEN, 1, 10, 1);
    asked.behavior = Behaviors::DURATION_IS_GREGORIAN;
    // 12:00:01 → the hour ends at 12:59:59.999.
    assert_eq!(
        server.ask(asked.clone()).reset_time,
        server.now - SECOND + 3600 * SECOND - 1
    );
    asked.duration = 3;
    asked.unique_key = "weeks".to_owned();
    assert!(server.ask(asked.clone()).error.contains("GregorianWeeks"));
    asked.duration = 9;
    asked.unique_key = "nine".to_owned();
    assert!(
        server
            .ask(asked)
            .error
            .contains("not a valid gregorian interval")
    );
}

#[test]
fn an_unknown_algorithm_is_an_error_of_its_item() {
    let server = Server::new();
    let answer = server.ask(request("algorithm", "k", 7, SECOND, 1, 1));
    assert!(
        answer.error.contains("Invalid rate limit algorithm '7'"),
        "{}",
        answer.error
    );
}

#[test]
fn another_algorithm_starts_the_key_again() {
    let server = Server::new();
    assert_eq!(
        server
            .ask(request("switch", "k", TOKEN, SECOND, 5, 5))
            .remaining,
        0
    );
    let leaky = server.ask(request("switch", "k", LEAKY, SECOND, 5, 1));
    assert_eq!((leaky.status, leaky.remaining), (UNDER, 4));
}

#[test]
fn a_full_table_drops_ended_buckets_first() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut server = Server::new();
    // One bucket a shard: from the second key a shard meets, it is full.
    server.buckets = Buckets::new(1);
    for key in 0..200 {
        server.ask(request("full", &key.to_string(), TOKEN, SECOND, 1, 1));
    }
    // None had ended: every key that found its shard full pushed out a live one.
    let kept = server.buckets.len();
    let evicted = server.buckets.counts.evicted.load(Relaxed);
    assert!(kept <= 64);
    assert_eq!(evicted as usize, 200 - kept);
    // Once they have ended, a new key takes an ended bucket's place: nothing live is lost.
    server.advance(2 * SECOND);
    let answer = server.ask(request("full", "new", TOKEN, SECOND, 1, 1));
    assert_eq!(answer.status, UNDER);
    assert_eq!(server.buckets.counts.evicted.load(Relaxed), evicted);
}
