//! The unit tests of `config.rs`.

use super::*;
use weir::policy::{KeyedSpec, Limiter};

fn problems_of(text: &str) -> Vec<String> {
    ConfigFile::parse(text)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn every_unknown_field_of_a_policy_is_listed_with_the_name_meant() {
    let problems = problems_of(
        "[server]\nheader_timout = \"5s\"\n\n[[policy]]\nname = \"p\"\non_exausted = \"reject\"\ntoken_bucket = { rate = 1, burts = 2 }\n\n[[policy]]\nname = \"q\"\nstrict = { qps = 0 }\n",
    );
    let joined = problems.join("\n");
    assert!(
        joined.contains("unknown field `header_timout` (did you mean `header_timeout`?)"),
        "{joined}"
    );
    assert!(
        joined.contains("policy `p`: unknown field `on_exausted` (did you mean `on_exhausted`?)"),
        "{joined}"
    );
    assert!(
        joined.contains("policy `p`: unknown field `burts` (did you mean `burst`?)"),
        "{joined}"
    );
    // The other policy's own problem is found too, and nothing is said twice.
    assert!(joined.contains("policy `q`"), "{joined}");
    assert_eq!(problems.len(), 4, "{joined}");
}

#[test]
fn a_month_is_not_a_window_and_a_bare_number_is_not_a_wait() {
    let problems = problems_of(
        "[[policy]]\nname = \"w\"\nfixed_window = { limit = 60, window = \"1M\" }\n\n[[policy]]\nname = \"t\"\nmax_wait = \"5\"\ntoken_bucket = { rate = 1, burst = 1 }\n",
    );
    let joined = problems.join("\n");
    assert!(joined.contains("`1M` is not a duration"), "{joined}");
    assert!(joined.contains("for minutes write `m`"), "{joined}");
    assert!(
        joined.contains("`5` is not a duration: a number needs a unit"),
        "{joined}"
    );
    assert!(
        joined.contains("\"5s\""),
        "the form expected is shown: {joined}"
    );
}

#[test]
fn listen_addresses_may_name_a_host() {
    assert_eq!(
        listen_address("localhost:8080").unwrap(),
        "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        listen_address("[::1]:80").unwrap(),
        "[::1]:80".parse::<SocketAddr>().unwrap()
    );
    let config = ConfigFile::parse("[server]\nhttp = \"localhost:9000\"\n").unwrap();
    assert_eq!(config.server.http.port(), 9000);
    for (bad, says) in [
        ("8080", "give HOST:PORT or IP:PORT"),
        ("localhost:http", "is not a port"),
        ("no-such-host.invalid:80", "could not be resolved"),
    ] {
        let error = listen_address(bad).unwrap_err();
        assert!(error.contains(says), "{bad}: {error}");
    }
}

#[test]
fn the_embedded_default_is_valid_and_on_loopback() {
    let config = ConfigFile::parse(DEFAULT_CONFIG).expect("the default config is valid");
    assert!(config.server.http.ip().is_loopback());
    assert!(config.server.grpc.ip().is_loopback());
    let names: Vec<_> = config.policy.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["getpage", "ms-host", "tables", "search", "ms-tables"]
    );
    // One per kind of limiter.
    assert!(
        config
            .policy
            .iter()
            .any(|p| matches!(p.limiter, Limiter::Keyed(KeyedSpec::LeakyBucket(_))))
    );
    assert!(
        config
            .policy
            .iter()
            .any(|p| matches!(p.limiter, Limiter::Keyed(KeyedSpec::TokenBucket(_))))
    );
    assert!(
        config
            .policy
            .iter()
            .any(|p| matches!(p.limiter, Limiter::Keyed(KeyedSpec::Strict(_))))
    );
    assert!(
        config
            .policy
            .iter()
            .any(|p| matches!(p.limiter, Limiter::Keyed(KeyedSpec::Concurrency(_))))
    );
    assert!(
        config
            .policy
            .iter()
            .any(|p| matches!(p.limiter, Limiter::Adaptive(_)))
    );
}

#[test]
fn every_problem_is_reported_with_its_place() {
    let problems = ConfigFile::parse(
        r#"
        [server]
        node_id = ""
        max_cost = 0

        [[policy]]
        name = "a"
        strict = { qps = -1 }

        [[policy]]
        name = "a"
        token_bucket = { rate = 1, burst = 0 }
        "#,
    )
    .unwrap_err();
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        [
            "`server.node_id` must not be empty",
            "`server.max_cost` must be at least 1",
            "policy `a`: `strict.qps` must be a finite number greater than zero, got -1",
            "policy `a`: `token_bucket.burst` must be greater than zero",
            "policy `a`: `name` is used by more than one policy",
        ]
    );
    let syntax = ConfigFile::parse("[server]\nhttp = 5").unwrap_err();
    assert!(syntax[0].to_string().contains("http"), "{}", syntax[0]);
}

#[test]
fn a_redis_scoped_policy_needs_a_redis_and_a_shape_redis_keeps() {
    let policies = "[[policy]]\nname = \"r\"\nscope = \"redis\"\ntoken_bucket = { rate = 1 }\n\n[[policy]]\nname = \"s\"\nscope = \"redis\"\nsliding_window = { limit = 5, window = \"1m\" }\n\n[[policy]]\nname = \"c\"\nscope = \"redis\"\ntoken_bucket = { rate = 1, per_core = true }\n";
    let problems = problems_of(policies).join("\n");
    assert!(
        problems.contains("policy `r`: `scope` is `redis`, but no `[redis]` names a Redis"),
        "{problems}"
    );
    assert!(
        problems.contains("`redis` is for token and leaky buckets, strict limiters and fixed windows, not `sliding_window`"),
        "{problems}"
    );
    assert!(
        problems.contains("policy `c`: `scope` `redis` shares one bucket between every node"),
        "{problems}"
    );
    let with_redis = format!("[redis]\nurl = \"redis://127.0.0.1:6379\"\n{policies}");
    let problems = problems_of(&with_redis).join("\n");
    assert!(!problems.contains("no `[redis]`"), "{problems}");
    assert!(problems.contains("not `sliding_window`"), "{problems}");
}

#[test]
fn the_redis_protocol_s_settings_are_read_from_resp_and_still_from_their_old_names() {
    let config = ConfigFile::parse(
        "[resp]\nlisten = \"localhost:6380\"\nmax_keys = 5\nidle_timeout = \"30s\"\n",
    )
    .unwrap();
    assert_eq!(config.resp.listen, Some("127.0.0.1:6380".parse().unwrap()));
    assert_eq!(config.resp.max_keys, 5);
    assert_eq!(config.resp.idle_timeout, Duration::from_secs(30));
    assert!(config.old_names.is_empty());

    // A config written before `[resp]` loads as it did, each old name noted.
    let old = ConfigFile::parse(
        "[server]\nresp = \"localhost:6380\"\nresp_max_keys = 5\nresp_idle_timeout = \"30s\"\n",
    )
    .unwrap();
    assert_eq!(old.resp, config.resp);
    assert_eq!(
        old.old_names,
        [
            ("server.resp", "resp.listen"),
            ("server.resp_max_keys", "resp.max_keys"),
            ("server.resp_idle_timeout", "resp.idle_timeout"),
        ]
        .map(|(old, new)| (old.to_owned(), new.to_owned()))
    );
    // Written back, it has the new names only.
    let written = toml::to_string(&old).unwrap();
    assert!(!written.contains("resp_max_keys"), "{written}");
    assert!(written.contains("[resp]"), "{written}");

    assert_eq!(
        problems_of("[server]\nresp_max_keys = 5\n[resp]\nmax_keys = 6\n"),
        [
            "`resp.max_keys` is given, and so is its old name `server.resp_max_keys`: keep `resp.max_keys` only"
        ]
    );
    assert_eq!(
        problems_of("[resp]\nmax_keys = 0\n"),
        ["`resp.max_keys` must be at least 1"]
    );
}
