//! Envoy's rate limit service on a real `weir serve`: the protocol over gRPC, the rules as
//! read-only policies, `/v1/throttles`, `/metrics`, bad input, health, and bad rules at start
//! and in `check-config`; the rules reloaded live.

mod support;

use std::time::Duration;

use support::{Server, counter, eventually, publish, weir};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::Code as RlsCode;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use weir_api::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const RULES: &str = r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn marketing(number: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "messaging".to_owned(),
        descriptors: vec![
            descriptor(&[("message_type", "marketing"), ("to_number", number)]),
            descriptor(&[("to_number", number)]),
        ],
        hits_addend: 0,
    }
}

fn start(dir: &tempfile::TempDir, extra: &str) -> Server {
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let config = format!("[rls]\nconfig = {:?}\n{extra}", rules.display().to_string());
    Server::start(&config, &dir.path().join("data"))
}

#[tokio::test]
async fn a_cost_above_a_limit_is_counted_and_over_limit_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir, "");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    // 25 hits in one call: over the marketing rule's 5 a day, within the number's 100.
    let answer = client
        .should_rate_limit(RateLimitRequest {
            hits_addend: 25,
            ..marketing("2065550100")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, RlsCode::OverLimit as i32);
    let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [0, 75]);
}

/// A rule of `unit: day` is a day's quota: spent before a restart, spent after it.
#[tokio::test]
async fn a_day_rule_is_as_spent_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let remaining = |answer: RateLimitResponse| -> Vec<u32> {
        answer.statuses.iter().map(|s| s.limit_remaining).collect()
    };
    let server = start(&dir, "");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let spent = RateLimitRequest {
        hits_addend: 25,
        ..marketing("2065550100")
    };
    let answer = client.should_rate_limit(spent).await.unwrap().into_inner();
    assert_eq!(remaining(answer), [0, 75]);
    server.signal("TERM");
    assert!(server.wait().0.success());

    let server = start(&dir, "");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let answer = client
        .should_rate_limit(marketing("2065550100"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, RlsCode::OverLimit as i32);
    assert_eq!(remaining(answer), [0, 74]);
}

#[tokio::test]
async fn envoy_rate_limit_service_answers_from_the_reference_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir, "response_headers = true\n");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    for remaining in [4u32, 3, 2, 1, 0] {
        let answer = client
            .should_rate_limit(marketing("2061234567"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.overall_code, RlsCode::Ok as i32);
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, remaining);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (5, 4)); // 4 = DAY
        let reset = status.duration_until_reset.as_ref().unwrap().seconds;
        assert!((1..=86_400).contains(&reset), "{reset}");
        let headers: Vec<(&str, &str)> = answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(headers[1], ("RateLimit-Remaining", &*remaining.to_string()));
    }
    let sixth = client
        .should_rate_limit(marketing("2061234567"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sixth.overall_code, RlsCode::OverLimit as i32);
    assert_eq!(sixth.statuses[0].code, RlsCode::OverLimit as i32);
    assert_eq!(sixth.statuses[1].limit_remaining, 94);

    // The rules are policies: listed, read-only, and their held-back keys shown.
    let policy = "rls:messaging.message_type_marketing.to_number";
    let listed = reqwest::get(server.url(&format!("/v1/policies/{policy}")))
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let body: serde_json::Value = listed.json().await.unwrap();
    assert_eq!(body["fixed_window"]["limit"], 5);
    assert_eq!(body["fixed_window"]["window"], "1d");
    let put = reqwest::Client::new()
        .put(server.url(&format!("/v1/policies/{policy}")))
        .json(&serde_json::json!({"on_exhausted": "reject", "fixed_window": {"limit": 50, "window": "1d"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 409);
    assert!(put.text().await.unwrap().contains("YAML"));
    let throttles: serde_json::Value = reqwest::get(server.url("/v1/throttles"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = throttles["rows"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["policy"] == policy
                && r["key"] == "message_type=marketing, to_number=2061234567"),
        "{throttles}"
    );
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"weir_rls_hits_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} 6"#,
        r#"weir_rls_over_limit_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} 1"#,
        r#"weir_rls_within_limit_total{domain="messaging",rule="messaging.to_number"} 6"#,
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_leave_the_port_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir, "");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let bad = [
        RateLimitRequest {
            domain: "messaging".into(),
            descriptors: Vec::new(),
            hits_addend: 0,
        },
        RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("to_number", "1")])],
            hits_addend: 0,
        },
    ];
    // (More hits than a rule's limit are not malformed: they are counted and over it, as the
    // reference server counts them; see `a_cost_above_a_limit_is_counted_and_over_limit_over_grpc`.)
    for round in 0..200 {
        let request = bad[round % bad.len()].clone();
        let status = client.should_rate_limit(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(!status.message().is_empty());
    }
    // Hits no window can count are refused for what they are, not against a made-up limit.
    let mut huge = descriptor(&[("to_number", "1")]);
    huge.hits_addend = Some(u64::MAX);
    let status = client
        .should_rate_limit(RateLimitRequest {
            domain: "messaging".into(),
            descriptors: vec![huge],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert!(
        status.message().contains("18446744073709551615 hits")
            && status.message().contains("at most 4294967295"),
        "{status:?}"
    );
    assert!(!status.message().contains("limit of"), "{status:?}");
    // One call carries at most `[rls] max_descriptors` (64): more are refused whole.
    let many = RateLimitRequest {
        domain: "messaging".into(),
        descriptors: (0..65)
            .map(|n| descriptor(&[("to_number", &n.to_string())]))
            .collect(),
        hits_addend: 0,
    };
    let status = client.should_rate_limit(many).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("65 descriptors") && status.message().contains("max_descriptors"),
        "{status:?}"
    );
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "weir.v1.Weir",
    ] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, ServingStatus::Serving as i32, "{service}");
    }
    // Nothing of the bad requests was counted.
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "messaging".into(),
            descriptors: vec![descriptor(&[("to_number", "1")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.statuses[0].limit_remaining, 99);
}

#[tokio::test]
async fn a_node_without_rules_does_not_offer_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start("", &dir.path().join("data"));
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let status = client.should_rate_limit(marketing("1")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
}

/// `weir check-config CONFIG --rls-config RULES`: whether it passed, and what it printed.
fn check_config(config: &std::path::Path, rules: &std::path::Path) -> (bool, String) {
    let checked = weir()
        .arg("check-config")
        .arg(config)
        .arg("--rls-config")
        .arg(rules)
        .output()
        .unwrap();
    (
        checked.status.success(),
        String::from_utf8_lossy(&checked.stdout).into_owned(),
    )
}

#[test]
fn bad_rules_stop_the_start_and_check_config_names_each_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n  - key: a\n",
    )
    .unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, "").unwrap();
    let (passed, out) = check_config(&config, &rules);
    assert!(!passed);
    assert!(
        out.contains("rules.yaml:4:") && out.contains("fortnight"),
        "{out}"
    );
    assert!(
        out.contains("rules.yaml:5:") && out.contains("twice"),
        "{out}"
    );
    assert!(out.contains("2 problem(s)"), "{out}");

    let served = weir()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--rls-config")
        .arg(&rules)
        .output()
        .unwrap();
    assert!(!served.status.success());
    let err = String::from_utf8_lossy(&served.stderr);
    assert!(
        err.contains("rules.yaml:4:") && err.contains("fortnight"),
        "{err}"
    );

    // What only building the rules' policies finds: a token bucket faster than a nanosecond.
    std::fs::write(
        &rules,
        "domain: fast\ndescriptors:\n  - key: k\n    weir_algorithm: token_bucket\n    rate_limit: { unit: second, requests_per_unit: 4000000000 }\n",
    )
    .unwrap();
    let (passed, out) = check_config(&config, &rules);
    assert!(!passed);
    assert!(
        out.contains("rls:fast.k") && out.contains("token_bucket.rate"),
        "{out}"
    );

    std::fs::write(&rules, RULES).unwrap();
    let (passed, out) = check_config(&config, &rules);
    assert!(passed, "{out}");
    assert!(out.contains("1 RLS domain(s), 2 counted rule(s)"), "{out}");
}

/// A client that fills a rule's key table with day-long keys does not lock out everyone else
/// for the day: past `[rls] max_keys` each newcomer is counted in the rule's sketch, held to
/// its own limit there (not one bucket shared by all newcomers, which five would spend).
#[tokio::test]
async fn a_full_key_table_does_not_lock_out_newcomers() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir, "max_keys = 200\n");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let over = |answer: &weir_api::envoy::service::ratelimit::v3::RateLimitResponse| {
        answer.overall_code == RlsCode::OverLimit as i32
    };
    // The attacker: 200 numbers, each spent to its day limit of 5 marketing messages.
    let spend = |number: String, hits: u32| RateLimitRequest {
        domain: "messaging".into(),
        descriptors: vec![descriptor(&[
            ("message_type", "marketing"),
            ("to_number", &number),
        ])],
        hits_addend: hits,
    };
    for n in 0..200 {
        let answer = client
            .should_rate_limit(spend(format!("attacker{n}"), 5))
            .await
            .unwrap()
            .into_inner();
        assert!(!over(&answer), "attacker{n}");
    }
    // 100 newcomers, one message each: every one goes through (a shared overflow bucket of
    // 5 a day would have let five through).
    let mut admitted = 0;
    for n in 0..100 {
        let answer = client
            .should_rate_limit(spend(format!("newcomer{n}"), 1))
            .await
            .unwrap()
            .into_inner();
        admitted += u32::from(!over(&answer));
    }
    assert_eq!(admitted, 100);
    // And each is held to its own limit in the sketch: of a newcomer's six messages at most
    // five go through, its sixth never (the sketch errs strict: a key whose words are all
    // shared may lose one of its five, which a hundred keys in 1 024 words a row make rare).
    let mut through = 1;
    for _ in 0..5 {
        let answer = client
            .should_rate_limit(spend("newcomer0".into(), 1))
            .await
            .unwrap()
            .into_inner();
        through += u32::from(!over(&answer));
    }
    assert!((4..=5).contains(&through), "{through} of 6 went through");
    let metrics = reqwest::get(format!("{}/metrics", server.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sketched: u64 = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "weir_sketched_total{policy=\"rls:messaging.message_type_marketing.to_number\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sketched counter for the rule:\n{metrics}"));
    assert_eq!(sketched, 105);
}

/// With a data token, Envoy's rate limit service asks for it too (Envoy sends it as the
/// service's `initial_metadata`): the quota of a rule is the data plane's, not anyone's.
#[tokio::test]
async fn the_data_token_guards_the_rate_limit_service() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let config = format!("[rls]\nconfig = {:?}\n", rules.display().to_string());
    let token = "a-data-token-of-some-length";
    let server = Server::start_with(
        &config,
        &dir.path().join("data"),
        &[("WEIR_DATA_TOKEN", token)],
    );
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let refused = client
        .should_rate_limit(marketing("2061234567"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let mut with_token = tonic::Request::new(marketing("2061234567"));
    with_token
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let answer = client
        .should_rate_limit(with_token)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, RlsCode::Ok as i32);
}

/// One call of `entries` in `domain`: its code, and whether a limit decided it.
async fn ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    entries: &[(&str, &str)],
) -> (i32, bool) {
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: vec![descriptor(entries)],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    (
        answer.overall_code,
        answer.statuses[0].current_limit.is_some(),
    )
}

/// `weir_rls_reloads_total{outcome}` as `/metrics` shows it.
async fn rule_reloads(server: &Server, outcome: &str) -> u64 {
    counter(
        server,
        &format!("weir_rls_reloads_total{{outcome=\"{outcome}\"}}"),
    )
    .await
}

const RELOAD_RULES: &str = "domain: reload\ndescriptors:\n  - key: key1\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";

#[tokio::test]
async fn rules_added_or_changed_in_their_directory_apply_live_keeping_counts() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("messaging.yaml"), RULES).unwrap();
    let config = format!("[rls]\nconfig = {:?}\n", rules.display().to_string());
    let server = Server::start(&config, &dir.path().join("data"));
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    // Two of the marketing rule's five spent; `key1` has no rule yet.
    for _ in 0..2 {
        client.should_rate_limit(marketing("1")).await.unwrap();
    }
    assert_eq!(
        ask(&mut client, "reload", &[("key1", "a")]).await,
        (RlsCode::Ok as i32, false)
    );

    // A file added to the directory: its domain applies, without a restart.
    std::fs::write(rules.join("reload.yaml"), RELOAD_RULES).unwrap();
    eventually(
        Duration::from_secs(5),
        "the added rules file applied",
        || {
            let mut client = client.clone();
            async move { ask(&mut client, "reload", &[("key1", "a")]).await.1 }
        },
    )
    .await;
    assert_eq!(
        ask(&mut client, "reload", &[("key1", "a")]).await.0,
        RlsCode::OverLimit as i32
    );

    // The marketing limit cut from 5 to 3: the rule is reshaped, not restarted, so with two
    // spent one is left (a new counter would give three).
    std::fs::write(
        rules.join("messaging.yaml"),
        RULES.replace("requests_per_unit: 5", "requests_per_unit: 3"),
    )
    .unwrap();
    let policy = "/v1/policies/rls:messaging.message_type_marketing.to_number";
    eventually(
        Duration::from_secs(5),
        "the changed limit applied",
        || async {
            let body: serde_json::Value = reqwest::get(server.url(policy))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["fixed_window"]["limit"] == 3
        },
    )
    .await;
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..2 {
            let answer = client.should_rate_limit(marketing("1")).await.unwrap();
            codes.push(answer.into_inner().overall_code);
        }
        codes
    };
    assert_eq!(codes, [RlsCode::Ok as i32, RlsCode::OverLimit as i32]);
    assert!(rule_reloads(&server, "applied").await >= 2);

    // A bad file keeps the running rules, is counted, and the node stays ready.
    let failed_before = rule_reloads(&server, "failed").await;
    std::fs::write(
        rules.join("reload.yaml"),
        "domain: reload\ndescriptors:\n  - key: key1\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the bad file counted", || async {
        rule_reloads(&server, "failed").await > failed_before
    })
    .await;
    assert_eq!(
        ask(&mut client, "reload", &[("key1", "b")]).await,
        (RlsCode::Ok as i32, true)
    );
    assert_eq!(
        ask(&mut client, "reload", &[("key1", "b")]).await.0,
        RlsCode::OverLimit as i32
    );
    let ready = reqwest::get(server.url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn a_configmap_swap_of_the_rules_applies_and_removes_what_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("rules");
    std::fs::create_dir(&mount).unwrap();
    publish(&mount, "first", &[("messaging.yaml", RULES)]);
    let config = format!("[rls]\nconfig = {:?}\n", mount.display().to_string());
    let server = Server::start(&config, &dir.path().join("data"));
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    assert!(ask(&mut client, "messaging", &[("to_number", "1")]).await.1);

    // The next version of the ConfigMap holds the other domain only.
    publish(&mount, "second", &[("reload.yaml", RELOAD_RULES)]);
    std::fs::remove_file(mount.join("messaging.yaml")).unwrap();
    eventually(Duration::from_secs(5), "the swapped rules applied", || {
        let mut client = client.clone();
        async move { ask(&mut client, "reload", &[("key1", "a")]).await.1 }
    })
    .await;
    assert_eq!(
        ask(&mut client, "messaging", &[("to_number", "1")]).await,
        (RlsCode::Ok as i32, false)
    );
    let gone = reqwest::get(server.url("/v1/policies/rls:messaging.to_number"))
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
}
