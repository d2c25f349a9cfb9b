//! The tower layers around toy services, on a paused clock.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tower::{Layer, Service, ServiceExt, service_fn};
use weir::TokioClock;
use weir::backpressure::host::{HostLimiter, HostLimitsConfig};
use weir::backpressure::{AdaptiveConfig, Backpressure, Control};
use weir::layer::{BusyWhen, Extracted, PolicyLayer, ThrottleLayer};
use weir::policy::{Policy, PolicyConfig};

type Req = http::Request<String>;
type Res = http::Response<String>;

/// The RPC type and the table come from headers.
fn target(request: &Req) -> Option<(String, String)> {
    let header = |name| {
        request
            .headers()
            .get(name)?
            .to_str()
            .ok()
            .map(str::to_owned)
    };
    Some((header("rpc")?, header("table")?))
}

/// Waits until `service` is ready and sends it `request` (every service here is infallible).
async fn send<S>(service: &mut S, request: Req) -> S::Response
where
    S: Service<Req>,
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

fn call(rpc: &str, table: &str) -> Req {
    http::Request::builder()
        .header("rpc", rpc)
        .header("table", table)
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn busy_answers_throttle_the_hot_table_and_clones_share_the_state() {
    let backpressure = Arc::new(
        Backpressure::new(
            AdaptiveConfig {
                enabled: true,
                control: Control::Stepwise,
                ratio: 0.5,
                top_k: 1,
                ..AdaptiveConfig::default()
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    let busy = Arc::new(AtomicBool::new(false));
    let server = {
        let busy = Arc::clone(&busy);
        service_fn(move |_request: Req| {
            let status = if busy.load(Ordering::Relaxed) {
                503
            } else {
                200
            };
            async move {
                Ok::<_, Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(String::new())
                        .unwrap(),
                )
            }
        })
    };
    let layer = ThrottleLayer::new(Arc::clone(&backpressure), target);
    let mut client = layer.layer(server);
    // 30 calls to the hot table, 3 to a cold one, in the window: 10 and 1 qps.
    for _ in 0..30 {
        send(&mut client, call("PREP", "hot")).await;
    }
    for _ in 0..3 {
        send(&mut client, call("PREP", "cold")).await;
    }
    busy.store(true, Ordering::Relaxed);
    let answer = send(&mut client, call("PREP", "cold")).await;
    assert_eq!(answer.status(), 503);
    busy.store(false, Ordering::Relaxed);
    assert_eq!(
        backpressure.limit("PREP", "hot"),
        Some(5.0),
        "the hot table, halved"
    );
    assert_eq!(
        backpressure.limit("PREP", "cold"),
        None,
        "the cold one untouched"
    );

    // A clone of the service is throttled by the same limits: 5 qps = 200 ms apart.
    let mut clone = client.clone();
    let start = tokio::time::Instant::now();
    for _ in 0..3 {
        send(&mut clone, call("PREP", "hot")).await;
    }
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    let before = tokio::time::Instant::now();
    send(&mut clone, call("PREP", "cold")).await;
    assert_eq!(before.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn host_limits_apply_per_rpc_type_and_a_custom_classifier_works() {
    let backpressure =
        Arc::new(Backpressure::new(AdaptiveConfig::default(), TokioClock::new()).unwrap());
    let host = Arc::new(
        HostLimiter::new(
            HostLimitsConfig {
                default_qps: 10.0,
                ..Default::default()
            },
            &[],
            1,
            TokioClock::new(),
        )
        .unwrap(),
    );
    let server = service_fn(|_request: Req| async { Ok::<_, Infallible>(Res::default()) });
    let signalled = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&signalled);
    let layer = ThrottleLayer::new(backpressure, target)
        .host_limits(host)
        .busy_when(BusyWhen(move |_: &Result<Res, Infallible>| {
            seen.store(true, Ordering::Relaxed);
            false
        }));
    let mut client = layer.layer(server);
    let start = tokio::time::Instant::now();
    for _ in 0..11 {
        send(&mut client, call("COMMIT", "t")).await;
    }
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "the 11th waited for a token"
    );
    assert!(signalled.load(Ordering::Relaxed));
}

#[tokio::test(start_paused = true)]
async fn a_call_slower_than_the_threshold_is_a_busy_signal() {
    let backpressure = Arc::new(
        Backpressure::new(
            AdaptiveConfig {
                enabled: true,
                top_k: 1,
                ..AdaptiveConfig::default()
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    // The backend answers 200 always, after the delay the request names, in milliseconds.
    let server = service_fn(|request: Req| async move {
        let ms: u64 = request.body().parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, Infallible>(Res::default())
    });
    let layer = ThrottleLayer::new(Arc::clone(&backpressure), target)
        .busy_when_slower_than(Duration::from_millis(250));
    let mut client = layer.layer(server);
    let timed = |table: &str, ms: u64| {
        http::Request::builder()
            .header("rpc", "PREP")
            .header("table", table)
            .body(ms.to_string())
            .unwrap()
    };
    // A window of calls first: a slow answer is only taken once the rate it is at is known.
    for _ in 0..30 {
        send(&mut client, timed("hot", 0)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    send(&mut client, timed("cold", 249)).await;
    assert_eq!(backpressure.stats().busy_signals, 0, "249 ms is under 250");
    assert_eq!(backpressure.limit("PREP", "hot"), None);
    send(&mut client, timed("cold", 250)).await;
    let stats = backpressure.stats();
    assert_eq!(stats.busy_signals, 1, "250 ms is slow");
    assert_eq!(stats.upgrades, 1);
    assert!(
        backpressure.limit("PREP", "hot").is_some(),
        "the slow answer tightened the hot table"
    );
    assert_eq!(backpressure.limit("PREP", "cold"), None);
}

fn policy(text: &str) -> Arc<Policy<TokioClock>> {
    let config: PolicyConfig = toml::from_str(text).unwrap();
    Arc::new(Policy::with_cores(config, TokioClock::new(), 1).unwrap())
}

fn tenant(request: &Req) -> Option<Extracted> {
    let tenant = request.headers().get("tenant")?.to_str().ok()?;
    Some(Extracted::key(tenant))
}

fn from(tenant: &str, grpc: bool) -> Req {
    let mut builder = http::Request::builder().header("tenant", tenant);
    if grpc {
        builder = builder.header("content-type", "application/grpc");
    }
    builder.body(String::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_policy_layer_sheds_with_429_or_resource_exhausted() {
    let p =
        policy("name = \"api\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 2, burst = 1 }");
    let server = service_fn(|_request: Req| async { Ok::<_, Infallible>(Res::new("ok".into())) });
    let mut service = PolicyLayer::new(Arc::clone(&p), tenant).layer(server);

    let ok = send(&mut service, from("a", false)).await;
    assert_eq!(
        (ok.status(), ok.body().as_str()),
        (http::StatusCode::OK, "ok")
    );
    let shed = send(&mut service, from("a", false)).await;
    assert_eq!(shed.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        shed.headers()["retry-after"],
        "1",
        "500 ms, rounded up to a second"
    );
    let grpc = send(&mut service, from("a", true)).await;
    assert_eq!(grpc.status(), http::StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "8");
    assert!(
        grpc.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("policy `api`")
    );
    // Another tenant is not affected; a request without a tenant passes, counted as unkeyed.
    let other = send(&mut service, from("b", false)).await;
    assert_eq!(other.status(), http::StatusCode::OK);
    let anonymous = http::Request::new(String::new());
    let passed = send(&mut service, anonymous).await;
    assert_eq!(passed.status(), http::StatusCode::OK);
    let stats = p.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.unkeyed), (2, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn permits_are_released_when_the_response_completes_or_is_dropped() {
    let p =
        policy("name = \"inflight\"\non_exhausted = \"reject\"\nconcurrency = { node_limit = 1 }");
    let server = service_fn(|_request: Req| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, Infallible>(Res::default())
    });
    let mut service = PolicyLayer::new(Arc::clone(&p), tenant).layer(server);

    let slow = service.ready().await.unwrap().call(from("a", false));
    let slow = tokio::spawn(slow);
    tokio::task::yield_now().await;
    assert_eq!(p.stats().in_flight, 1);
    let shed = send(&mut service, from("a", false)).await;
    assert_eq!(shed.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert!(
        shed.headers().get("retry-after").is_none(),
        "no time can be promised"
    );
    slow.await.unwrap().unwrap();
    assert_eq!(
        p.stats().in_flight,
        0,
        "released when the response completed"
    );

    // A response future dropped half-way releases its permit too.
    let abandoned = service.ready().await.unwrap().call(from("a", false));
    let abandoned = tokio::spawn(abandoned);
    tokio::task::yield_now().await;
    assert_eq!(p.stats().in_flight, 1);
    abandoned.abort();
    let _ = abandoned.await;
    assert_eq!(p.stats().in_flight, 0);
    let ok = send(&mut service, from("a", false)).await;
    assert_eq!(ok.status(), http::StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_policy_delays_instead_of_shedding() {
    let p = policy("name = \"w\"\nmax_wait = \"1s\"\ntoken_bucket = { rate = 10, burst = 1 }");
    let server = service_fn(|_request: Req| async { Ok::<_, Infallible>(Res::default()) });
    let mut service = PolicyLayer::new(p, tenant).layer(server);
    let start = tokio::time::Instant::now();
    for _ in 0..3 {
        let ok = send(&mut service, from("a", false)).await;
        assert_eq!(ok.status(), http::StatusCode::OK);
    }
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}

/// Serves every request the mock receives with 200 at once, noting who was served and when.
fn answer_all(
    mut handle: tower_test::mock::Handle<Req, Res>,
) -> tokio::task::JoinHandle<Vec<(String, Duration)>> {
    let start = tokio::time::Instant::now();
    tokio::spawn(async move {
        let mut served = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let tenant = request.headers()["tenant"].to_str().unwrap().to_owned();
            served.push((tenant, start.elapsed()));
            respond.send_response(Res::default());
        }
        served
    })
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_its_turn_holds_no_permit_of_the_inner_service() {
    // One request at a time may reach the inner service; tenant `a` has one token a second.
    let p = policy(
        "name = \"wait\"\non_exhausted = \"wait\"\nmax_wait = \"10s\"\ntoken_bucket = { rate = 1, burst = 1 }",
    );
    let (mock, handle) = tower_test::mock::pair::<Req, Res>();
    let served = answer_all(handle);
    let inner = tower::limit::ConcurrencyLimit::new(mock, 1);
    let mut service = PolicyLayer::new(Arc::clone(&p), tenant).layer(inner);

    send(&mut service, from("a", false)).await;
    // `a`'s second request waits a second for its token, in the policy …
    let waiting = {
        let mut service = service.clone();
        tokio::spawn(async move { send(&mut service, from("a", false)).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(p.stats().waiters, 1);
    // … and meanwhile `b` gets through: the waiting request holds no permit of the inner
    // `ConcurrencyLimit` (it would, had readiness been reserved before the policy decided).
    send(&mut service, from("b", false)).await;
    assert!(!waiting.is_finished());
    waiting.await.unwrap();
    drop(service);
    let served = served.await.unwrap();
    let at = |ms| Duration::from_millis(ms);
    assert_eq!(
        served,
        vec![
            ("a".into(), at(0)),
            ("b".into(), at(0)),
            ("a".into(), at(1_000))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_says_nothing_until_a_window_of_calls_is_counted() {
    let backpressure = Arc::new(
        Backpressure::new(
            AdaptiveConfig {
                enabled: true,
                top_k: 1,
                ..AdaptiveConfig::default()
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    let server = service_fn(|_: Req| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, Infallible>(Res::default())
    });
    let mut client = ThrottleLayer::new(Arc::clone(&backpressure), target)
        .busy_when_slower_than(Duration::from_millis(250))
        .layer(server);
    send(&mut client, call("PREP", "hot")).await;
    let stats = backpressure.stats();
    assert_eq!(
        (stats.busy_signals, stats.upgrades),
        (1, 0),
        "the rate is not known yet"
    );
    assert_eq!(backpressure.limit("PREP", "hot"), None);
}

/// A backend slow on every call, at any load (a latency threshold set too low, or a far-away
/// backend): every answer is a busy signal, and none is ever quiet. The slow answers are
/// accepted calls, so the limits must hold near what the backend accepts, not be cut by each
/// signal down to the floor.
#[tokio::test(start_paused = true)]
async fn a_backend_slow_on_every_call_does_not_drive_the_limits_to_the_floor() {
    let backpressure = Arc::new(
        Backpressure::new(
            AdaptiveConfig {
                enabled: true,
                top_k: 1,
                upgrade_interval: Duration::from_secs(1),
                ..AdaptiveConfig::default()
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    let server = service_fn(|_: Req| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, Infallible>(Res::default())
    });
    let client = ThrottleLayer::new(Arc::clone(&backpressure), target)
        .busy_when_slower_than(Duration::from_millis(250))
        .layer(server);
    let mut callers = tokio::task::JoinSet::new();
    for (table, rate) in [("hot", 100u32), ("warm", 20)] {
        let client = client.clone();
        callers.spawn(async move {
            let mut calls = tokio::task::JoinSet::new();
            let mut interval = tokio::time::interval(Duration::from_secs(1) / rate);
            loop {
                interval.tick().await;
                let mut client = client.clone();
                calls.spawn(async move { send(&mut client, call("PREP", table)).await });
                while calls.try_join_next().is_some() {}
            }
        });
    }
    let mut lowest = f64::INFINITY;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lowest = lowest.min(backpressure.limit("PREP", "hot").unwrap_or(f64::INFINITY));
    }
    callers.abort_all();
    let stats = backpressure.stats();
    assert!(stats.busy_signals > 1000, "{stats:?}");
    assert!(stats.upgrades >= 1, "a slow answer still cuts: {stats:?}");
    // 120 calls a second accepted: the hot table keeps all but the headroom (5 % of 120) at
    // least, and the estimate stays at the accepted rate.
    assert!(
        lowest >= 100.0 - 2.0 * 0.05 * 120.0,
        "the hot limit fell to {lowest}"
    );
    assert!(
        stats.capacity.is_some_and(|c| c >= 110.0),
        "the estimate fell to {:?}",
        stats.capacity
    );
}
