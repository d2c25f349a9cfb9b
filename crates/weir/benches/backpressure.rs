//! The cost backpressure adds to a call that is not throttled.
//!
//! Run with `cargo bench -p weir --bench backpressure`:
//!
//! - `before_call` when nothing is limited, and on a key with no limit while another key is;
//! - `after_call` recording a call, with 10 000 keys tracked;
//! - a whole call through `ThrottleLayer` around a service that answers at once, against the
//!   bare service: the difference is what the layer adds per call;
//! - `HostLimiter::try_acquire` on a known RPC type whose bucket never runs dry.
//!
//! Futures that complete on their first poll are polled once with a no-op waker, so no runtime
//! is measured.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Layer, Service, service_fn};
use weir::SystemClock;
use weir::backpressure::host::{HostLimiter, HostLimitsConfig};
use weir::backpressure::{AdaptiveConfig, Backpressure};
use weir::layer::ThrottleLayer;

/// Polls a future that is expected to be ready at once.
fn ready<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the benchmarked future was not ready at once"),
    }
}

fn controller() -> Arc<Backpressure<SystemClock>> {
    let bp = Backpressure::new(
        AdaptiveConfig {
            enabled: true,
            top_k: 1,
            ..AdaptiveConfig::default()
        },
        SystemClock::new(),
    )
    .expect("valid config");
    // 10 000 tracked keys, one of them limited.
    for i in 0..10_000 {
        bp.after_call("PREPARE_ROWSET", &format!("table-{i}"));
    }
    for _ in 0..100 {
        bp.after_call("PREPARE_ROWSET", "table-hot");
    }
    assert!(bp.on_busy());
    Arc::new(bp)
}

fn calls(c: &mut Criterion) {
    let bp = controller();
    let keys: Vec<String> = (0..10_000).map(|i| format!("table-{i}")).collect();
    let mut group = c.benchmark_group("backpressure");

    let idle = Backpressure::new(
        AdaptiveConfig {
            enabled: true,
            ..AdaptiveConfig::default()
        },
        SystemClock::new(),
    )
    .expect("valid config");
    group.bench_function("before_call_nothing_limited", |b| {
        b.iter(|| ready(idle.before_call(black_box("PREPARE_ROWSET"), black_box("table-42"))))
    });
    group.bench_function("before_call_unlimited_key", |b| {
        b.iter(|| ready(bp.before_call(black_box("PREPARE_ROWSET"), black_box("table-42"))))
    });
    let mut i = 0;
    group.bench_function("after_call_10k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            bp.after_call(black_box("PREPARE_ROWSET"), black_box(&keys[i]))
        })
    });

    let service = service_fn(|request: http::Request<()>| async move {
        black_box(request);
        Ok::<_, Infallible>(http::Response::new(()))
    });
    let mut bare = service;
    group.bench_function("bare_service_call", |b| {
        b.iter(|| ready(bare.call(http::Request::new(()))))
    });
    let target = |request: &http::Request<()>| {
        let _ = request;
        Some(("PREPARE_ROWSET".to_owned(), "table-42".to_owned()))
    };
    let mut layered = ThrottleLayer::new(Arc::clone(&bp), target).layer(service);
    group.bench_function("throttle_layer_call", |b| {
        b.iter(|| ready(layered.call(http::Request::new(()))))
    });
    group.finish();
}

fn host(c: &mut Criterion) {
    let host = HostLimiter::new(
        HostLimitsConfig {
            enabled: true,
            default_qps: 1e9,
            ..HostLimitsConfig::default()
        },
        &["PREPARE_ROWSET"],
        1,
        SystemClock::new(),
    )
    .expect("valid config");
    c.bench_function("host/try_acquire", |b| {
        b.iter(|| black_box(host.try_acquire(black_box("PREPARE_ROWSET")).is_ok()))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = calls, host
}
criterion_main!(benches);
