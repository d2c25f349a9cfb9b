//! Adaptive backpressure end to end, on a paused clock: the upgrade/downgrade lifecycle, exactly.

use std::sync::Arc;
use std::time::Duration;

use weir::TokioClock;
use weir::backpressure::{AdaptiveConfig, Backpressure};

const PREP: &str = "PREPARE_ROWSET";

fn controller(config: AdaptiveConfig) -> Backpressure<TokioClock> {
    Backpressure::new(config, TokioClock::new()).unwrap()
}

/// The lifecycle example's settings: cooldown 5 s, quiet time 5 s, ratio 0.5, top 2.
fn lifecycle_config() -> AdaptiveConfig {
    AdaptiveConfig {
        enabled: true,
        top_k: 2,
        ratio: 0.5,
        floor: 1.0,
        upgrade_interval: Duration::from_secs(5),
        downgrade_interval: Duration::from_secs(5),
        ..AdaptiveConfig::default()
    }
}

/// Records `calls` completed calls of `key` now (a rate of `calls / 3` over the 3 s window).
fn calls(bp: &Backpressure<TokioClock>, key: &str, calls: usize) {
    for _ in 0..calls {
        bp.after_call(PREP, key);
    }
}

/// Moves one second on, ticking the controller as its ticker would.
async fn second(bp: &Backpressure<TokioClock>) -> bool {
    tokio::time::advance(Duration::from_secs(1)).await;
    bp.tick(1000)
}

fn limits(bp: &Backpressure<TokioClock>) -> Vec<(String, f64)> {
    bp.throttled()
        .into_iter()
        .map(|t| (t.key, t.qps_limit))
        .collect()
}

fn l(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
    pairs.iter().map(|&(k, q)| (k.to_owned(), q)).collect()
}

#[tokio::test(start_paused = true)]
async fn busy_signals_tighten_the_top_two_and_quiet_spells_undo_each_level() {
    let bp = controller(lifecycle_config());

    // t = 0: A at 100 qps, B at 80 → A limited to 50, B to 40.
    calls(&bp, "A", 300);
    calls(&bp, "B", 240);
    assert!(bp.on_busy());
    assert_eq!(limits(&bp), l(&[("A", 50.0), ("B", 40.0)]));

    // t = 2: busy again inside the 5 s cooldown → skipped.
    assert!(!second(&bp).await);
    assert!(!second(&bp).await);
    assert!(!bp.on_busy());

    // t = 6: the top 2 are now C (60) and A (50, throttled) → A 25, C 30.
    for _ in 3..=6 {
        assert!(!second(&bp).await);
    }
    calls(&bp, "A", 150);
    calls(&bp, "C", 180);
    assert!(bp.on_busy());
    assert_eq!(limits(&bp), l(&[("A", 25.0), ("B", 40.0), ("C", 30.0)]));

    // t = 11: quiet for 5 s → undo level 2: A back to 50, C's limit removed.
    for _ in 7..=10 {
        assert!(!second(&bp).await);
    }
    assert!(second(&bp).await);
    assert_eq!(limits(&bp), l(&[("A", 50.0), ("B", 40.0)]));

    // t = 16: another 5 s → undo level 1: A and B free.
    for _ in 12..=15 {
        assert!(!second(&bp).await);
    }
    assert!(second(&bp).await);
    assert!(limits(&bp).is_empty());

    let stats = bp.stats();
    assert_eq!(
        (
            stats.busy_signals,
            stats.upgrades,
            stats.downgrades,
            stats.level
        ),
        (3, 2, 2, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_at_1_qps_gets_calls_exactly_1_s_apart() {
    let bp = controller(AdaptiveConfig {
        ratio: 0.5,
        floor: 1.0,
        ..lifecycle_config()
    });
    calls(&bp, "hot", 6); // 2 qps → limited to 1
    assert!(bp.on_busy());
    assert_eq!(bp.limit(PREP, "hot"), Some(1.0));
    let start = tokio::time::Instant::now();
    assert_eq!(bp.before_call(PREP, "hot").await, Duration::ZERO);
    assert_eq!(bp.before_call(PREP, "hot").await, Duration::from_secs(1));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    // A cold key is never held back.
    assert_eq!(bp.before_call(PREP, "cold").await, Duration::ZERO);
    let stats = bp.stats();
    assert_eq!(stats.throttled_keys[PREP], 1);
    assert_eq!(stats.waits[PREP].0, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn dry_run_decides_and_records_but_never_waits() {
    let bp = controller(AdaptiveConfig {
        dry_run: true,
        ..lifecycle_config()
    });
    calls(&bp, "hot", 30);
    assert!(bp.on_busy());
    let start = tokio::time::Instant::now();
    bp.before_call(PREP, "hot").await;
    let would = bp.before_call(PREP, "hot").await;
    assert_eq!(would, Duration::from_millis(200), "5 qps: 200 ms apart");
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing slept");
    assert_eq!(bp.stats().waits[PREP].0, Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn disabled_by_default_and_switchable_live() {
    let bp = controller(AdaptiveConfig::default());
    calls(&bp, "hot", 300);
    assert!(!bp.on_busy(), "off by default");
    assert_eq!(bp.stats().busy_signals, 1, "signals are still counted");
    bp.reconfigure(AdaptiveConfig {
        enabled: true,
        ..AdaptiveConfig::default()
    })
    .unwrap();
    calls(&bp, "hot", 300);
    assert!(bp.on_busy());
    // Default ratio 0.75 of 100 qps.
    assert_eq!(bp.limit(PREP, "hot"), Some(75.0));
    let rejected = bp.reconfigure(AdaptiveConfig {
        ratio: 1.5,
        ..AdaptiveConfig::default()
    });
    assert_eq!(rejected.unwrap_err().field, "ratio");
    assert!(
        bp.config().enabled,
        "the rejected change left the old config in place"
    );
}

#[tokio::test(start_paused = true)]
async fn only_the_configured_rpc_types_take_part() {
    let bp = controller(AdaptiveConfig {
        rpcs: vec![PREP.to_owned()],
        ..lifecycle_config()
    });
    calls(&bp, "t", 300);
    for _ in 0..600 {
        bp.after_call("GET_TABLET_META", "t");
    }
    assert!(bp.on_busy());
    assert_eq!(bp.limit(PREP, "t"), Some(50.0));
    assert_eq!(bp.limit("GET_TABLET_META", "t"), None);
}

#[tokio::test(start_paused = true)]
async fn the_ticker_relaxes_limits_by_itself() {
    let bp = Arc::new(controller(lifecycle_config()));
    tokio::spawn(bp.ticker());
    calls(&bp, "A", 300);
    assert!(bp.on_busy());
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(bp.limit(PREP, "A"), Some(50.0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bp.limit(PREP, "A"), None, "relaxed after 5 quiet seconds");
    assert_eq!(bp.stats().downgrades, 1);
}
