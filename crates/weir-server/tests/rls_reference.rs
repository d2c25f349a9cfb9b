//! Cases from the reference rate limit server's behaviour that a migrating user meets: YAML
//! anchors and merge keys, a domain over several files, quota mode, a sent limit sharing the
//! rule's counter, the names its stats take, and rules reloaded with their counters kept.

use std::path::Path;

use weir::ManualClock;
use weir::policy::{PolicySet, Scope};
use weir_server::rls::{
    Code, Descriptor, Rls, RlsSettings, RulesConfig, SameDomain, Unit, policies_of,
};

const SECOND: u64 = 1_000_000_000;
/// Some Unix time at midnight UTC, so that windows start at the clock's start.
const MIDNIGHT: u64 = 1_764_547_200 * SECOND;

fn rules(yaml: &str) -> RulesConfig {
    RulesConfig::parse([(Path::new("rules.yaml"), yaml)])
        .unwrap_or_else(|e| panic!("bad test rules: {e:?}"))
}

fn service_of(
    config: &RulesConfig,
    clock: &ManualClock,
    settings: RlsSettings,
) -> Rls<ManualClock> {
    let policies =
        PolicySet::new(policies_of(config, &settings, Scope::Node), clock.clone()).unwrap();
    Rls::new(config, settings, &policies, clock.clone())
}

fn descriptor<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
    Descriptor {
        entries: entries.to_vec(),
        limit: None,
        hits: None,
    }
}

/// The codes of `times` calls of `entries` in `domain`.
fn codes(
    rls: &Rls<ManualClock>,
    domain: &str,
    entries: &[(&str, &str)],
    times: usize,
) -> Vec<Code> {
    (0..times)
        .map(|_| {
            rls.should_rate_limit(domain, &[descriptor(entries)], 0)
                .unwrap()
                .overall
        })
        .collect()
}

#[test]
fn anchors_aliases_and_merge_keys_read_as_the_reference_reads_them() {
    let config = rules(
        r#"
domain: shared
descriptors:
  - key: tier
    value: free
    rate_limit: &small
      unit: minute
      requests_per_unit: 2
  - key: tier
    value: trial
    rate_limit: *small
  - key: tier
    value: paid
    rate_limit:
      <<: *small
      requests_per_unit: 3
"#,
    );
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service_of(&config, &clock, RlsSettings::default());
    let over = |n: usize| {
        let mut codes = vec![Code::Ok; n];
        codes.push(Code::OverLimit);
        codes
    };
    assert_eq!(codes(&rls, "shared", &[("tier", "free")], 3), over(2));
    assert_eq!(codes(&rls, "shared", &[("tier", "trial")], 3), over(2));
    assert_eq!(codes(&rls, "shared", &[("tier", "paid")], 4), over(3));
}

#[test]
fn a_mistake_inside_an_anchor_is_named_where_it_is_written() {
    let errors = RulesConfig::parse([(
        Path::new("rules.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r\n      unit: fortnight\n      requests_per_unit: 1\n  - key: b\n    rate_limit: *r\n",
    )])
    .unwrap_err();
    assert!(!errors.is_empty());
    for error in &errors {
        assert_eq!(error.place.line, 5, "{error}");
        assert!(error.to_string().contains("fortnight"), "{error}");
    }
}

#[test]
fn a_domain_over_several_files_merges_only_when_asked() {
    let a = (
        Path::new("a.yaml"),
        "domain: d\ndescriptors:\n  - key: x\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let b = (
        Path::new("b.yaml"),
        "domain: d\ndescriptors:\n  - key: y\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n",
    );
    let refused = RulesConfig::parse_with([a, b], SameDomain::Refused).unwrap_err();
    assert!(
        refused[0].to_string().contains("merge_domains"),
        "{refused:?}"
    );
    let merged = RulesConfig::parse_with([a, b], SameDomain::Merged).unwrap();
    assert_eq!(merged.domains.len(), 1);
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service_of(&merged, &clock, RlsSettings::default());
    assert_eq!(
        codes(&rls, "d", &[("x", "1")], 2),
        [Code::Ok, Code::OverLimit]
    );
    assert_eq!(
        codes(&rls, "d", &[("y", "1")], 3),
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
    // One key and value in two files is a mistake, named where the second writes it.
    let again = (
        Path::new("c.yaml"),
        "domain: d\ndescriptors:\n  - key: x\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    );
    let errors = RulesConfig::parse_with([a, again], SameDomain::Merged).unwrap_err();
    assert!(errors[0].place.file.ends_with("c.yaml"), "{errors:?}");
    assert!(errors[0].to_string().contains("twice"), "{errors:?}");
}

const QUOTA: &str = r#"
domain: q
descriptors:
  - key: plan
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: burst
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

#[test]
fn quota_mode_descriptors_are_over_together_or_not_at_all() {
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service_of(&rules(QUOTA), &clock, RlsSettings::default());
    let both = [descriptor(&[("plan", "p")]), descriptor(&[("burst", "b")])];
    let first = rls.should_rate_limit("q", &both, 0).unwrap();
    assert_eq!(first.overall, Code::Ok);
    // The plan is spent, the burst is not: each says so, and the request goes through.
    let second = rls.should_rate_limit("q", &both, 0).unwrap();
    assert_eq!(second.statuses[0].code, Code::OverLimit);
    assert_eq!(second.statuses[1].code, Code::Ok);
    assert_eq!(second.overall, Code::Ok);
    // Both spent: over.
    let third = rls.should_rate_limit("q", &both, 0).unwrap();
    assert_eq!(
        [third.statuses[0].code, third.statuses[1].code],
        [Code::OverLimit, Code::OverLimit]
    );
    assert_eq!(third.overall, Code::OverLimit);
    // A descriptor not in quota mode that is over makes the request over by itself.
    let rate = [descriptor(&[("plan", "p2")]), descriptor(&[("user", "u")])];
    assert_eq!(
        rls.should_rate_limit("q", &rate, 0).unwrap().overall,
        Code::Ok
    );
    let again = rls.should_rate_limit("q", &rate, 0).unwrap();
    assert_eq!(again.overall, Code::OverLimit);
}

#[test]
fn the_global_quota_mode_puts_every_limit_in_it() {
    let clock = ManualClock::new(MIDNIGHT);
    let settings = RlsSettings {
        quota_mode: true,
        ..RlsSettings::default()
    };
    let rls = service_of(&rules(QUOTA), &clock, settings);
    let user_and_free = [
        descriptor(&[("user", "u")]),
        descriptor(&[("nothing", "x")]),
    ];
    rls.should_rate_limit("q", &user_and_free, 0).unwrap();
    // The user is over, but a descriptor with no limit is a quota one that is not.
    let answer = rls.should_rate_limit("q", &user_and_free, 0).unwrap();
    assert_eq!(answer.statuses[0].code, Code::OverLimit);
    assert_eq!(answer.overall, Code::Ok);
    let user = [descriptor(&[("user", "u")])];
    assert_eq!(
        rls.should_rate_limit("q", &user, 0).unwrap().overall,
        Code::OverLimit
    );
}

#[test]
fn a_limit_sent_with_the_request_shares_the_rules_counter_of_its_unit() {
    let config = rules(
        "domain: o\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n",
    );
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service_of(&config, &clock, RlsSettings::default());
    assert_eq!(codes(&rls, "o", &[("k", "v")], 3), [Code::Ok; 3]);
    let sent = |unit| Descriptor {
        entries: vec![("k", "v")],
        limit: Some((5, Some(unit))),
        hits: None,
    };
    // Three rule hits and this one: 1 of 5 left, as the reference server answers.
    let answer = rls
        .should_rate_limit("o", &[sent(Unit::Minute)], 0)
        .unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 1);
    // And the rule sees the sent limit's hit: 15 of 20 left.
    let rule = rls
        .should_rate_limit("o", &[descriptor(&[("k", "v")])], 0)
        .unwrap();
    assert_eq!(rule.statuses[0].limit_remaining, 15);
    // A limit of another unit counts in a window of its own.
    let hourly = rls.should_rate_limit("o", &[sent(Unit::Hour)], 0).unwrap();
    assert_eq!(hourly.statuses[0].limit_remaining, 4);
}

#[test]
fn stats_names_follow_the_references_where_flags_meet() {
    let config = rules(
        r#"
domain: test-domain
descriptors:
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 100 }
"#,
    );
    let clock = ManualClock::new(MIDNIGHT);
    let rls = service_of(&config, &clock, RlsSettings::default());
    for service in ["svc/a", "svc/b"] {
        rls.should_rate_limit(
            "test-domain",
            &[descriptor(&[("service", service), ("endpoint", "get")])],
            0,
        )
        .unwrap();
    }
    rls.should_rate_limit(
        "test-domain",
        &[descriptor(&[
            ("route", ""),
            ("http_method", "GET"),
            ("subject_id", "s"),
        ])],
        0,
    )
    .unwrap();
    let names = |path: &str| -> Vec<(String, u64)> {
        let (_, _, counts) = rls.counts().find(|(_, p, _)| *p == path).unwrap();
        let mut names: Vec<(String, u64)> = counts
            .named
            .lock()
            .unwrap()
            .iter()
            .map(|(name, counts)| (name.clone(), counts.read()[0]))
            .collect();
        names.sort();
        if counts.rule.read()[0] > 0 {
            names.push((path.to_owned(), counts.rule.read()[0]));
        }
        names
    };
    // One series for every value the shared pattern matches, named by the pattern.
    assert_eq!(
        names("test-domain.service_svc/*.endpoint"),
        [("test-domain.service_svc/*.endpoint_get".to_owned(), 2)]
    );
    // An empty value adds no `_` to its key: the rule's own path.
    assert_eq!(
        names("test-domain.route.http_method_GET.subject_id"),
        [("test-domain.route.http_method_GET.subject_id".to_owned(), 1)]
    );
}

#[test]
fn rules_reloaded_keep_the_counts_and_counters_of_the_rules_that_stay() {
    let before = rules(
        "domain: r\ndescriptors:\n  - key: stays\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: goes\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n",
    );
    let after = rules(
        "domain: r\ndescriptors:\n  - key: stays\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: comes\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let clock = ManualClock::new(MIDNIGHT);
    let settings = RlsSettings::default();
    let policies =
        PolicySet::new(policies_of(&before, &settings, Scope::Node), clock.clone()).unwrap();
    let rls = Rls::new(&before, settings.clone(), &policies, clock.clone());
    assert_eq!(codes(&rls, "r", &[("stays", "x")], 2), [Code::Ok; 2]);
    for config in policies_of(&after, &settings, Scope::Node) {
        policies.upsert(config).unwrap();
    }
    let reloaded = rls.reloaded(&after, &policies);
    // Two of three spent before the reload: one left after it.
    assert_eq!(
        codes(&reloaded, "r", &[("stays", "x")], 2),
        [Code::Ok, Code::OverLimit]
    );
    assert_eq!(
        codes(&reloaded, "r", &[("comes", "x")], 2),
        [Code::Ok, Code::OverLimit]
    );
    let hits = |rls: &Rls<ManualClock>, path: &str| {
        rls.counts()
            .find(|(_, p, _)| *p == path)
            .map(|(_, _, counts)| counts.rule.read()[0])
    };
    assert_eq!(hits(&reloaded, "r.stays"), Some(4));
    assert_eq!(hits(&reloaded, "r.comes"), Some(2));
    assert_eq!(hits(&reloaded, "r.goes"), None);
}
