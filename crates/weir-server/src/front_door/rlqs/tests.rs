use std::collections::BTreeMap;
use std::time::Duration;

use weir_api::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use weir_cluster::assignment::Whole;

use super::action::{Demand, FILL_INTERVAL, strategy_of};
use super::buckets::{BucketRule, RlqsTable};

/// 100 a second, 20 at once.
const WHOLE: Whole = Whole {
    interval: 10_000_000,
    capacity: 20,
};

#[test]
fn a_share_is_a_token_bucket_of_that_part_of_the_rate_and_burst() {
    let Some(Strategy::TokenBucket(bucket)) = strategy_of(333, WHOLE).strategy else {
        panic!("a token bucket");
    };
    assert_eq!(bucket.max_tokens, 6, "333/1000 of 20, rounded down");
    // 33.3 a second over 60 s.
    assert_eq!(bucket.tokens_per_fill, Some(1998));
    let interval = bucket.fill_interval.unwrap();
    assert_eq!((interval.seconds, interval.nanos), (60, 0));
    assert_eq!(FILL_INTERVAL.as_secs(), 60);
    // Shares that make the whole never add up to more than its rate.
    let per_fill = |shares| match strategy_of(shares, WHOLE).strategy {
        Some(Strategy::TokenBucket(bucket)) => bucket.tokens_per_fill.unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(per_fill(333) + per_fill(333) + per_fill(334), 6000);
    assert_eq!(per_fill(1000), 100 * 60);
}

#[test]
fn no_share_is_deny_all() {
    let deny = Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32));
    assert_eq!(strategy_of(0, WHOLE).strategy, deny);
    // A share of the burst under one token admits nothing either.
    assert_eq!(strategy_of(49, WHOLE).strategy, deny);
}

#[test]
fn demand_is_measured_between_reports_and_taken_as_hot_before() {
    let mut demand = Demand::default();
    demand.reported(1, None);
    assert_eq!(demand.to_report(100), 100, "unknown: the whole rate");
    demand.reported(250, Some(Duration::from_millis(5_000)));
    assert_eq!(demand.to_report(100), 50);
    demand.reported(0, Some(Duration::from_secs(5)));
    demand.reported(0, Some(Duration::from_secs(5)));
    assert_eq!((demand.to_report(100), demand.idle_reports), (0, 2));
    demand.reported(5, Some(Duration::from_secs(5)));
    assert_eq!((demand.to_report(100), demand.idle_reports), (1, 0));
}

fn id(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn table() -> RlqsTable {
    toml::from_str(
        r#"
        [[bucket]]
        domain = "edge"
        match = { name = "per-tenant" }
        policy = "tenants"
        key = "{tenant}"

        [[bucket]]
        policy = "paths"
        key = "{method} {path}"
        "#,
    )
    .unwrap()
}

#[test]
fn a_bucket_id_maps_by_the_first_rule_that_takes_it() {
    let table = table();
    let acme = id(&[("name", "per-tenant"), ("tenant", "acme")]);
    assert_eq!(
        table.map("edge", &acme),
        Some(("tenants".into(), "acme".into()))
    );
    assert_eq!(table.map("other", &acme), None, "domain differs, no method");
    let path = id(&[("method", "GET"), ("path", "/a")]);
    assert_eq!(
        table.map("other", &path),
        Some(("paths".into(), "GET /a".into()))
    );
    let direct = id(&[("policy", "p"), ("key", "k")]);
    assert_eq!(table.map("x", &direct), Some(("p".into(), "k".into())));
    assert_eq!(table.map("x", &id(&[("tenant", "acme")])), None);
}

#[test]
fn rules_with_a_bad_key_or_an_unknown_policy_are_named() {
    let mut table = table();
    table.bucket.push(BucketRule {
        domain: None,
        matches: BTreeMap::new(),
        policy: "nope".into(),
        key: "{unclosed".into(),
    });
    let problems = table.problems(&["tenants", "paths"]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(problems[0].0, "bucket[2].key");
    assert!(problems[0].1.contains("not closed"), "{problems:?}");
    assert_eq!(problems[1].0, "bucket[2].policy");
    assert!(problems[1].1.contains("`nope`"), "{problems:?}");
}
