use super::*;
use weir::limiter::window::Count;

fn settings(toml: &str) -> RedisSettings {
    toml::from_str(toml).unwrap()
}

#[test]
fn settings_name_one_redis_and_a_real_url() {
    assert!(
        settings("url = \"redis://127.0.0.1:6379\"")
            .problems()
            .is_empty()
    );
    assert!(
        settings("cluster = [\"redis://127.0.0.1:7000\"]")
            .problems()
            .is_empty()
    );
    let both = settings("url = \"redis://a:1\"\ncluster = [\"redis://b:2\"]").problems();
    assert_eq!(both[0].0, "url");
    assert!(both[0].1.contains("give one"), "{both:?}");
    let none = settings("on_unavailable = \"closed\"").problems();
    assert!(none[0].1.contains("is needed"), "{none:?}");
    let bad = settings("url = \"http://a:1\"\ntimeout = \"0s\"").problems();
    let fields: Vec<&str> = bad.iter().map(|(field, _)| *field).collect();
    assert_eq!(fields, ["url", "timeout"], "{bad:?}");
}

#[test]
fn batches_are_bounded_and_named_when_they_cannot_be() {
    let defaults = settings("url = \"redis://a:1\"");
    assert_eq!((defaults.batch_limit, defaults.batches_in_flight), (100, 4));
    assert!(
        settings("url = \"redis://a:1\"\nbatch_limit = 1\nbatches_in_flight = 1")
            .problems()
            .is_empty()
    );
    for (toml, field, says) in [
        ("batch_limit = 0", "batch_limit", "from 1 to 10000"),
        ("batch_limit = 10001", "batch_limit", "not 10001"),
        ("batches_in_flight = 0", "batches_in_flight", "at least 1"),
    ] {
        let problems = settings(&format!("url = \"redis://a:1\"\n{toml}")).problems();
        assert_eq!(problems.len(), 1, "{toml}: {problems:?}");
        assert_eq!(problems[0].0, field, "{problems:?}");
        assert!(problems[0].1.contains(says), "{problems:?}");
    }
}

#[test]
fn a_bucket_s_key_names_its_policy_kind_and_key_apart() {
    let redis = RedisBuckets::new(settings("url = \"redis://127.0.0.1:6379\"")).unwrap();
    assert_eq!(redis.key_of("p", None, "k"), "weir:p\u{1f}\u{1f}k");
    assert_eq!(
        redis.key_of("p", Some("bulk"), "k"),
        "weir:p\u{1f}bulk\u{1f}k"
    );
    // A key that looks like another policy's and kind's is still its own.
    assert_ne!(
        redis.key_of("p", None, "x\u{1f}k"),
        redis.key_of("p", Some("x"), "k")
    );
}

#[test]
fn every_shape_redis_keeps_has_its_arguments() {
    let day = Shape::Gcra {
        interval: 8_640_000_000_000,
        capacity: 10,
        initial: 4,
        fair: false,
    };
    assert_eq!(
        script::arguments(day, 2).unwrap(),
        ["g", "8640000000", "86400000000", "2", "51840000000"]
    );
    let window = Shape::Window {
        count: weir::limiter::fixed_window::COUNT,
        window: 60_000_000_000,
        limit: 100,
    };
    let counts_refused = if weir::limiter::fixed_window::COUNT.counts_refused() {
        "1"
    } else {
        "0"
    };
    assert_eq!(
        script::arguments(window, 1).unwrap(),
        ["w", "100", "60000000", "1", counts_refused]
    );
    let sliding: Count = weir::limiter::sliding_window::COUNT;
    assert!(
        script::arguments(
            Shape::Window {
                count: sliding,
                window: 60_000_000_000,
                limit: 100
            },
            1
        )
        .is_none()
    );
}

#[test]
fn tls_settings_that_cannot_hold_are_named_before_any_file_is_read() {
    let tls = "[tls]\nca = \"/nowhere/ca.crt\"\n";
    assert!(
        settings(&format!("url = \"rediss://u:p@127.0.0.1:6379\"\n{tls}"))
            .problems()
            .is_empty()
    );
    let plain = settings(&format!("url = \"redis://127.0.0.1:6379\"\n{tls}")).problems();
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert!(
        plain[0].1.contains("applies to `rediss://` URLs"),
        "{plain:?}"
    );
    let half = settings("url = \"rediss://h:1\"\n[tls]\ncert = \"c.pem\"\n").problems();
    assert!(
        half[0].1.contains("`cert` and `key` go together"),
        "{half:?}"
    );
    let sentinel = settings(&format!(
        "sentinel = {{ master = \"m\", nodes = [\"redis://h:26379\"] }}\n{tls}"
    ))
    .problems();
    assert!(
        sentinel[0].1.contains("`redis://h:26379` is not one"),
        "{sentinel:?}"
    );
    // A file that is not there stops the client being made, naming the setting and the file.
    let missing = RedisBuckets::new(settings(&format!("url = \"rediss://h:1\"\n{tls}")))
        .err()
        .unwrap()
        .to_string();
    assert!(
        missing.starts_with("[redis.tls] `ca`: reading /nowhere/ca.crt"),
        "{missing}"
    );
}
