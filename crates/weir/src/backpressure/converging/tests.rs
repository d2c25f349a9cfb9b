//! The unit tests of `converging.rs`.

use super::*;
use proptest::prelude::*;

const PREP: &str = "PREPARE_ROWSET";

fn tuning() -> Tuning {
    Tuning {
        ratio: 0.5,
        floor: 1.0,
        increase: 1.05,
        headroom: 0.05,
    }
}

fn t(key: &str) -> Target {
    (PREP.to_owned(), key.to_owned())
}

fn load(total: f64, busy: f64, top: &[(&str, f64)], limited: &[(&str, f64)]) -> Load {
    Load {
        total,
        busy,
        top: top.iter().map(|&(k, q)| (t(k), q)).collect(),
        limited: limited.iter().map(|&(k, q)| (t(k), q)).collect(),
    }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn water_filling_gives_small_demands_what_they_want_and_splits_the_rest() {
    assert_eq!(
        water_fill(300.0, &[50.0, 400.0, 150.0]),
        [50.0, 125.0, 125.0]
    );
    assert_eq!(water_fill(300.0, &[50.0, 60.0]), [50.0, 60.0]);
    assert_eq!(water_fill(-5.0, &[50.0, 60.0]), [0.0, 0.0]);
    let inf = f64::INFINITY;
    assert_eq!(water_fill(90.0, &[inf, 30.0, inf]), [30.0, 30.0, 30.0]);
}

#[test]
fn a_busy_signal_cuts_the_hot_key_to_what_the_backend_accepts() {
    // 600/s sent, 300 answered busy: capacity 300, budget 285 − 200 outside the top.
    let mut c = Converging::new(tuning());
    let actions = c.on_busy(Signal::Answer, &load(600.0, 300.0, &[("hot", 400.0)], &[]));
    assert_eq!(actions.len(), 1);
    assert!(close(c.limit(&t("hot")), 400.0 * 0.5), "bounded by ratio");
    assert_eq!(c.capacity(), Some(300.0));
    // Still busy: cut again, at most by half…
    c.on_busy(
        Signal::Answer,
        &load(400.0, 100.0, &[("hot", 200.0)], &[("hot", 200.0)]),
    );
    assert!(close(c.limit(&t("hot")), 100.0), "{:?}", c.limit(&t("hot")));
    // …until it reaches the budget, 285 − 200 = 85.
    c.on_busy(
        Signal::Answer,
        &load(300.0, 0.1, &[("hot", 100.0)], &[("hot", 100.0)]),
    );
    let budget = (300.0 - 0.1) * 0.95 - 200.0;
    assert!(
        close(c.limit(&t("hot")), budget),
        "{:?}",
        c.limit(&t("hot"))
    );
}

#[test]
fn limited_keys_share_the_capacity_max_min_fairly() {
    // hot and warm both in the top 2; cold keys outside use 50. Budget 285 − 50 = 235:
    // the small key keeps its 20, hot and warm split the rest.
    let mut c = Converging::new(Tuning {
        ratio: 0.1,
        ..tuning()
    });
    c.on_busy(
        Signal::Answer,
        &load(
            620.0,
            320.0,
            &[("hot", 400.0), ("warm", 150.0), ("small", 20.0)],
            &[],
        ),
    );
    assert!(close(c.limit(&t("hot")), 107.5), "{:?}", c.limit(&t("hot")));
    assert!(close(c.limit(&t("warm")), 107.5));
    assert_eq!(c.limit(&t("small")), None, "under its fair share: not cut");
}

#[test]
fn quiet_rounds_raise_every_limited_key_and_release_idle_ones() {
    let mut c = Converging::new(Tuning {
        ratio: 0.1,
        ..tuning()
    });
    c.on_busy(
        Signal::Answer,
        &load(600.0, 300.0, &[("a", 300.0), ("b", 250.0)], &[]),
    );
    let (a, b) = (c.limit(&t("a")).unwrap(), c.limit(&t("b")).unwrap());
    assert!(close(Some(a), 117.5) && close(Some(b), 117.5), "{a} {b}");
    // Both use their limits; the others stopped sending: spare for both. (The first two
    // rounds grow the estimate by `increase`, the third by its square.)
    let actions = c.on_quiet(&load(235.0, 0.0, &[], &[("a", a), ("b", b)]));
    assert_eq!(actions.len(), 2, "every limited key relaxes: {actions:?}");
    let budget = 300.0 * 1.05 * 0.95;
    assert!(close(c.limit(&t("a")), budget / 2.0));
    assert!(close(c.limit(&t("b")), budget / 2.0));
    // b stops: idle for one round, kept; idle two rounds, released. a takes what b leaves.
    let a = c.limit(&t("a")).unwrap();
    c.on_quiet(&load(a, 0.0, &[], &[("a", a), ("b", 0.0)]));
    assert!(c.limit(&t("b")).is_some());
    assert!(c.limit(&t("a")).unwrap() > a);
    let a = c.limit(&t("a")).unwrap();
    let actions = c.on_quiet(&load(a, 0.0, &[], &[("a", a), ("b", 0.0)]));
    assert!(actions.contains(&Action::RemoveLimit {
        rpc: PREP.into(),
        key: "b".into()
    }));
    assert_eq!(c.limit(&t("b")), None);
}

#[test]
fn after_a_transient_the_estimate_returns_to_the_peak_at_once_and_lets_go() {
    // Two keys under the capacity, a bare signal: cut by `ratio`, far deeper than any
    // overload (there was none to measure).
    let mut c = Converging::new(tuning());
    c.on_busy(
        Signal::Bare,
        &load(90.0, 0.0, &[("a", 60.0), ("b", 30.0)], &[]),
    );
    assert_eq!(c.capacity(), Some(45.0));
    let (a, b) = (c.limit(&t("a")).unwrap(), c.limit(&t("b")).unwrap());
    assert!(a < 60.0 && b < 30.0, "{a} {b}");
    // One quiet round: back to the 90 the backend took, not 45 × 1.05, and 90 gives each key
    // what it sent before the cut: both let go, as the step-wise control lets go of its step.
    c.on_quiet(&load(a + b, 0.0, &[], &[("a", a), ("b", b)]));
    assert_eq!((c.len(), c.capacity()), (0, None));
}

#[test]
fn a_key_is_given_back_what_it_sent_only_at_the_first_quiet_round() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Answer, &load(400.0, 100.0, &[("hot", 300.0)], &[]));
    let hot = c.limit(&t("hot")).unwrap();
    // The first quiet round: the estimate grows, but not to the 300 hot sent before.
    c.on_quiet(&load(hot + 100.0, 0.0, &[], &[("hot", hot)]));
    let raised = c.limit(&t("hot")).unwrap();
    assert!(raised > hot && raised < 300.0 * 0.95, "{raised}");
    // From then on its rate is its limit's: however much the estimate grows it is raised,
    // not let go, until it leaves its limit unused.
    for _ in 0..3 {
        let hot = c.limit(&t("hot")).unwrap();
        c.on_quiet(&load(hot + 100.0, 0.0, &[], &[("hot", hot)]));
        assert!(c.limit(&t("hot")).is_some());
    }
}

#[test]
fn busy_again_at_the_peak_lowers_it() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Bare, &load(600.0, 0.0, &[("hot", 400.0)], &[]));
    assert_eq!(c.capacity(), Some(300.0));
    // Refused by the cooldown, 400 sent and 40 answered busy: 360 is the level now.
    c.note_busy(Signal::Answer, &load(400.0, 40.0, &[], &[("hot", 200.0)]));
    c.on_quiet(&load(300.0, 0.0, &[], &[("hot", 200.0)]));
    assert_eq!(c.capacity(), Some(360.0));
}

#[test]
fn a_busy_signal_never_raises_a_limit_nor_limits_a_key_outside_the_top() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Answer, &load(600.0, 300.0, &[("hot", 400.0)], &[]));
    let before = c.limit(&t("hot")).unwrap();
    // A small overload, hot now in the top no more: its fair share (all of its 90) is
    // under its limit, which stays; warm, in the top, is cut to its share. The 70 calls
    // of the keys outside the set are nobody's to cut.
    let actions = c.on_busy(
        Signal::Answer,
        &load(310.0, 1.0, &[("warm", 150.0)], &[("hot", 90.0)]),
    );
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert!(matches!(&actions[0], Action::SetLimit { key, .. } if key == "warm"));
    assert_eq!(c.limit(&t("hot")), Some(before));
    assert_eq!(c.len(), 2, "only hot and warm are limited");
}

#[test]
fn a_raised_floor_lifts_the_limits_under_it() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Answer, &load(310.0, 10.0, &[("hot", 300.0)], &[]));
    let before = c.limit(&t("hot")).expect("hot is limited");
    let raised = Tuning {
        floor: before + 50.0,
        ..tuning()
    };
    let actions = c.set_tuning(raised);
    assert_eq!(c.limit(&t("hot")), Some(before + 50.0));
    assert!(
        matches!(&actions[..], [Action::SetLimit { key, qps, .. }] if key == "hot" && *qps == before + 50.0),
        "{actions:?}"
    );
    assert!(
        c.set_tuning(tuning()).is_empty(),
        "lowering the floor lifts nothing"
    );
}

#[test]
fn a_signal_with_no_call_attached_cuts_by_ratio_and_spam_cannot_empty_the_estimate() {
    let mut c = Converging::new(tuning());
    // No busy answer counted: the accepted rate is all that was sent; cut by `ratio`.
    c.on_busy(Signal::Bare, &load(600.0, 0.0, &[("hot", 400.0)], &[]));
    assert_eq!(c.capacity(), Some(300.0));
    assert!(close(c.limit(&t("hot")), 200.0), "{:?}", c.limit(&t("hot")));
    // Refused by the cooldown: lowered to the accepted rate, not cut by `ratio` again.
    c.note_busy(Signal::Bare, &load(400.0, 0.0, &[], &[("hot", 200.0)]));
    assert_eq!(c.capacity(), Some(300.0));
    c.note_busy(Signal::Bare, &load(250.0, 0.0, &[], &[("hot", 200.0)]));
    assert_eq!(c.capacity(), Some(250.0));
    // However many pass the cooldown, the estimate stays at what the floor allows.
    for _ in 0..200 {
        let hot = c.limit(&t("hot")).unwrap();
        c.on_busy(
            Signal::Bare,
            &load(hot, 0.0, &[("hot", hot)], &[("hot", hot)]),
        );
    }
    assert_eq!(c.limit(&t("hot")), Some(1.0));
    assert_eq!(c.capacity(), Some(1.0));
    c.note_busy(Signal::Answer, &load(5.0, 5.0, &[], &[("hot", 1.0)]));
    assert_eq!(c.capacity(), Some(1.0), "not below the floor");
}

#[test]
fn a_slow_answer_cuts_to_the_accepted_rate_once_and_then_holds() {
    let mut c = Converging::new(tuning());
    // Accepted, but slow: the estimate is what was accepted; the cut is the headroom.
    c.on_busy(Signal::Slow, &load(600.0, 0.0, &[("hot", 400.0)], &[]));
    assert_eq!(c.capacity(), Some(600.0));
    let hot = c.limit(&t("hot")).unwrap();
    assert!(close(Some(hot), 600.0 * 0.95 - 200.0), "{hot}");
    // Still slow with the traffic under the estimate's headroom: held, no deeper cut.
    let held = load(hot + 200.0, 0.0, &[("hot", hot)], &[("hot", hot)]);
    for _ in 0..10 {
        assert!(c.on_busy(Signal::Slow, &held).is_empty());
        c.note_busy(Signal::Slow, &held);
    }
    assert_eq!(c.capacity(), Some(600.0));
    assert_eq!(c.limit(&t("hot")), Some(hot));
    // The traffic grew into the headroom (a key outside the set) and it is slow there:
    // that is the level now.
    let grown = load(hot + 250.0, 0.0, &[("hot", hot)], &[("hot", hot)]);
    c.on_busy(Signal::Slow, &grown);
    assert_eq!(c.capacity(), Some(hot + 250.0));
    assert!(c.limit(&t("hot")).unwrap() < hot);
}

#[test]
fn a_refused_busy_signal_restarts_the_quiet_rounds_and_lowers_the_estimate() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Answer, &load(600.0, 300.0, &[("hot", 400.0)], &[]));
    // hot sends 92 % of its limit: held back by it, and not more than the estimate.
    let quiet = |c: &mut Converging| {
        let hot = c.limit(&t("hot")).unwrap() * 0.92;
        c.on_quiet(&load(hot, 0.0, &[], &[("hot", hot)]));
    };
    quiet(&mut c);
    quiet(&mut c);
    assert!(close(c.capacity(), 300.0 * 1.05 * 1.05));
    // Refused by the cooldown: 310 sent, 20 answered busy.
    c.note_busy(Signal::Answer, &load(310.0, 20.0, &[], &[("hot", 200.0)]));
    assert_eq!(c.capacity(), Some(290.0));
    // The next quiet round is a first one again: × increase, not × increase².
    quiet(&mut c);
    assert!(close(c.capacity(), 290.0 * 1.05), "{:?}", c.capacity());
}

#[test]
fn a_quiet_round_starts_from_what_the_backend_took_if_more_than_the_estimate() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Bare, &load(600.0, 0.0, &[("hot", 400.0)], &[]));
    assert_eq!(c.capacity(), Some(300.0));
    // The backend took 450 a second without a busy answer: the estimate was low, and comes
    // back to the 600 it took when the cut was made.
    c.on_quiet(&load(450.0, 0.0, &[], &[("hot", 200.0)]));
    assert_eq!(c.capacity(), Some(600.0));
    // From the peak on, a probe: × increase.
    c.on_quiet(&load(610.0, 0.0, &[], &[("hot", 350.0)]));
    assert!(close(c.capacity(), 610.0 * 1.05), "{:?}", c.capacity());
}

#[test]
fn a_busy_signal_over_nothing_leaves_no_estimate() {
    // Once a generated case: nothing sent, nothing busy, no top key.
    let mut c = Converging::new(tuning());
    assert!(
        c.on_busy(Signal::Answer, &load(0.0, 0.0, &[], &[]))
            .is_empty()
    );
    assert_eq!((c.len(), c.capacity()), (0, None));
    assert!(c.on_quiet(&load(0.0, 0.0, &[], &[])).is_empty());
    assert_eq!(c.capacity(), None);
}

#[test]
fn clearing_removes_every_limit() {
    let mut c = Converging::new(tuning());
    c.on_busy(Signal::Answer, &load(600.0, 300.0, &[("hot", 400.0)], &[]));
    assert_eq!(
        c.clear(),
        vec![Action::RemoveLimit {
            rpc: PREP.into(),
            key: "hot".into()
        }]
    );
    assert_eq!((c.len(), c.capacity()), (0, None));
}

/// One step of an arbitrary history: a busy signal (sent, busy, top keys' rates) or a
/// quiet round.
#[derive(Debug, Clone)]
enum Step {
    Busy(f64, f64, Vec<(u8, f64)>),
    Quiet,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0.0..2000.0f64,
            0.0..2000.0f64,
            prop::collection::vec((0u8..8, 0.0..1000.0f64), 0..3)
        )
            .prop_map(|(total, busy, top)| Step::Busy(total, busy, top)),
        Just(Step::Quiet),
    ]
}

proptest! {
    /// Whatever the busy signals and quiet rounds: a key is only ever limited after it was
    /// in a busy signal's top-k, no limit is below the floor, and once the signals stop,
    /// keys sending at fixed demands are all released within a bounded number of rounds.
    #[test]
    fn limits_stay_in_the_top_above_the_floor_and_go_away_when_quiet(
        steps in prop::collection::vec(step(), 0..60),
        demands in prop::collection::vec(0.0..1000.0f64, 8),
        floor in 0.5..20.0f64,
        ratio in 0.05..0.95f64,
        increase in 1.01..2.0f64,
        headroom in 0.0..0.5f64,
    ) {
        let mut c = Converging::new(Tuning { ratio, floor, increase, headroom });
        let mut ever_top: BTreeSet<Target> = BTreeSet::new();
        // A limited key sends the least of its demand and its limit.
        let rates = |c: &Converging| -> BTreeMap<Target, f64> {
            c.limits
                .iter()
                .map(|(t, l)| {
                    let i: usize = t.1.parse().unwrap();
                    (t.clone(), demands[i].min(l.qps))
                })
                .collect()
        };
        for step in steps {
            match step {
                Step::Busy(total, busy, top) => {
                    let top: Vec<(Target, f64)> =
                        top.into_iter().map(|(k, q)| (t(&k.to_string()), q)).collect();
                    ever_top.extend(top.iter().map(|(t, _)| t.clone()));
                    let limited = rates(&c);
                    c.on_busy(Signal::Answer, &Load { total, busy: busy.min(total), top, limited });
                }
                Step::Quiet => {
                    let limited = rates(&c);
                    let total = limited.values().sum();
                    c.on_quiet(&Load { total, busy: 0.0, top: Vec::new(), limited });
                }
            }
            for (target, limit) in &c.limits {
                prop_assert!(ever_top.contains(target), "{target:?} was never in a top-k");
                prop_assert!(limit.qps >= floor, "{} below the floor {floor}", limit.qps);
                prop_assert!(limit.qps.is_finite() && limit.qps < CEILING);
            }
        }
        // The bound: the quiet load is at least 100 a second, so after one round the
        // estimate is at least that; its step is at least `increase`¹⁶ ≥ 1.17 from the sixth
        // round, so within 6 + 33 rounds it covers eight keys at 1000 / 0.9 each and the
        // 100 outside, even with half of it left as headroom (100 × 1.17³³ ≥ 18 000).
        // Limits follow at up to × 4 a round, from the floor to 1111 within 12 rounds of
        // that; then two idle rounds release each key.
        const ROUNDS: usize = 6 + 33 + 12 + 2;
        for _ in 0..ROUNDS {
            if c.len() == 0 {
                break;
            }
            let limited = rates(&c);
            let total = limited.values().sum::<f64>() + 100.0;
            c.on_quiet(&Load { total, busy: 0.0, top: Vec::new(), limited });
        }
        prop_assert_eq!(c.len(), 0, "limits left after {} quiet rounds: {:?}", ROUNDS, c.limits);
        prop_assert_eq!(c.capacity(), None);
    }
}
