//! Envoy's rate limit service, decided on a manual clock: the reference server's documented
//! examples, its matching rules, Weir's token bucket, the counters, bad rules and bad requests.

use std::path::Path;
use std::time::Duration;

use weir::ManualClock;
use weir::policy::{PolicySet, Scope};
use weir_server::rls::{Code, Descriptor, RequestError, Rls, RlsSettings, RulesConfig, Unit};
use weir_server::rls::{CurrentLimit, SameDomain, policies_of};

const SECOND: u64 = 1_000_000_000;
/// Some Unix time at midnight UTC, so that day windows start at the clock's start.
const MIDNIGHT: u64 = 1_764_547_200 * SECOND;

fn rules(yaml: &str) -> RulesConfig {
    RulesConfig::parse([(Path::new("rules.yaml"), yaml)])
        .unwrap_or_else(|e| panic!("bad test rules: {e:?}"))
}

fn service(yaml: &str, clock: &ManualClock) -> Rls<ManualClock> {
    service_with(yaml, clock, RlsSettings::default())
}

fn service_with(yaml: &str, clock: &ManualClock, settings: RlsSettings) -> Rls<ManualClock> {
    let config = rules(yaml);
    let policies =
        PolicySet::new(policies_of(&config, &settings, Scope::Node), clock.clone()).unwrap();
    Rls::new(&config, settings, &policies, clock.clone())
}

fn descriptor<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
    Descriptor {
        entries: entries.to_vec(),
        limit: None,
        hits: None,
    }
}

const MESSAGING: &str = r#"
domain: messaging
descriptors:
  # marketing messages: 5 a day per number
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # any message: 100 a day per number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

#[test]
fn five_marketing_messages_a_day_then_over_limit() {
    let clock = ManualClock::new(MIDNIGHT + 3600 * SECOND);
    let rls = service(MESSAGING, &clock);
    let marketing = [
        descriptor(&[("message_type", "marketing"), ("to_number", "2061234567")]),
        descriptor(&[("to_number", "2061234567")]),
    ];
    for remaining in [4, 3, 2, 1, 0] {
        let answer = rls.should_rate_limit("messaging", &marketing, 0).unwrap();
        assert_eq!(answer.overall, Code::Ok);
        let status = &answer.statuses[0];
        assert_eq!(status.code, Code::Ok);
        assert_eq!(status.limit_remaining, remaining);
        assert_eq!(
            status.current_limit,
            Some(CurrentLimit {
                requests_per_unit: 5,
                unit: Unit::Day,
                name: None
            })
        );
        // 23 hours left in the day.
        assert_eq!(status.reset_after, Some(Duration::from_secs(23 * 3600)));
    }
    let sixth = rls.should_rate_limit("messaging", &marketing, 0).unwrap();
    assert_eq!(sixth.overall, Code::OverLimit);
    assert_eq!(sixth.statuses[0].code, Code::OverLimit);
    assert_eq!(sixth.statuses[0].limit_remaining, 0);
    // The per-number limit counted all six and is far from its 100.
    assert_eq!(sixth.statuses[1].code, Code::Ok);
    assert_eq!(sixth.statuses[1].limit_remaining, 94);
    // Another number has its own five; tomorrow the first has five again.
    let other = [descriptor(&[
        ("message_type", "marketing"),
        ("to_number", "5551"),
    ])];
    let answer = rls.should_rate_limit("messaging", &other, 0).unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    clock.advance(Duration::from_secs(23 * 3600));
    let answer = rls.should_rate_limit("messaging", &marketing, 0).unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 4);
}

#[test]
fn no_rule_and_unknown_domain_are_ok_and_count_nothing() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(MESSAGING, &clock);
    for domain in ["messaging", "elsewhere"] {
        let answer = rls
            .should_rate_limit(domain, &[descriptor(&[("message_type", "other")])], 0)
            .unwrap();
        assert_eq!(answer.overall, Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
        assert_eq!(answer.statuses[0].limit_remaining, 0);
    }
    // The marketing node has no limit of its own and a descriptor ending there matches none;
    // one deeper than the tree matches none either.
    for entries in [
        &[("message_type", "marketing")][..],
        &[("to_number", "1"), ("extra", "x")][..],
    ] {
        let answer = rls
            .should_rate_limit("messaging", &[descriptor(entries)], 0)
            .unwrap();
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    assert!(rls.counts().all(|(_, _, c)| c.rule.read() == [0; 5]));
}

#[test]
fn unlimited_answers_the_largest_remaining_and_shadow_mode_counts_but_says_ok() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: internal
descriptors:
  - key: client
    value: batch
    rate_limit: { unlimited: true }
  - key: client
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
"#,
        &clock,
    );
    let batch = [descriptor(&[("client", "batch")])];
    for _ in 0..3 {
        let answer = rls.should_rate_limit("internal", &batch, 0).unwrap();
        assert_eq!(answer.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    let other = [descriptor(&[("client", "web")])];
    assert_eq!(
        rls.should_rate_limit("internal", &other, 0)
            .unwrap()
            .overall,
        Code::Ok
    );
    let second = rls.should_rate_limit("internal", &other, 0).unwrap();
    assert_eq!(second.overall, Code::Ok, "shadow mode never refuses");
    assert_eq!(second.statuses[0].limit_remaining, 0);
    assert!(second.statuses[0].current_limit.is_some());
    let (_, path, counts) = rls.counts().nth(1).unwrap();
    assert_eq!(path, "internal.client");
    // total, over, near, within, shadow: with a limit of 1 the near mark is 0 (80 % of 1,
    // rounded down), so the first hit is near the limit too.
    assert_eq!(counts.rule.read(), [2, 1, 1, 1, 1]);
}

#[test]
fn a_replacing_limit_drops_the_one_it_names() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: api
descriptors:
  - key: path
    value: /login
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: login
  - key: user
    value: admin
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: login
"#,
        &clock,
    );
    let both = [
        descriptor(&[("path", "/login")]),
        descriptor(&[("user", "admin")]),
    ];
    for _ in 0..3 {
        let answer = rls.should_rate_limit("api", &both, 0).unwrap();
        assert_eq!(answer.overall, Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    // Without the replacing descriptor, the login limit applies.
    let alone = [descriptor(&[("path", "/login")])];
    assert_eq!(
        rls.should_rate_limit("api", &alone, 0).unwrap().overall,
        Code::Ok
    );
    let answer = rls.should_rate_limit("api", &alone, 0).unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("login")
    );
}

#[test]
fn exact_values_come_first_then_patterns_then_the_bare_key() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: files
descriptors:
  - key: path
    value: /files/special
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: path
    value: /files/*
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: path
    value: /shared/*
    share_threshold: true
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 1 }
"#,
        &clock,
    );
    let limit_of = |path: &str| {
        rls.should_rate_limit("files", &[descriptor(&[("path", path)])], 0)
            .unwrap()
            .statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
    };
    assert_eq!(limit_of("/files/special"), 3);
    assert_eq!(limit_of("/files/a"), 2);
    assert_eq!(limit_of("/other"), 1);
    // Each value of a plain pattern has its own counter: /files/a and /files/b are apart.
    let at = |path: &str| {
        rls.should_rate_limit("files", &[descriptor(&[("path", path)])], 0)
            .unwrap()
            .overall
    };
    assert_eq!(at("/files/a"), Code::Ok); // second hit of /files/a
    assert_eq!(at("/files/a"), Code::OverLimit);
    assert_eq!(at("/files/b"), Code::Ok);
    // With share_threshold every matching value shares one counter.
    assert_eq!(at("/shared/a"), Code::Ok);
    assert_eq!(at("/shared/b"), Code::Ok);
    assert_eq!(at("/shared/c"), Code::OverLimit);
}

#[test]
fn hits_addend_counts_per_request_and_per_descriptor() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: bytes
descriptors:
  - key: tenant
    rate_limit: { unit: second, requests_per_unit: 10 }
"#,
        &clock,
    );
    let tenant = descriptor(&[("tenant", "a")]);
    let answer = rls
        .should_rate_limit("bytes", std::slice::from_ref(&tenant), 4)
        .unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 6);
    // A descriptor's own addend wins; 0 only looks.
    let look = Descriptor {
        hits: Some(0),
        ..tenant.clone()
    };
    let answer = rls.should_rate_limit("bytes", &[look], 4).unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 6);
    // Over the limit by a partial request: it is counted, as the reference server counts it.
    let answer = rls
        .should_rate_limit("bytes", std::slice::from_ref(&tenant), 7)
        .unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    let answer = rls
        .should_rate_limit("bytes", std::slice::from_ref(&tenant), 1)
        .unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    // More than the limit in one call is counted and over it, as the reference server counts
    // it: OVER_LIMIT with nothing left, not a failed call.
    let answer = rls
        .should_rate_limit("bytes", std::slice::from_ref(&tenant), 11)
        .unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
}

#[test]
fn more_hits_than_the_limit_are_counted_and_over_it_not_a_failed_call() {
    // What someone limiting by cost (bytes, tokens) sends: 25 hits against 20 a minute. The
    // reference server counts them and answers OVER_LIMIT; failing the call would let the
    // request through under Envoy's default `failure_mode_deny: false`.
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: cost
descriptors:
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: roomy
    rate_limit: { unit: minute, requests_per_unit: 100 }
"#,
        &clock,
    );
    let tenant = [descriptor(&[("tenant", "a")])];
    let answer = rls.should_rate_limit("cost", &tenant, 25).unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    // Counted: one more hit in the same minute is over too.
    let answer = rls.should_rate_limit("cost", &tenant, 1).unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    // A shadow rule beside an enforced one: OK, the shadow rule with nothing left, the
    // enforced one with what 25 hits leave of 100.
    let both = [
        descriptor(&[("shadowed", "b")]),
        descriptor(&[("roomy", "b")]),
    ];
    let answer = rls.should_rate_limit("cost", &both, 25).unwrap();
    assert_eq!(answer.overall, Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    assert_eq!(answer.statuses[1].limit_remaining, 75);
}

#[test]
fn the_counters_split_a_crossing_as_the_reference_server_does() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 10 }
"#,
        &clock,
    );
    let k = [descriptor(&[("k", "v")])];
    rls.should_rate_limit("d", &k, 7).unwrap(); // 0 → 7: within, near mark is 8
    rls.should_rate_limit("d", &k, 2).unwrap(); // 7 → 9: within, 1 near
    rls.should_rate_limit("d", &k, 3).unwrap(); // 9 → 12: 2 over, 1 near
    rls.should_rate_limit("d", &k, 1).unwrap(); // 12 → 13: 1 over
    let (_, _, counts) = rls.counts().next().unwrap();
    // total, over, near, within, shadow
    assert_eq!(counts.rule.read(), [13, 3, 2, 9, 0]);
}

#[test]
fn a_token_bucket_rule_has_no_double_burst_at_the_window_edge() {
    let clock = ManualClock::new(MIDNIGHT + 59 * SECOND);
    let yaml = |algorithm: &str| {
        format!(
            r#"
domain: edge
{algorithm}
descriptors:
  - key: user
    rate_limit: {{ unit: minute, requests_per_unit: 60 }}
"#
        )
    };
    let window = service(&yaml(""), &clock);
    let bucket = service(&yaml("weir_algorithm: token_bucket"), &clock);
    let user = [descriptor(&[("user", "u")])];
    let admitted = |rls: &Rls<ManualClock>| {
        (0..200)
            .filter(|_| rls.should_rate_limit("edge", &user, 0).unwrap().overall == Code::Ok)
            .count()
    };
    // The last second of a minute, then the first of the next: a window admits 60 twice.
    let (w1, b1) = (admitted(&window), admitted(&bucket));
    clock.advance(Duration::from_secs(1));
    let (w2, b2) = (admitted(&window), admitted(&bucket));
    assert_eq!((w1, w2), (60, 60));
    assert_eq!((b1, b2), (60, 1));
    let status = &bucket.should_rate_limit("edge", &user, 0).unwrap().statuses[0];
    assert_eq!(status.limit_remaining, 0);
    assert_eq!(status.reset_after, Some(Duration::from_secs(60)));
}

#[test]
fn a_limit_sent_with_the_request_counts_instead_of_the_rule() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(MESSAGING, &clock);
    let with_limit = [Descriptor {
        entries: vec![("to_number", "1")],
        limit: Some((2, Some(Unit::Hour))),
        hits: None,
    }];
    let codes: Vec<Code> = (0..3)
        .map(|_| {
            rls.should_rate_limit("messaging", &with_limit, 0)
                .unwrap()
                .overall
        })
        .collect();
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let answer = rls.should_rate_limit("messaging", &with_limit, 0).unwrap();
    assert_eq!(
        answer.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Hour
    );
    let no_unit = [Descriptor {
        limit: Some((2, None)),
        ..with_limit[0].clone()
    }];
    assert_eq!(
        rls.should_rate_limit("messaging", &no_unit, 0).unwrap_err(),
        RequestError::OverrideUnit { index: 0 }
    );
}

#[test]
fn malformed_requests_are_named_and_count_nothing() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(MESSAGING, &clock);
    let good = descriptor(&[("to_number", "1")]);
    assert_eq!(
        rls.should_rate_limit("", std::slice::from_ref(&good), 0)
            .unwrap_err(),
        RequestError::NoDomain
    );
    assert_eq!(
        rls.should_rate_limit("messaging", &[], 0).unwrap_err(),
        RequestError::NoDescriptors
    );
    // The good descriptor sent beside the bad ones was not counted.
    let answer = rls.should_rate_limit("messaging", &[good], 0).unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 99);
}

#[test]
fn a_descriptor_without_entries_or_with_an_empty_key_has_no_limit_as_in_the_reference() {
    // The reference server checks neither: no rule matches such a descriptor, so it is OK
    // with no limit, and the others beside it are counted as usual.
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(MESSAGING, &clock);
    let good = descriptor(&[("to_number", "1")]);
    let empty = descriptor(&[]);
    let no_key = descriptor(&[("to_number", "1"), ("", "x")]);
    let answer = rls
        .should_rate_limit("messaging", &[good.clone(), empty, no_key], 0)
        .unwrap();
    assert_eq!(answer.overall, Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 99);
    assert_eq!(answer.statuses[1].current_limit, None);
    assert_eq!(answer.statuses[2].current_limit, None);
}

#[test]
fn header_fields_report_the_tightest_limit() {
    let clock = ManualClock::new(MIDNIGHT + 30 * SECOND);
    let settings = RlsSettings {
        response_headers: true,
        ..RlsSettings::default()
    };
    let rls = service_with(
        r#"
domain: h
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 3 }
"#,
        &clock,
        settings,
    );
    let answer = rls
        .should_rate_limit(
            "h",
            &[descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
            0,
        )
        .unwrap();
    assert_eq!(
        answer.headers,
        [
            ("RateLimit-Limit", "3".to_owned()),
            ("RateLimit-Remaining", "2".to_owned()),
            ("RateLimit-Reset", "30".to_owned()),
        ]
    );
}

#[test]
fn mistakes_in_rules_are_named_by_file_line_and_rule() {
    let problems = |yaml: &str| -> Vec<String> {
        RulesConfig::parse([(Path::new("rls/app.yaml"), yaml)])
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let unit = problems(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    );
    assert_eq!(unit.len(), 1);
    assert!(
        unit[0].starts_with("rls/app.yaml:4:")
            && unit[0].contains("rule `d.k`")
            && unit[0].contains("fortnight"),
        "{unit:?}"
    );
    let negative = problems(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -5\n",
    );
    assert!(
        negative[0].starts_with("rls/app.yaml:6:") && negative[0].contains("-5"),
        "{negative:?}"
    );
    let twice =
        problems("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n");
    assert!(
        twice[0].starts_with("rls/app.yaml:5:")
            && twice[0].contains("rule `d.k_v`")
            && twice[0].contains("twice"),
        "{twice:?}"
    );
    // Every mistake at once, and unknown fields by name.
    let several = problems(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: x }\n  - key: b\n    rate_limit: { unit: hour, requests_per_unit: 1, unlimited: true }\n",
    );
    assert_eq!(several.len(), 2, "{several:?}");
    let unknown = problems("domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n");
    assert!(unknown[0].contains("rate_limt"), "{unknown:?}");
    let share = problems("domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n");
    assert!(share[0].contains("share_threshold"), "{share:?}");
}

#[test]
fn two_files_may_not_define_one_domain() {
    let error = RulesConfig::parse([
        (Path::new("a.yaml"), "domain: d\n"),
        (Path::new("b.yaml"), "domain: d\n"),
    ])
    .unwrap_err();
    assert!(
        error[0].to_string().contains("already defined in a.yaml"),
        "{error:?}"
    );
}

#[test]
fn metrics_name_values_only_where_a_rule_asks() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: m
descriptors:
  - key: route
    value: /api/*
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: { unit: second, requests_per_unit: 100 }
  - key: user
    detailed_metric: true
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: tenant
    rate_limit: { unit: second, requests_per_unit: 100 }
"#,
        &clock,
    );
    for entries in [
        &[("route", "/api/users"), ("method", "GET")][..],
        &[("user", "alice")][..],
        &[("tenant", "t1")][..],
        &[("tenant", "t2")][..],
    ] {
        rls.should_rate_limit("m", &[descriptor(entries)], 0)
            .unwrap();
    }
    let names = |path: &str| -> Vec<String> {
        let (_, _, counts) = rls.counts().find(|(_, p, _)| *p == path).unwrap();
        let mut names: Vec<String> = counts.named.lock().unwrap().keys().cloned().collect();
        names.sort();
        names
    };
    // The pattern's value goes into the name; the bare key below it stays bare.
    assert_eq!(
        names("m.route_/api/*.method"),
        ["m.route_/api/users.method"]
    );
    assert_eq!(names("m.user"), ["m.user_alice"]);
    // A hit counted under its name is not counted under the path too.
    let (_, _, user) = rls.counts().find(|(_, p, _)| *p == "m.user").unwrap();
    assert_eq!(user.rule.read()[0], 0);
    assert_eq!(user.named.lock().unwrap()["m.user_alice"].read()[0], 1);
    // A rule that does not ask keeps one name however many values it sees.
    assert!(names("m.tenant").is_empty());
    let (_, _, tenant) = rls.counts().find(|(_, p, _)| *p == "m.tenant").unwrap();
    assert_eq!(tenant.rule.read()[0], 2);
}

#[test]
fn a_directory_of_rules_loads_every_file_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yml"), "domain: b\n").unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: a\n").unwrap();
    std::fs::write(dir.path().join("c"), "domain: c\n").unwrap();
    let config = RulesConfig::load(dir.path(), SameDomain::Refused).unwrap();
    let domains: Vec<&str> = config.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(domains, ["a", "b", "c"]);
    // A file is a rules file whatever its name (as the reference server reads its directory):
    // one that is not rules is named, not skipped.
    std::fs::write(dir.path().join("notes.txt"), "not rules").unwrap();
    let error = RulesConfig::load(dir.path(), SameDomain::Refused).unwrap_err();
    assert!(error[0].place.file.ends_with("notes.txt"), "{error:?}");
    let empty = tempfile::tempdir().unwrap();
    let error = RulesConfig::load(empty.path(), SameDomain::Refused).unwrap_err();
    assert!(error[0].to_string().contains("holds no file"), "{error:?}");
}

#[test]
fn unbounded_values_keep_a_rule_within_its_key_cap() {
    let clock = ManualClock::new(MIDNIGHT);
    let settings = RlsSettings {
        max_keys: 100,
        ..RlsSettings::default()
    };
    let config = rules(
        r#"
domain: ips
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 5 }
"#,
    );
    let policies =
        PolicySet::new(policies_of(&config, &settings, Scope::Node), clock.clone()).unwrap();
    let rls = Rls::new(&config, settings, &policies, clock.clone());
    let policy = policies.get("rls:ips.remote_address").unwrap();
    let mut first_hits_refused = 0;
    let mut own_limit_refusals = 0;
    for round in 0..20u64 {
        for address in 0..500u64 {
            let ip = format!("10.{round}.{}.{}", address / 256, address % 256);
            let answer = rls
                .should_rate_limit("ips", &[descriptor(&[("remote_address", &ip)])], 0)
                .unwrap();
            // Each second the first hundred addresses have windows of their own (last
            // second's were idle and dropped); past the cap, with none idle, the rest are
            // counted in the sketch, each held to its own limit there: one hit each is
            // within it, whoever filled the map.
            if address < 100 {
                assert_eq!(answer.overall, Code::Ok, "round {round}, address {address}");
            } else if answer.overall == Code::OverLimit {
                first_hits_refused += 1;
            }
        }
        // Past the cap a key gets at most its own 5 in the window, never more: its sixth
        // hit is refused whatever it shares words with. (Sharing all four of its words with
        // keys already counted can cost it one of the five: the sketch errs on the strict side.)
        let last = format!("10.{round}.1.243");
        let mut admitted = 1;
        for _ in 2..=6 {
            let answer = rls
                .should_rate_limit("ips", &[descriptor(&[("remote_address", &last)])], 0)
                .unwrap();
            admitted += u32::from(answer.overall == Code::Ok);
        }
        assert!(
            (4..=5).contains(&admitted),
            "round {round}: {admitted} of 6 admitted"
        );
        own_limit_refusals += 6 - admitted;
        assert!(policy.stats().keys <= 100, "{:?}", policy.stats());
        // A new second: last second's windows are idle and may go.
        clock.advance(Duration::from_secs(1));
    }
    // No newcomer's first hit was refused: a word reaches the limit only when five keys have
    // stacked on it, which 400 keys in 1 024 words a row do not do.
    assert_eq!(first_hits_refused, 0);
    let stats = policy.stats();
    assert!(stats.evictions > 0, "{stats:?}");
    assert_eq!(stats.sketched, 20 * 405, "{stats:?}");
    let (_, _, counts) = rls.counts().next().unwrap();
    // total, over, near, within, shadow: only the hits past each key's own limit are over.
    let [total, over_limit, _, within, _] = counts.rule.read();
    assert_eq!(total, 20 * 505);
    assert_eq!(over_limit, u64::from(own_limit_refusals));
    assert_eq!(within, total - over_limit);
}

#[test]
fn two_rules_with_one_path_are_refused_wherever_they_come_from() {
    let error = RulesConfig::parse([(
        Path::new("a.yaml"),
        "domain: d\ndescriptors:\n  - key: b.c\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: { unit: second, requests_per_unit: 2 }\n",
    )])
    .unwrap_err();
    assert_eq!(error.len(), 1, "{error:?}");
    let text = error[0].to_string();
    assert!(
        text.starts_with("a.yaml:7:")
            && text.contains("rule `d.b.c`")
            && text.contains("a.yaml:3:"),
        "{text}"
    );
    let across = RulesConfig::parse([
        (Path::new("a.yaml"), "domain: a\ndescriptors:\n  - key: b.c\n    rate_limit: { unit: second, requests_per_unit: 1 }\n"),
        (Path::new("ab.yaml"), "domain: a.b\ndescriptors:\n  - key: c\n    rate_limit: { unit: second, requests_per_unit: 1 }\n"),
    ])
    .unwrap_err();
    assert!(across[0].to_string().contains("rule `a.b.c`"), "{across:?}");
}

#[test]
fn a_rules_directory_is_read_whole_whatever_the_names_but_for_dot_names() {
    // Two ConfigMaps mounted side by side, as Kubernetes lays one out: each file a link into
    // `..data`, which links to a dated directory; a file with no extension; a nested folder.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (map, domain) in [("edge", "edge"), ("internal", "internal")] {
        let dated = root.join(map).join("..2026_12_02_00_00_00.1");
        std::fs::create_dir_all(&dated).unwrap();
        std::fs::write(
            dated.join("rules"),
            format!(
                "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink("..2026_12_02_00_00_00.1", root.join(map).join("..data"))
            .unwrap();
        std::os::unix::fs::symlink("..data/rules", root.join(map).join("rules")).unwrap();
    }
    let nested = root.join("more").join("deeper");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(
        nested.join("batch.yml"),
        "domain: batch\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    std::fs::write(root.join(".hidden.yaml"), "not: [rules").unwrap();
    let config = RulesConfig::load(root, SameDomain::Refused).unwrap();
    let mut domains: Vec<&str> = config.domains.iter().map(|d| d.domain.as_str()).collect();
    domains.sort_unstable();
    assert_eq!(domains, ["batch", "edge", "internal"]);

    // A file that is not rules is named, not skipped.
    std::fs::write(root.join("README"), "these are the rules").unwrap();
    let errors = RulesConfig::load(root, SameDomain::Refused).unwrap_err();
    assert!(
        errors.iter().any(|e| e.place.file.ends_with("README")),
        "{errors:?}"
    );
}

#[test]
fn a_rate_limit_without_requests_per_unit_is_zero_as_the_reference_server_reads_it() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute }
"#,
        &clock,
    );
    let answer = rls
        .should_rate_limit("d", &[descriptor(&[("k", "v")])], 0)
        .unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
}

#[test]
fn an_unlimited_rule_that_replaces_a_limit_drops_it_as_in_the_reference() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service(
        r#"
domain: d
descriptors:
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 1, name: per_tenant }
  - key: vip
    rate_limit: { unlimited: true, replaces: [{ name: per_tenant }] }
"#,
        &clock,
    );
    let both = [
        descriptor(&[("tenant", "a")]),
        descriptor(&[("vip", "yes")]),
    ];
    for _ in 0..3 {
        let answer = rls.should_rate_limit("d", &both, 0).unwrap();
        assert_eq!(answer.overall, Code::Ok);
    }
    // Without the unlimited rule beside it, the tenant's limit applies (and was not counted).
    let alone = [descriptor(&[("tenant", "a")])];
    assert_eq!(
        rls.should_rate_limit("d", &alone, 0).unwrap().overall,
        Code::Ok
    );
    assert_eq!(
        rls.should_rate_limit("d", &alone, 0).unwrap().overall,
        Code::OverLimit
    );
}
