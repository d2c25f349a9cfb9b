//! Policies end to end: config parsing and validation, keyed buckets with bounded memory,
//! kinds and overrides, monitor mode, multi-policy rollback, live reconfiguration, stats and
//! "who is throttled". Every test runs on a manual or paused clock.

use std::sync::Arc;
use std::time::Duration;

use weir::keyed::{KeyedLimiter, KeyedRefusal, Overflow, Shape};
use weir::policy::{Policy, PolicyConfig, PolicySet, RejectReason, Request};
use weir::{ManualClock, TokioClock};

const MS: u64 = 1_000_000;

fn policy(toml_text: &str) -> PolicyConfig {
    toml::from_str(toml_text).unwrap_or_else(|e| panic!("bad test config: {e}"))
}

fn on(clock: &ManualClock, toml_text: &str) -> Policy<ManualClock> {
    Policy::with_cores(policy(toml_text), clock.clone(), 4).expect("valid policy")
}

#[test]
fn the_design_examples_parse_from_toml_and_json() {
    #[derive(serde::Deserialize)]
    struct File {
        policy: Vec<PolicyConfig>,
    }
    let file: File = toml::from_str(
        r#"
        [[policy]]
        name = "getpage"
        kinds = ["PageRequestHandler"]
        mode = "enforce"
        on_exhausted = "wait"
        max_wait = "5s"
        max_keys = 100000
        leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 500, max = 5000, fair = true }

        [[policy]]
        name = "ms-host"
        token_bucket = { rate = 100, burst = 100, per_core = true, overrides = { prepare_rowset = 50, list_snapshots = 0 } }

        [[policy]]
        name = "tables"
        strict = { qps = 10 }

        [[policy]]
        name = "search"
        on_exhausted = "reject"
        concurrency = { node_limit = 10, shared_limit = 20, lease_ttl = "30s", on_unavailable = "open" }
        "#,
    )
    .unwrap();
    let set = PolicySet::with_cores(file.policy, ManualClock::new(0), 2).unwrap();
    let names: Vec<_> = set.policies().iter().map(|p| p.name().to_owned()).collect();
    assert_eq!(names, vec!["getpage", "ms-host", "search", "tables"]);
    let ms_host = set.get("ms-host").unwrap();
    assert_eq!(ms_host.limit(), Some(200.0), "100 per core on 2 cores");
    assert_eq!(ms_host.limit_for(Some("prepare_rowset")), Some(100.0));
    assert_eq!(
        ms_host.limit_for(Some("list_snapshots")),
        None,
        "0 = unlimited"
    );

    // The same policy as the JSON body of `PUT /v1/policies/getpage` (name from the URL).
    let json: PolicyConfig = serde_json::from_str(
        r#"{"kinds":["PageRequestHandler"],"on_exhausted":"wait","max_wait":"5s",
            "leaky_bucket":{"initial":0,"refill_interval":"100ms","refill_amount":500,"max":5000}}"#,
    )
    .unwrap();
    let getpage = set.get("getpage").unwrap().config();
    assert_eq!(
        PolicyConfig {
            name: "getpage".into(),
            ..json
        },
        getpage
    );
    // And back: what the API would return parses to the same thing.
    let round_trip: PolicyConfig =
        serde_json::from_str(&serde_json::to_string(&getpage).unwrap()).unwrap();
    assert_eq!(round_trip, getpage);
}

#[test]
fn an_adaptive_policy_shows_only_the_fields_it_honours() {
    let json = serde_json::to_value(policy("name = \"p\"\nadaptive = {}")).unwrap();
    let adaptive = json["adaptive"].as_object().unwrap();
    assert!(!adaptive.contains_key("enabled"), "{json}");
    assert!(!adaptive.contains_key("dry_run"), "{json}");
    assert_eq!(adaptive["top_k"], 2, "{json}");
}

#[test]
fn validation_names_the_policy_and_the_field() {
    let cases = [
        (
            r#"
            name = "p"
            adaptive = { enabled = true }"#,
            "policy `p`: `adaptive.enabled` is not a policy field: an adaptive policy's controller is always on (delete the policy to turn it off)",
        ),
        (
            r#"
            name = "p"
            adaptive = { dry_run = true }"#,
            "policy `p`: `adaptive.dry_run` is not a policy field: set the policy's mode = \"monitor\" for a dry run",
        ),
        (
            r#"
            name = "p"
            token_bucket = { rate = 0 }"#,
            "policy `p`: `token_bucket.rate` must be a finite number greater than zero, got 0",
        ),
        (
            r#"
            name = "p"
            leaky_bucket = { initial = 9, refill_interval = "1s", refill_amount = 1, max = 5 }"#,
            "policy `p`: `leaky_bucket.initial` (9) must not exceed `max` (5)",
        ),
        (
            r#"
            name = "p"
            leaky_bucket = { refill_interval = "0s", refill_amount = 1, max = 5 }"#,
            "policy `p`: `leaky_bucket.refill_interval` must be greater than zero",
        ),
        (
            r#"
            name = "p"
            strict = { qps = 5, overrides = { scan = -2 } }"#,
            "policy `p`: `strict.overrides.scan` must be -1 (default), 0 (unlimited) or > 0, got -2",
        ),
        (
            r#"
            name = "p"
            max_keys = 0
            strict = { qps = 5 }"#,
            "policy `p`: `max_keys` must be at least 1",
        ),
        (
            r#"
            name = "p"
            concurrency = { node_limit = 1, shared_limit = 4, max_loan = 0 }"#,
            "policy `p`: `concurrency.max_loan` must be at least 1 (1: no loans, every shared admission asks the owner)",
        ),
        (
            r#"
            name = "p"
            concurrency = { node_limit = 1, lease_ttl = "2s", learning_period = "3s" }"#,
            "policy `p`: `concurrency.learning_period` must not exceed lease_ttl (2s): to wait until every lease granted before has expired, use on_unavailable = \"closed\"",
        ),
        (
            r#"
            name = "p"
            learning_period = "5s"
            token_bucket = { rate = 5 }"#,
            "policy `p`: `learning_period` is for cluster-scoped rate policies (scope = \"cluster\"); a concurrency policy's shared pool has `concurrency.learning_period`",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(policy(text).validate().unwrap_err().to_string(), expected);
    }
    // A policy holds exactly one limiter: none, or two, does not even parse.
    let structural = [
        (
            r#"name = "p""#,
            // ...and on through every window limiter's table, then concurrency and adaptive.
            "policy `p`: `limiter` is missing: give exactly one of token_bucket, leaky_bucket, strict, fixed_window",
        ),
        (
            r#"
            name = "p"
            strict = { qps = 1 }
            token_bucket = { rate = 1 }"#,
            "policy `p`: `limiter` is ambiguous: give exactly one limiter table, not token_bucket and strict",
        ),
        // A count's override is a whole number: its type says so, so it does not parse.
        (
            r#"
            name = "p"
            fixed_window = { limit = 10, window = "1s", overrides = { scan = 2.5 } }"#,
            "must be -1 (default), 0 (unlimited) or a whole number above 0, got 2.5",
        ),
    ];
    for (text, expected) in structural {
        let error = toml::from_str::<PolicyConfig>(text)
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{error}");
        let json = serde_json::to_string(&toml::from_str::<toml::Value>(text).unwrap()).unwrap();
        let error = serde_json::from_str::<PolicyConfig>(&json)
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{error}");
    }
    let hostile = PolicyConfig {
        name: "a\u{1b}[2J".to_owned(),
        ..policy("name = \"p\"\nkinds = [\"x\\n\"]\nstrict = { qps = 1 }")
    };
    let problems: Vec<String> = hostile.problems().iter().map(|p| p.to_string()).collect();
    assert_eq!(
        problems,
        [
            "policy `a\\u{1b}[2J`: `name` must not contain control characters",
            "policy `a\\u{1b}[2J`: `kinds` must not contain control characters"
        ]
    );
    // Unknown fields are errors too, not silently ignored.
    let unknown = toml::from_str::<PolicyConfig>("name = \"p\"\nrate_limit = 5").unwrap_err();
    assert!(unknown.to_string().contains("rate_limit"), "{unknown}");
    // A set reports every problem at once, duplicates included.
    let problems = PolicySet::with_cores(
        vec![
            policy("name = \"a\"\nstrict = { qps = 0 }"),
            policy("name = \"b\"\nstrict = { qps = 1 }"),
            policy("name = \"b\"\nstrict = { qps = 2 }"),
        ],
        ManualClock::new(0),
        1,
    )
    .unwrap_err();
    let messages: Vec<_> = problems.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[0].starts_with("policy `a`: `strict.qps`"));
    assert_eq!(
        messages[1],
        "policy `b`: `name` is used by more than one policy"
    );
}

/// A number too small or too large to represent is refused by name wherever a limit can be set:
/// the limiter table, a per-kind override, the adaptive floor, and per-core scaling. Before,
/// the arithmetic saturated and such a policy admitted everything.
#[test]
fn unrepresentable_limits_are_refused_where_they_are_set() {
    let cases = [
        (
            "token_bucket = { rate = 1e-12, burst = 1 }",
            "`token_bucket.rate` must be at least",
        ),
        (
            "token_bucket = { rate = 1e-9, burst = 20 }",
            "`token_bucket.burst` is too large for the rate",
        ),
        (
            "token_bucket = { rate = 0.001, burst = 100000000 }",
            "`token_bucket.burst` is too large for the rate",
        ),
        (
            "token_bucket = { rate = 100, burst = 100, overrides = { scan = 1e-12 } }",
            "`token_bucket.overrides.scan` must be at least",
        ),
        ("strict = { qps = 1e-12 }", "`strict.qps` must be at least"),
        (
            "leaky_bucket = { refill_interval = \"1000000000s\", refill_amount = 1, max = 2 }",
            "`leaky_bucket.max` is too large for the rate",
        ),
        (
            "adaptive = { top_k = 1, ratio = 0.5, floor = 1e-12 }",
            "`adaptive.floor`",
        ),
    ];
    for (table, expected) in cases {
        let config = policy(&format!("name = \"p\"\n{table}"));
        let problem = config.validate().unwrap_err().to_string();
        assert!(problem.contains(expected), "{table}: {problem}");
        assert!(
            Policy::with_cores(config, ManualClock::new(0), 1).is_err(),
            "{table} must not build"
        );
    }
    // Per-core scaling past 10⁹ per second is refused when the policy is built for the cores.
    let fast = policy("name = \"p\"\ntoken_bucket = { rate = 6e8, per_core = true }");
    assert!(fast.validate().is_ok());
    let Err(err) = Policy::with_cores(fast, ManualClock::new(0), 2) else {
        panic!("2 × 6e8 per second cannot be spaced in nanoseconds")
    };
    let err = err.to_string();
    assert!(err.contains("`token_bucket.rate` must be at most"), "{err}");
}

#[test]
fn keys_get_buckets_of_their_own() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"t\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 1, burst = 2 }",
    );
    for tenant in ["a", "b", "c"] {
        assert!(p.try_acquire(&Request::new(tenant)).is_ok());
        assert!(p.try_acquire(&Request::new(tenant)).is_ok());
        let refused = p.try_acquire(&Request::new(tenant)).unwrap_err();
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
    }
    let stats = p.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.keys), (6, 3, 3));
}

/// A cost above the bucket's capacity can never be admitted without waiting: the refusal says
/// so, instead of "concurrency limit reached" with no time to come back.
#[test]
fn a_cost_above_the_burst_is_refused_as_one_that_never_fits() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"t\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 10, burst = 5 }",
    );
    let refused = p.try_acquire(&Request::new("k").cost(6)).unwrap_err();
    assert_eq!(
        refused.reason,
        RejectReason::ExceedsCapacity {
            cost: 6,
            capacity: 5
        }
    );
    assert_eq!(refused.retry_after(), None);
    let text = refused.to_string();
    assert!(
        text.contains("exceeds the bucket's capacity of 5"),
        "{text}"
    );
    assert!(!text.contains("concurrency"), "{text}");
    assert!(
        p.try_acquire(&Request::new("k").cost(5)).is_ok(),
        "a full bucket's worth fits"
    );
}

#[test]
fn kinds_select_requests_and_others_pass_uncounted() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"getpage\"\nkinds = [\"PageRequestHandler\"]\ntoken_bucket = { rate = 1, burst = 1 }",
    );
    let page = Request::new("tenant").kind("PageRequestHandler");
    let compaction = Request::new("tenant").kind("Compaction");
    assert!(p.try_acquire(&page).is_ok());
    assert!(p.try_acquire(&page).is_err());
    for _ in 0..10 {
        let admitted = p.try_acquire(&compaction).unwrap();
        assert!(!admitted.applied());
    }
    assert!(!p.try_acquire(&Request::new("tenant")).unwrap().applied());
    assert_eq!(p.stats().started, 2, "only the listed kind is accounted");
}

#[test]
fn overrides_default_unlimited_own_and_per_core() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        r#"
        name = "ms-host"
        on_exhausted = "reject"
        token_bucket = { rate = 2, burst = 2, per_core = true, overrides = { get_tablet = -1, list_snapshots = 0, prepare_rowset = 1 } }
        "#,
    );
    // 4 cores: default 8/s with a burst of 8.
    let admitted = |kind: &str, n: usize| {
        (0..n)
            .filter(|_| p.try_acquire(&Request::new(kind).kind(kind)).is_ok())
            .count()
    };
    assert_eq!(admitted("get_tablet", 20), 8, "-1: the default");
    assert_eq!(admitted("commit_rowset", 20), 8, "no override: the default");
    assert_eq!(admitted("list_snapshots", 1000), 1000, "0: unlimited");
    // 1 per core → 4/s, burst scaled alike to 4.
    assert_eq!(admitted("prepare_rowset", 20), 4);
    assert_eq!(p.limit_for(Some("prepare_rowset")), Some(4.0));
    let stats = p.stats();
    assert_eq!(stats.started, 20 + 20 + 1000 + 20);
    assert_eq!(stats.admitted, 8 + 8 + 1000 + 4);
}

#[test]
fn monitor_mode_admits_everything_and_counts_what_it_would_throttle() {
    let clock = ManualClock::new(0);
    for limiter in [
        "token_bucket = { rate = 1, burst = 2 }",
        "leaky_bucket = { refill_interval = \"1s\", refill_amount = 1, max = 2, initial = 2 }",
        "strict = { qps = 1 }",
        "concurrency = { node_limit = 2 }",
    ] {
        let p = on(
            &clock,
            &format!("name = \"m\"\nmode = \"monitor\"\n{limiter}"),
        );
        let held: Vec<_> = (0..5)
            .map(|_| p.try_acquire(&Request::new("k")).expect("monitor admits"))
            .collect();
        let would = held.iter().filter(|a| a.would_throttle()).count();
        let expected = if limiter.starts_with("strict") { 4 } else { 3 };
        assert_eq!(would, expected, "{limiter}");
        let stats = p.stats();
        assert_eq!(
            (stats.admitted, stats.would_throttle, stats.rejected),
            (5, expected as u64, 0),
            "{limiter}"
        );
    }
}

#[test]
fn a_refusal_by_one_policy_gives_back_what_the_others_took() {
    let clock = ManualClock::new(0);
    let set = PolicySet::with_cores(
        vec![
            policy("name = \"a-strict\"\nstrict = { qps = 1 }"),
            policy("name = \"b-tokens\"\ntoken_bucket = { rate = 1, burst = 3 }"),
            policy("name = \"c-inflight\"\nconcurrency = { node_limit = 1 }"),
        ],
        clock.clone(),
        1,
    )
    .unwrap();
    let request = Request::new("k");
    let first = set.try_acquire(&request).expect("everything has room");
    assert_eq!(first.iter().count(), 3);
    clock.advance(Duration::from_secs(1));
    // The strict slot and a token are free again, but the permit is still held: refused, and
    // the slot and the token must come back.
    let refused = set.try_acquire(&request).unwrap_err();
    assert_eq!(refused.policy, "c-inflight");
    drop(first);
    // Had the refused request kept its slot, the next one would be a second away.
    let strict = set.get("a-strict").unwrap();
    assert!(strict.try_acquire(&request).is_ok());
    // Had it kept its token, 2 would be left (3 - 1 + 1 refilled - 1); all 3 are.
    let tokens = set.get("b-tokens").unwrap();
    let admitted = (0..5)
        .filter(|_| tokens.try_acquire(&request).is_ok())
        .count();
    assert_eq!(admitted, 3);
}

#[test]
fn the_key_cap_holds_under_churn_with_shared_overflow() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::new(
        Shape::Gcra {
            interval: MS,
            capacity: 1,
            initial: 1,
            fair: false,
        },
        1000,
        Overflow::Shared,
        clock.clone(),
    );
    let mut key = String::new();
    for i in 0..10_000_000u64 {
        key.clear();
        use std::fmt::Write;
        write!(key, "tenant-{i}").unwrap();
        // Each key takes its one token; a millisecond later its bucket is full (idle) again.
        let _ = limiter.try_acquire(&key, 1);
        if i % 1000 == 999 {
            clock.advance(Duration::from_millis(200));
        }
        debug_assert!(limiter.counters().keys <= 1000);
    }
    let counters = limiter.counters();
    assert!(counters.keys <= 1000, "{counters:?}");
    assert!(counters.evictions >= 10_000_000 - 1000, "{counters:?}");
}

#[test]
fn busy_keys_are_kept_and_new_keys_overflow_to_the_sketch_a_shared_bucket_or_are_refused() {
    let clock = ManualClock::new(0);
    let shape = Shape::Gcra {
        interval: 1000 * MS,
        capacity: 2,
        initial: 2,
        fair: false,
    };
    for overflow in [Overflow::Sketch, Overflow::Shared, Overflow::Reject] {
        let limiter = KeyedLimiter::new(shape, 2, overflow, clock.clone());
        limiter.try_acquire("a", 1).unwrap();
        limiter.try_acquire("b", 1).unwrap();
        // Both are busy (not full), so a third key cannot evict them.
        let third = limiter.try_acquire("c", 1);
        match overflow {
            Overflow::Shared => {
                let grant = third.expect("the overflow bucket has room");
                assert!(grant.taken.overflowed());
                // The overflow bucket is shared by every overflowing key.
                limiter.try_acquire("d", 1).unwrap();
                assert!(limiter.try_acquire("e", 1).is_err());
            }
            Overflow::Sketch => {
                let grant = third.expect("a fresh key in the sketch has its burst");
                assert!(grant.taken.overflowed());
                // Each overflowing key is held to its own bucket: "c" has one token left,
                // and "d" and "e" their own two.
                limiter.try_acquire("c", 1).unwrap();
                assert!(limiter.try_acquire("c", 1).is_err());
                for key in ["d", "e"] {
                    limiter.try_acquire(key, 2).unwrap();
                    assert!(limiter.try_acquire(key, 1).is_err());
                }
            }
            Overflow::Reject => assert_eq!(third.unwrap_err(), KeyedRefusal::KeysExhausted),
        }
        // "a" kept its state: one token left, not a fresh burst of two.
        assert!(limiter.try_acquire("a", 1).is_ok());
        assert!(limiter.try_acquire("a", 1).is_err());
        assert_eq!(limiter.counters().keys, 2);
        let hits = match overflow {
            Overflow::Sketch => 7,
            Overflow::Shared => 3,
            Overflow::Reject => 1,
        };
        assert_eq!(limiter.counters().overflow_hits, hits);
    }
}

#[test]
fn a_key_moving_from_the_sketch_to_the_map_keeps_what_it_spent() {
    let clock = ManualClock::new(0);
    let shape = Shape::Gcra {
        interval: 1000 * MS,
        capacity: 3,
        initial: 3,
        fair: false,
    };
    let limiter = KeyedLimiter::new(shape, 1, Overflow::Sketch, clock.clone());
    // "a" holds the map's one place; "b" spends its burst in the sketch.
    limiter.try_acquire("a", 1).unwrap();
    limiter.try_acquire("b", 3).unwrap();
    assert_eq!(limiter.counters().sketched, 1);
    // Once "a" is whole again, "b" takes the place: with what it spent, not a new burst.
    clock.advance(Duration::from_millis(1500));
    assert!(
        limiter.try_acquire("b", 1).is_ok(),
        "a second and a half refilled one"
    );
    assert_eq!(limiter.counters().keys, 1);
    assert_eq!(limiter.counters().sketched, 1, "decided in the map");
    assert!(limiter.try_acquire("b", 1).is_err());
}

#[test]
fn a_concurrency_limiter_past_its_cap_shares_one_bucket_under_sketch() {
    let limiter = KeyedLimiter::new(
        Shape::Concurrency { limit: 1 },
        1,
        Overflow::Sketch,
        ManualClock::new(0),
    );
    let _a = limiter.try_acquire("a", 1).unwrap();
    let b = limiter.try_acquire("b", 1).unwrap();
    assert!(b.taken.overflowed());
    assert!(
        limiter.try_acquire("c", 1).is_err(),
        "b and c share one permit"
    );
    assert_eq!(limiter.counters().sketch_bytes, 0);
}

#[test]
fn concurrency_keys_with_permits_in_flight_are_never_evicted() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::new(
        Shape::Concurrency { limit: 1 },
        1,
        Overflow::Reject,
        clock.clone(),
    );
    let held = limiter.try_acquire("a", 1).unwrap();
    clock.advance(Duration::from_secs(3600));
    assert_eq!(limiter.sweep(), 0);
    assert_eq!(
        limiter.try_acquire("b", 1).unwrap_err(),
        KeyedRefusal::KeysExhausted
    );
    assert!(
        limiter.try_acquire("a", 1).is_err(),
        "still holding its one permit"
    );
    drop(held);
    assert_eq!(limiter.sweep(), 1);
    assert!(limiter.try_acquire("b", 1).is_ok());
}

#[test]
fn reconfiguring_keeps_each_buckets_fill_and_rejected_changes_keep_the_old_config() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"r\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 10, burst = 10 }",
    );
    for _ in 0..10 {
        assert!(p.try_acquire(&Request::new("a")).unwrap().applied());
    }
    for _ in 0..5 {
        assert!(p.try_acquire(&Request::new("b")).unwrap().applied());
    }
    // Raise the rate tenfold: "a" stays empty, "b" keeps its 5 tokens — no fresh burst.
    p.reconfigure(policy(
        "on_exhausted = \"reject\"\ntoken_bucket = { rate = 100, burst = 10 }",
    ))
    .unwrap();
    assert!(p.try_acquire(&Request::new("a")).is_err());
    let b = (0..10)
        .filter(|_| p.try_acquire(&Request::new("b")).is_ok())
        .count();
    assert_eq!(b, 5);
    clock.advance(Duration::from_millis(10));
    assert!(
        p.try_acquire(&Request::new("a")).is_ok(),
        "refills at the new rate"
    );

    let before = p.config();
    let err = p
        .reconfigure(policy("token_bucket = { rate = -5, burst = 10 }"))
        .unwrap_err();
    assert_eq!(err.field, "token_bucket.rate");
    assert_eq!(p.config(), before);
    let err = p
        .reconfigure(policy("name = \"other\"\nstrict = { qps = 1 }"))
        .unwrap_err();
    assert_eq!(err.field, "name");
    assert_eq!(p.config(), before);
}

#[test]
fn changing_the_kind_of_limiter_starts_afresh() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"k\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 1, burst = 1 }",
    );
    assert!(p.try_acquire(&Request::new("a")).unwrap().applied());
    assert!(p.try_acquire(&Request::new("a")).is_err());
    p.reconfigure(policy(
        "on_exhausted = \"reject\"\nconcurrency = { node_limit = 1 }",
    ))
    .unwrap();
    let permit = p
        .try_acquire(&Request::new("a"))
        .expect("a fresh concurrency bucket");
    assert!(p.try_acquire(&Request::new("a")).is_err());
    drop(permit);
    assert!(p.try_acquire(&Request::new("a")).is_ok());
}

#[tokio::test(start_paused = true)]
async fn reconfiguring_under_load_keeps_waiters() {
    let p = Arc::new(
        Policy::with_cores(
            policy(
                r#"
                name = "fair"
                max_wait = "10s"
                leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 1, max = 10 }
                "#,
            ),
            TokioClock::new(),
            1,
        )
        .unwrap(),
    );
    let start = tokio::time::Instant::now();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let p = Arc::clone(&p);
        waiters.push(tokio::spawn(async move {
            let admission = p.acquire(&Request::new("tenant")).await.expect("admitted");
            (admission.waited(), admission.throttled())
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(p.stats().waiters, 3);
    tokio::time::advance(Duration::from_millis(50)).await;
    // Ten times the rate while three requests wait: none is dropped, all are served sooner.
    p.reconfigure(policy(
        r#"
        max_wait = "10s"
        leaky_bucket = { initial = 0, refill_interval = "10ms", refill_amount = 1, max = 10 }
        "#,
    ))
    .unwrap();
    let mut results = Vec::new();
    for waiter in waiters {
        results.push(waiter.await.unwrap());
    }
    assert!(results.iter().all(|&(_, throttled)| throttled));
    // Half a token accrued in the first 50 ms. The head gives back its claim, taken at the old
    // rate, and claims again at the new one (as a single fair bucket's head does): its token is
    // complete 5 ms later, and the two behind it 10 ms apart.
    let waited: Vec<_> = results.iter().map(|(w, _)| w.as_millis()).collect();
    assert_eq!(waited, vec![55, 65, 75]);
    assert_eq!(start.elapsed(), Duration::from_millis(75));
    let stats = p.stats();
    assert_eq!((stats.throttled, stats.rejected, stats.waiters), (3, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn waiting_requests_give_up_after_max_wait() {
    let p = Policy::with_cores(
        policy("name = \"w\"\nmax_wait = \"250ms\"\ntoken_bucket = { rate = 2, burst = 1 }"),
        TokioClock::new(),
        1,
    )
    .unwrap();
    let request = Request::new("k");
    assert!(!p.acquire(&request).await.unwrap().throttled());
    let second = p.acquire(&request).await.unwrap_err();
    // The next token is 500 ms away, more than `max_wait`: refused at once, with the exact wait.
    assert_eq!(second.retry_after(), Some(Duration::from_millis(500)));
    tokio::time::advance(Duration::from_millis(300)).await;
    let third = p.acquire(&request).await.unwrap();
    assert_eq!(third.waited(), Duration::from_millis(200));

    let permits = Policy::with_cores(
        policy("name = \"c\"\nmax_wait = \"250ms\"\nconcurrency = { node_limit = 1 }"),
        TokioClock::new(),
        1,
    )
    .unwrap();
    let _held = permits.acquire(&request).await.unwrap();
    let start = tokio::time::Instant::now();
    let timed_out = permits.acquire(&request).await.unwrap_err();
    assert_eq!(
        timed_out.reason,
        RejectReason::WaitedTooLong {
            max_wait: Duration::from_millis(250)
        }
    );
    assert_eq!(start.elapsed(), Duration::from_millis(250));
}

#[test]
fn who_is_throttled_lists_the_keys_held_back_with_their_limits() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"t\"\non_exhausted = \"reject\"\nstrict = { qps = 10 }",
    );
    for i in 0..100u64 {
        clock.set(i * 10 * MS); // 100 requests/s for "hot"
        let _ = p.try_acquire(&Request::new("hot").kind("scan"));
        if i % 10 == 0 {
            let _ = p.try_acquire(&Request::new("cold").kind("scan")); // 10/s: never throttled
        }
    }
    let rows = p.throttled_keys(10);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let hot = &rows[0];
    assert_eq!((hot.key.as_str(), hot.kind.as_str()), ("hot", "scan"));
    assert_eq!(hot.qps_limit, Some(10.0));
    // Followed since its first refusal at 10 ms: 99 requests, admitted and refused alike, over
    // (at least) a second.
    assert!((hot.current_qps - 99.0).abs() < 1e-6, "{}", hot.current_qps);
}

#[test]
fn the_periodic_report_speaks_only_when_something_was_throttled() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"getpage\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 5, burst = 5 }",
    );
    for _ in 0..5 {
        assert!(p.try_acquire(&Request::new("t")).unwrap().applied());
    }
    clock.advance(Duration::from_secs(10));
    assert_eq!(p.report(), None);
    for _ in 0..8 {
        let _ = p.try_acquire(&Request::new("t"));
    }
    clock.advance(Duration::from_secs(10));
    let report = p.report().expect("3 were refused");
    assert_eq!(
        (report.accounted, report.rejected, report.throttled),
        (8, 3, 0)
    );
    assert_eq!(report.period, Duration::from_secs(10));
    assert_eq!(
        report.to_string(),
        "policy `getpage` was throttled in the last 10s: 0 of 8 requests waited (0.000ns in total), 3 refused, 0 would have been throttled; each bucket allows 5/s"
    );
    assert_eq!(p.report(), None, "nothing since");
}

#[test]
fn requests_without_a_bucket_key_pass_and_are_counted() {
    use weir::policy::principal::{Dimension, bucket_key};
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"per-user\"\non_exhausted = \"reject\"\nconcurrency = { node_limit = 1 }",
    );
    let principal = "role|analyst";
    match bucket_key("search-group", Dimension::Username, principal) {
        Some(key) => panic!("no username in the principal, yet a key: {key}"),
        None => p.pass_unkeyed(Some("search")),
    }
    let key = bucket_key("search-group", Dimension::Role, principal).unwrap();
    let _held = p.try_acquire(&Request::new(&key)).unwrap();
    assert!(p.try_acquire(&Request::new(&key)).is_err());
    let stats = p.stats();
    assert_eq!((stats.unkeyed, stats.started, stats.admitted), (1, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_fair_waiter_that_gives_up_passes_its_turn_on() {
    let p = Arc::new(
        Policy::with_cores(
            policy(
                r#"
                name = "fair"
                max_wait = "300ms"
                leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 1, max = 10 }
                "#,
            ),
            TokioClock::new(),
            1,
        )
        .unwrap(),
    );
    let start = tokio::time::Instant::now();
    // A big request at the head: 5 tokens, 500 ms away — more than it will wait.
    let big = {
        let p = Arc::clone(&p);
        tokio::spawn(async move { p.acquire(&Request::new("t").cost(5)).await })
    };
    tokio::task::yield_now().await;
    let small = {
        let p = Arc::clone(&p);
        tokio::spawn(async move { p.acquire(&Request::new("t")).await })
    };
    tokio::task::yield_now().await;
    let refused = big.await.unwrap().unwrap_err();
    assert_eq!(
        refused.reason,
        RejectReason::WaitedTooLong {
            max_wait: Duration::from_millis(300)
        }
    );
    // The three tokens that accrued while the big one waited stay in the bucket: the small
    // request behind it goes the moment the big one gives up.
    let admitted = small.await.unwrap().unwrap();
    assert_eq!(admitted.waited(), Duration::from_millis(300));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    let stats = p.stats();
    assert_eq!((stats.rejected, stats.throttled, stats.waiters), (1, 1, 0));
    // Two of the three tokens are left for whoever comes next.
    assert!(p.try_acquire(&Request::new("t").cost(2)).is_ok());
    assert!(p.try_acquire(&Request::new("t")).is_err());
}

#[test]
fn an_adaptive_policy_limits_hot_keys_on_busy_and_relaxes_on_ticks() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        r#"
        name = "ms-tables"
        on_exhausted = "reject"
        adaptive = { control = "stepwise", top_k = 1, ratio = 0.5, floor = 1.0, window = "3s", upgrade_interval = "1s", downgrade_interval = "3s" }
        "#,
    );
    assert_eq!(p.limit(), None);
    let hot = Request::new("table-7").kind("PREPARE_ROWSET");
    let cold = Request::new("table-9").kind("PREPARE_ROWSET");
    for _ in 0..30 {
        assert!(p.try_acquire(&hot).unwrap().applied());
    }
    assert!(p.try_acquire(&cold).is_ok());
    assert_eq!(p.busy(), Some(true), "the hottest key is tightened");
    // 10 qps observed → 5 qps: one call now, the next 200 ms later.
    assert!(p.try_acquire(&hot).is_ok());
    let refused = p.try_acquire(&hot).unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(200)));
    assert!(p.try_acquire(&cold).is_ok(), "cold keys are untouched");
    let rows = p.throttled_keys(10);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].key.as_str(), rows[0].kind.as_str()),
        ("table-7", "PREPARE_ROWSET")
    );
    assert_eq!(rows[0].qps_limit, Some(5.0));
    // Three quiet seconds undo the upgrade.
    p.tick(3000);
    assert!(p.try_acquire(&hot).is_ok());
    assert!(p.try_acquire(&hot).is_ok());
    let bp = p.backpressure_stats().unwrap();
    assert_eq!((bp.upgrades, bp.downgrades, bp.busy_signals), (1, 1, 1));
    let stats = p.stats();
    assert_eq!((stats.rejected, stats.admitted), (1, 35));
    // A non-adaptive policy has no busy signal to take.
    let plain = on(&clock, "name = \"plain\"\nstrict = { qps = 1 }");
    assert_eq!(plain.busy(), None);
}

/// Converging, a busy signal with no call attached (what `Policy::busy` is) cannot measure the
/// overload, so it cuts by `ratio`; a stream of them inside the cooldown cuts no deeper, and
/// the quiet ticks afterwards release the key.
#[test]
fn a_converging_policy_cuts_by_ratio_on_busy_and_relaxes_on_ticks() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        r#"
        name = "ms-tables"
        on_exhausted = "reject"
        adaptive = { top_k = 1, ratio = 0.5, window = "3s", upgrade_interval = "1s", downgrade_interval = "3s" }
        "#,
    );
    clock.set(1_500 * MS);
    let hot = Request::new("table-7").kind("PREPARE_ROWSET");
    let cold = Request::new("table-9").kind("PREPARE_ROWSET");
    for _ in 0..30 {
        assert!(p.try_acquire(&hot).unwrap().applied());
    }
    assert!(p.try_acquire(&cold).is_ok());
    // 20 calls a second over the 1.5 s so far: half of it. (Were the signal taken as one busy
    // answer among 31 calls, the cut would be the headroom only, to about 18.)
    assert_eq!(p.busy(), Some(true));
    let limit = p.throttled_keys(10)[0].qps_limit.unwrap();
    assert!((limit - 10.0).abs() < 1e-9, "{limit}");
    for _ in 0..100 {
        assert_eq!(p.busy(), Some(false), "inside the cooldown");
    }
    let bp = p.backpressure_stats().unwrap();
    assert!(bp.capacity.is_some_and(|c| c >= 1.0), "{:?}", bp.capacity);
    assert_eq!(p.throttled_keys(10)[0].qps_limit, Some(limit));
    // The hot table stops: two quiet intervals with its limit unused release it.
    clock.advance(Duration::from_secs(3));
    p.tick(3000);
    assert_eq!(
        p.throttled_keys(10).len(),
        1,
        "unused for one interval: kept"
    );
    clock.advance(Duration::from_secs(3));
    p.tick(3000);
    assert!(p.throttled_keys(10).is_empty());
    assert!(p.try_acquire(&hot).is_ok());
    assert_eq!(p.backpressure_stats().unwrap().capacity, None);
}

#[test]
fn an_adaptive_policy_in_monitor_mode_only_counts() {
    let clock = ManualClock::new(0);
    let p = on(
        &clock,
        "name = \"dry\"\nmode = \"monitor\"\nadaptive = { top_k = 1, ratio = 0.5 }",
    );
    let hot = Request::new("t").kind("PREP");
    for _ in 0..30 {
        assert!(p.try_acquire(&hot).is_ok());
    }
    assert_eq!(p.busy(), Some(true));
    for _ in 0..5 {
        assert!(p.try_acquire(&hot).is_ok(), "a dry run never refuses");
    }
    assert_eq!(p.stats().rejected, 0);
    // Invalid adaptive settings are named like any other field.
    let err = policy("name = \"bad\"\nadaptive = { ratio = 2.0 }")
        .validate()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy `bad`: `adaptive.ratio` must be between 0 and 1 (exclusive)"
    );
}

/// The leaky-bucket acceptance test, exact: a leaky bucket refilling 10 tokens per 100 ms
/// (100/s), holding at most 10 and starting empty; one client acquiring in a loop, waiting each
/// time, for 10 s of (paused) time gets exactly 1000 admissions. `bench/leaky_bucket_acceptance.sh`
/// runs the same against a real server in real time.
#[tokio::test(start_paused = true)]
async fn one_waiting_client_gets_exactly_100_per_second_from_a_leaky_bucket() {
    let p = Policy::with_cores(
        policy(
            r#"
            name = "tenant"
            max_wait = "1s"
            leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 10, max = 10 }
            "#,
        ),
        TokioClock::new(),
        1,
    )
    .unwrap();
    let start = tokio::time::Instant::now();
    let mut admitted = 0u32;
    while start.elapsed() < Duration::from_secs(10) {
        let admission = p.acquire(&Request::new("tenant-1")).await.unwrap();
        if start.elapsed() <= Duration::from_secs(10) {
            admitted += 1;
        }
        drop(admission);
    }
    assert_eq!(admitted, 1000);
    assert_eq!(p.stats().throttled, 1000, "each one waited its 10 ms");
}

#[tokio::test(start_paused = true)]
async fn behind_a_fair_line_a_request_larger_than_the_bucket_is_told_so() {
    let limiter = Arc::new(KeyedLimiter::new(
        Shape::Gcra {
            interval: 10 * MS,
            capacity: 10,
            initial: 0,
            fair: true,
        },
        100,
        Overflow::Shared,
        TokioClock::new(),
    ));
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            limiter
                .acquire("k", 5, Duration::from_secs(1))
                .await
                .is_ok()
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.occupancy("k"), Some((0, 1)), "one waiter in line");
    assert_eq!(
        limiter.try_acquire("k", 11).unwrap_err(),
        KeyedRefusal::Limited(weir::Refused::ExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
    assert!(matches!(
        limiter.try_acquire("k", 1).unwrap_err(),
        KeyedRefusal::Limited(weir::Refused::RetryAfter { .. })
    ));
    assert!(waiter.await.unwrap());
}

#[test]
fn a_fixed_window_policy_counts_hits_per_calendar_window_and_reports_its_quota() {
    // Instant 0 of the manual clock is the Unix epoch: minutes start at multiples of 60 s.
    let clock = ManualClock::new(30_000 * MS); // 30 s into the first minute
    let policy = on(
        &clock,
        r#"
        name = "per-number"
        on_exhausted = "reject"
        fixed_window = { limit = 2, window = "1m" }
        "#,
    );
    let request = Request::new("+15551234");
    assert!(policy.try_acquire(&request).is_ok());
    let quota = policy.quota(None, "+15551234").expect("keyed");
    assert_eq!(quota.remaining, 1);
    assert_eq!(quota.reset_after, Duration::from_secs(30));
    assert!(policy.try_acquire(&request).is_ok());
    let refused = policy.try_acquire(&request).unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(30)));
    // Another key has its own window; the next minute starts afresh.
    assert!(policy.try_acquire(&Request::new("+15559999")).is_ok());
    clock.advance(Duration::from_secs(30));
    assert!(policy.try_acquire(&request).is_ok());
    assert_eq!(policy.quota(None, "+15551234").unwrap().remaining, 1);
    assert_eq!(policy.limit(), Some(2.0 / 60.0));
}

#[test]
fn a_fixed_window_refuses_to_wait_by_name() {
    let config: Result<PolicyConfig, _> = toml::from_str(
        r#"
        name = "w"
        fixed_window = { limit = 2, window = "1s" }
        "#,
    );
    let error = Policy::new(config.unwrap(), ManualClock::new(0)).unwrap_err();
    assert_eq!(error.field, "on_exhausted");
    assert!(error.problem.contains("reject"), "{error}");
}

#[test]
fn a_fixed_window_keeps_its_hits_across_a_new_limit_and_restarts_on_a_new_length() {
    let clock = ManualClock::new(0);
    let policy = on(
        &clock,
        r#"
        name = "w"
        on_exhausted = "reject"
        fixed_window = { limit = 3, window = "1m" }
        "#,
    );
    let request = Request::new("k");
    for _ in 0..3 {
        let _admitted = policy.try_acquire(&request).unwrap();
    }
    policy
        .reconfigure(policy_text(
            r#"fixed_window = { limit = 4, window = "1m" }"#,
        ))
        .unwrap();
    assert_eq!(policy.quota(None, "k").unwrap().remaining, 1);
    policy
        .reconfigure(policy_text(
            r#"fixed_window = { limit = 4, window = "1h" }"#,
        ))
        .unwrap();
    assert_eq!(policy.quota(None, "k").unwrap().remaining, 4);
}

fn policy_text(table: &str) -> PolicyConfig {
    policy(&format!(
        "name = \"w\"\non_exhausted = \"reject\"\n{table}\n"
    ))
}
