//! Adaptive backpressure end to end, on a paused clock: the step-wise upgrade/downgrade
//! lifecycle, exactly (`control = "stepwise"`); the control's settings and a live switch between
//! the two controls.

use std::sync::Arc;
use std::time::Duration;

use weir::backpressure::{AdaptiveConfig, Backpressure, Control};
use weir::{ManualClock, SystemClock, TokioClock};

const PREP: &str = "PREPARE_ROWSET";

fn controller(config: AdaptiveConfig) -> Backpressure<TokioClock> {
    Backpressure::new(config, TokioClock::new()).unwrap()
}

/// The lifecycle example's settings: cooldown 5 s, quiet time 5 s, ratio 0.5, top 2.
fn lifecycle_config() -> AdaptiveConfig {
    AdaptiveConfig {
        enabled: true,
        control: Control::Stepwise,
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
        control: Control::Stepwise,
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

#[test]
fn the_control_and_its_tuning_are_validated_by_name() {
    let parsed: AdaptiveConfig = toml::from_str("control = \"stepwise\"").unwrap();
    assert_eq!(parsed.control, Control::Stepwise);
    let default: AdaptiveConfig = toml::from_str("").unwrap();
    assert_eq!(
        (default.control, default.increase, default.headroom),
        (Control::Converging, 1.05, 0.05)
    );
    let unknown = toml::from_str::<AdaptiveConfig>("control = \"fast\"").unwrap_err();
    assert!(
        unknown.to_string().contains("converging"),
        "the choices are named: {unknown}"
    );
    for (config, field) in [
        (
            AdaptiveConfig {
                increase: 1.0,
                ..AdaptiveConfig::default()
            },
            "increase",
        ),
        (
            AdaptiveConfig {
                increase: f64::NAN,
                ..AdaptiveConfig::default()
            },
            "increase",
        ),
        (
            AdaptiveConfig {
                headroom: 1.0,
                ..AdaptiveConfig::default()
            },
            "headroom",
        ),
        (
            AdaptiveConfig {
                headroom: -0.1,
                ..AdaptiveConfig::default()
            },
            "headroom",
        ),
    ] {
        let error = config.validate().unwrap_err();
        assert_eq!(error.field, field);
        assert!(
            error
                .to_string()
                .starts_with(&format!("`adaptive.{field}`"))
        );
    }
    // A config serialized and read back is the same config.
    let json = serde_json::to_string(&parsed).unwrap();
    assert_eq!(
        serde_json::from_str::<AdaptiveConfig>(&json).unwrap(),
        parsed
    );
}

#[tokio::test(start_paused = true)]
async fn switching_the_control_live_drops_every_limit() {
    let bp = controller(AdaptiveConfig {
        enabled: true,
        ..AdaptiveConfig::default()
    });
    calls(&bp, "A", 300);
    assert!(bp.on_busy());
    assert!(bp.limit(PREP, "A").is_some(), "converging by default");
    bp.reconfigure(lifecycle_config()).unwrap();
    assert!(
        limits(&bp).is_empty(),
        "the step-wise control starts afresh"
    );
    assert_eq!(bp.stats().capacity, None);
    // The step-wise control then works as specified: half the observed rate.
    calls(&bp, "A", 300);
    assert!(bp.on_busy());
    assert_eq!(limits(&bp), l(&[("A", 100.0)]));
}

/// Busy answers are a share of the calls of the RPC types taking part, all of them: an answer
/// to a type that does not take part is ignored, and keys past `max_keys` (counted together)
/// are in the total.
#[test]
fn busy_answers_and_calls_are_counted_over_the_same_rpc_types() {
    let clock = ManualClock::new(0);
    let bp = Backpressure::new(
        AdaptiveConfig {
            enabled: true,
            top_k: 1,
            max_keys: 2,
            rpcs: vec![PREP.to_owned()],
            ..AdaptiveConfig::default()
        },
        clock.clone(),
    )
    .unwrap();
    clock.set(3_000_000_000);
    for _ in 0..200 {
        bp.after_call(PREP, "hot");
    }
    for _ in 0..50 {
        bp.after_call(PREP, "warm");
    }
    // Fifty more keys, past `max_keys`: one call each.
    for i in 0..50 {
        bp.after_call(PREP, &format!("cold-{i}"));
    }
    for _ in 0..600 {
        bp.after_call("GET_TABLET_META", "t");
    }
    clock.set(4_500_000_000);
    for _ in 0..300 {
        assert!(!bp.on_busy_for("GET_TABLET_META"), "not taking part");
    }
    assert_eq!(bp.stats().busy_signals, 0);
    assert!(bp.throttled().is_empty());
    assert!(bp.on_busy_for(PREP));
    // 300 calls of PREPARE_ROWSET, one answered busy, over the last 1.5 s.
    let capacity = bp.stats().capacity.unwrap();
    assert!((capacity - 299.0 / 1.5).abs() < 1e-9, "{capacity}");
    // The hot key's share: the estimate less headroom less the other keys' 100 calls.
    let hot = bp.limit(PREP, "hot").unwrap();
    let share = capacity * 0.95 - 100.0 / 1.5;
    assert!((hot - share).abs() < 1e-9, "{hot} vs {share}");
}

/// `tick` and `reconfigure` take the config and the control state in the same order: run side
/// by side from two threads, with every tick deciding, they finish (with opposite orders they
/// deadlock within a few thousand rounds).
#[test]
fn ticking_and_reconfiguring_at_once_do_not_deadlock() {
    let config = AdaptiveConfig {
        enabled: true,
        window: Duration::from_millis(3),
        upgrade_interval: Duration::from_millis(1),
        downgrade_interval: Duration::from_millis(2),
        ..AdaptiveConfig::default()
    };
    let bp = Arc::new(Backpressure::new(config.clone(), SystemClock::default()).unwrap());
    let (done, finished) = std::sync::mpsc::channel();
    let ticking = {
        let bp = Arc::clone(&bp);
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                for _ in 0..10 {
                    bp.after_call(PREP, "hot");
                }
                bp.on_busy();
                bp.tick(1000);
            }
            done.send(()).unwrap();
        })
    };
    let reconfiguring = std::thread::spawn(move || {
        for i in 0..20_000 {
            let ratio = if i % 2 == 0 { 0.5 } else { 0.75 };
            bp.reconfigure(AdaptiveConfig {
                ratio,
                ..config.clone()
            })
            .unwrap();
        }
        done.send(()).unwrap();
    });
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("a tick and a reconfigure deadlocked");
    }
    ticking.join().unwrap();
    reconfiguring.join().unwrap();
}

#[test]
fn a_quiet_interval_must_cover_the_span_rates_are_measured_over() {
    let config = AdaptiveConfig {
        window: Duration::from_secs(9),
        downgrade_interval: Duration::from_millis(5_999),
        ..AdaptiveConfig::default()
    };
    let error = config.validate().unwrap_err();
    assert_eq!(error.field, "downgrade_interval");
    assert!(error.to_string().contains("`window`"), "{error}");
    let six = AdaptiveConfig {
        downgrade_interval: Duration::from_secs(6),
        ..config.clone()
    };
    assert_eq!(six.validate(), Ok(()));
    // The step-wise control measures rates only for its top-k: no such bound.
    let stepwise = AdaptiveConfig {
        control: Control::Stepwise,
        ..config
    };
    assert_eq!(stepwise.validate(), Ok(()));
    // A live change is checked against the window fixed at creation.
    let bp = controller(six);
    let error = bp
        .reconfigure(AdaptiveConfig {
            window: Duration::from_secs(3),
            downgrade_interval: Duration::from_secs(3),
            ..AdaptiveConfig::default()
        })
        .unwrap_err();
    assert_eq!(error.field, "downgrade_interval");
}
