//! A policy survives its own JSON form: parse → serialize → parse gives the same policy and the
//! same bytes. The server stores policies as JSON and tags each with a hash of that form (its
//! ETag), so a policy that changed on the way through would change its tag on every restart.

use proptest::prelude::*;
use serde_json::{Value, json};
use weir::policy::PolicyConfig;

/// A rate or count as a policy may carry it: whole, fractional, tiny, large.
fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        (1u32..=100_000).prop_map(f64::from),
        (1u32..=100_000).prop_map(|n| f64::from(n) / 7.0),
        (1u32..=1_000).prop_map(|n| f64::from(n) * 1e-3),
        Just(1e9),
    ]
}

/// Per-kind overrides of a rate: `-1` (the default), `0` (unlimited) or a rate.
fn overrides() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop::sample::select(vec!["read", "write", "scan"]),
        prop_oneof![Just(-1.0), Just(0.0), rate()],
        0..3,
    )
    .prop_map(|map| json!(map))
}

/// Per-kind overrides of a count, which are whole: `-1`, `0` or a count.
fn count_overrides() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop::sample::select(vec!["read", "write", "scan"]),
        prop_oneof![Just(-1.0), Just(0.0), (1u32..=100_000).prop_map(f64::from)],
        0..3,
    )
    .prop_map(|map| json!(map))
}

/// A duration in the forms a config writes it.
fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u64..=120).prop_map(|s| format!("{s}s")),
        (1u64..=5_000).prop_map(|ms| format!("{ms}ms")),
        (1u64..=5_000).prop_map(|us| format!("{us}us")),
    ]
}

/// Exactly one limiter table.
fn limiter() -> impl Strategy<Value = (&'static str, Value)> {
    prop_oneof![
        (
            rate(),
            prop::option::of(1u64..=10_000),
            any::<bool>(),
            overrides()
        )
            .prop_map(|(rate, burst, per_core, overrides)| {
                let mut table =
                    json!({ "rate": rate, "per_core": per_core, "overrides": overrides });
                if let Some(burst) = burst {
                    table["burst"] = json!(burst);
                }
                ("token_bucket", table)
            }),
        (
            0u64..=100,
            duration(),
            1u64..=100,
            100u64..=10_000,
            any::<bool>(),
            count_overrides()
        )
            .prop_map(
                |(initial, refill_interval, refill_amount, max, fair, overrides)| {
                    let table = json!({
                        "initial": initial,
                        "refill_interval": refill_interval,
                        "refill_amount": refill_amount,
                        "max": max,
                        "fair": fair,
                        "overrides": overrides,
                    });
                    ("leaky_bucket", table)
                }
            ),
        (rate(), any::<bool>()).prop_map(|(qps, per_core)| {
            ("strict", json!({ "qps": qps, "per_core": per_core }))
        }),
        (
            1u64..=1_000,
            0u64..=1_000,
            duration(),
            prop::sample::select(vec!["open", "closed", "local_share"])
        )
            .prop_map(|(node_limit, shared_limit, lease_ttl, on_unavailable)| {
                let table = json!({
                    "node_limit": node_limit,
                    "shared_limit": shared_limit,
                    "lease_ttl": lease_ttl,
                    "on_unavailable": on_unavailable,
                });
                ("concurrency", table)
            }),
    ]
}

fn policy() -> impl Strategy<Value = Value> {
    (
        "[a-z][a-z0-9_-]{0,11}",
        prop::collection::vec(prop::sample::select(vec!["read", "write", "scan"]), 0..3),
        prop::sample::select(vec!["enforce", "monitor"]),
        prop::sample::select(vec!["wait", "reject"]),
        duration(),
        1usize..=1_000_000,
        prop::sample::select(vec!["shared", "reject"]),
        prop::option::of(1u64..=1_000_000),
        limiter(),
    )
        .prop_map(
            |(name, kinds, mode, on_exhausted, max_wait, max_keys, overflow, max_cost, limiter)| {
                let mut policy = json!({
                    "name": name,
                    "kinds": kinds,
                    "mode": mode,
                    "on_exhausted": on_exhausted,
                    "max_wait": max_wait,
                    "max_keys": max_keys,
                    "overflow": overflow,
                });
                if let Some(max_cost) = max_cost {
                    policy["max_cost"] = json!(max_cost);
                }
                policy[limiter.0] = limiter.1;
                policy
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_policy_survives_its_json_form(written in policy()) {
        let parsed: PolicyConfig = serde_json::from_value(written.clone())
            .map_err(|e| TestCaseError::fail(format!("{e}: {written}")))?;
        let form = serde_json::to_string(&parsed).unwrap();
        let again: PolicyConfig = serde_json::from_str(&form).unwrap();
        prop_assert_eq!(&again, &parsed, "{}", form);
        prop_assert_eq!(serde_json::to_string(&again).unwrap(), form);
    }
}
