//! The backpressure state machine: which keys to slow down, and how to undo it.
//!
//! Pure logic, no time and no I/O. On an *upgrade* it is handed a snapshot of the hottest keys with
//! their observed rates and tightens each one; on a *downgrade* it undoes the most recent upgrade.
//! Upgrades are kept as a stack of levels, so relaxing retraces exactly the steps that tightened.
//!
//! For each entry of an upgrade, with `old` the key's current limit (if any) and `qps` its
//! observed rate:
//!
//! ```text
//! base = old if limited, else qps
//! new  = max(base × ratio, floor)
//! emit SetLimit(new) only if new < base (strictly tighter)
//! ```
//!
//! A level is pushed only if it emitted something. A downgrade pops one level and, for each key
//! it touched, restores the previous limit (`SetLimit` with `reset`: queued reservations made
//! under the tighter limit are dropped) or removes the limit if there was none.

use std::collections::BTreeMap;

/// An RPC type and a key (a table): what the machine limits.
pub type Target = (String, String);

/// A hot key, as the QPS registry saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct HotKey {
    /// The RPC type.
    pub rpc: String,
    /// The key.
    pub key: String,
    /// Its observed rate, requests per second.
    pub qps: f64,
}

impl HotKey {
    #[cfg(test)]
    /// A hot key.
    pub fn new(rpc: &str, key: &str, qps: f64) -> Self {
        HotKey {
            rpc: rpc.to_owned(),
            key: key.to_owned(),
            qps,
        }
    }
}

/// What the throttler must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Limit `rpc`/`key` to `qps`. `reset` drops reservations queued under the old limit (set
    /// when a downgrade relaxes a limit).
    SetLimit {
        /// The RPC type.
        rpc: String,
        /// The key.
        key: String,
        /// The new limit.
        qps: f64,
        /// Drop queued reservations.
        reset: bool,
    },
    /// Stop limiting `rpc`/`key`.
    RemoveLimit {
        /// The RPC type.
        rpc: String,
        /// The key.
        key: String,
    },
}

/// How hard an upgrade squeezes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Squeeze {
    /// Each upgrade multiplies a key's limit by this (0 < ratio < 1).
    pub ratio: f64,
    /// Limits never go below this.
    pub floor: f64,
}

/// One upgrade: each key it changed, with the limit it had before.
type Level = Vec<(Target, Option<f64>)>;

/// The pure state machine; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct StateMachine {
    squeeze: Squeeze,
    limits: BTreeMap<Target, f64>,
    history: Vec<Level>,
}

impl StateMachine {
    /// A machine with no limits.
    pub fn new(squeeze: Squeeze) -> Self {
        StateMachine {
            squeeze,
            limits: BTreeMap::new(),
            history: Vec::new(),
        }
    }

    /// Changes ratio and floor; the next upgrade uses them.
    pub fn set_squeeze(&mut self, squeeze: Squeeze) {
        self.squeeze = squeeze;
    }

    /// Tightens the keys of `snapshot`; returns what to apply.
    pub fn on_upgrade(&mut self, snapshot: &[HotKey]) -> Vec<Action> {
        let mut level = Level::new();
        let mut actions = Vec::new();
        for hot in snapshot {
            let target = (hot.rpc.clone(), hot.key.clone());
            if level.iter().any(|(t, _)| *t == target) {
                continue;
            }
            let old = self.limits.get(&target).copied();
            let base = old.unwrap_or(hot.qps);
            let new = (base * self.squeeze.ratio).max(self.squeeze.floor);
            if new < base {
                self.limits.insert(target.clone(), new);
                actions.push(Action::SetLimit {
                    rpc: target.0.clone(),
                    key: target.1.clone(),
                    qps: new,
                    reset: false,
                });
                level.push((target, old));
            }
        }
        if !level.is_empty() {
            self.history.push(level);
        }
        actions
    }

    /// Undoes the most recent upgrade; nothing if there is none.
    pub fn on_downgrade(&mut self) -> Vec<Action> {
        let Some(level) = self.history.pop() else {
            return Vec::new();
        };
        level
            .into_iter()
            .map(|((rpc, key), old)| match old {
                Some(qps) => {
                    self.limits.insert((rpc.clone(), key.clone()), qps);
                    Action::SetLimit {
                        rpc,
                        key,
                        qps,
                        reset: true,
                    }
                }
                None => {
                    self.limits.remove(&(rpc.clone(), key.clone()));
                    Action::RemoveLimit { rpc, key }
                }
            })
            .collect()
    }

    /// Upgrades not yet undone.
    pub fn level(&self) -> usize {
        self.history.len()
    }

    #[cfg(test)]
    /// The limit on `rpc`/`key`, if any.
    pub fn limit(&self, rpc: &str, key: &str) -> Option<f64> {
        self.limits.get(&(rpc.to_owned(), key.to_owned())).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREP: &str = "PREPARE_ROWSET";
    const COMMIT: &str = "COMMIT_ROWSET";

    fn machine(ratio: f64, floor: f64) -> StateMachine {
        StateMachine::new(Squeeze { ratio, floor })
    }

    fn set(rpc: &str, key: &str, qps: f64, reset: bool) -> Action {
        Action::SetLimit {
            rpc: rpc.into(),
            key: key.into(),
            qps,
            reset,
        }
    }

    fn remove(rpc: &str, key: &str) -> Action {
        Action::RemoveLimit {
            rpc: rpc.into(),
            key: key.into(),
        }
    }

    #[test]
    fn an_upgrade_halves_the_top_keys_and_a_downgrade_removes_them() {
        let mut m = machine(0.5, 1.0);
        let actions = m.on_upgrade(&[
            HotKey::new(PREP, "100", 200.0),
            HotKey::new(PREP, "200", 100.0),
        ]);
        assert_eq!(
            actions,
            vec![
                set(PREP, "100", 100.0, false),
                set(PREP, "200", 50.0, false)
            ]
        );
        assert_eq!(m.level(), 1);
        assert_eq!(
            m.on_downgrade(),
            vec![remove(PREP, "100"), remove(PREP, "200")]
        );
        assert_eq!(m.level(), 0);
        assert_eq!(m.on_downgrade(), vec![]);
    }

    #[test]
    fn repeated_upgrades_on_one_key_compound_and_unwind_in_order() {
        let mut m = machine(0.5, 1.0);
        let hot = [HotKey::new(PREP, "100", 100.0)];
        for expected in [50.0, 25.0, 12.5] {
            assert_eq!(m.on_upgrade(&hot), vec![set(PREP, "100", expected, false)]);
        }
        assert_eq!(m.level(), 3);
        assert_eq!(m.on_downgrade(), vec![set(PREP, "100", 25.0, true)]);
        assert_eq!(m.on_downgrade(), vec![set(PREP, "100", 50.0, true)]);
        assert_eq!(m.on_downgrade(), vec![remove(PREP, "100")]);
        assert_eq!(m.limit(PREP, "100"), None);
    }

    #[test]
    fn the_floor_bounds_limits_and_a_no_op_pushes_no_level() {
        let mut m = machine(0.1, 5.0);
        assert_eq!(
            m.on_upgrade(&[HotKey::new(PREP, "1", 10.0)]),
            vec![set(PREP, "1", 5.0, false)]
        );
        let mut m = machine(0.5, 1.0);
        assert_eq!(m.on_upgrade(&[HotKey::new(PREP, "1", 0.5)]), vec![]);
        assert_eq!(m.level(), 0);
    }

    #[test]
    fn keys_may_change_between_upgrades() {
        let mut m = machine(0.5, 1.0);
        m.on_upgrade(&[
            HotKey::new(PREP, "100", 200.0),
            HotKey::new(PREP, "200", 100.0),
        ]);
        let actions = m.on_upgrade(&[
            HotKey::new(PREP, "200", 50.0),
            HotKey::new(PREP, "300", 80.0),
        ]);
        assert_eq!(
            actions,
            vec![set(PREP, "200", 25.0, false), set(PREP, "300", 40.0, false)]
        );
        assert_eq!(
            m.on_downgrade(),
            vec![set(PREP, "200", 50.0, true), remove(PREP, "300")]
        );
        assert_eq!(m.limit(PREP, "100"), Some(100.0));
    }

    #[test]
    fn rpc_types_are_independent() {
        let mut m = machine(0.5, 1.0);
        let actions = m.on_upgrade(&[
            HotKey::new(PREP, "100", 200.0),
            HotKey::new(COMMIT, "100", 80.0),
        ]);
        assert_eq!(
            actions,
            vec![
                set(PREP, "100", 100.0, false),
                set(COMMIT, "100", 40.0, false)
            ]
        );
        assert_eq!(
            m.on_downgrade(),
            vec![remove(PREP, "100"), remove(COMMIT, "100")]
        );
    }

    #[test]
    fn new_parameters_apply_to_the_next_upgrade() {
        let mut m = machine(0.5, 1.0);
        m.on_upgrade(&[HotKey::new(PREP, "1", 100.0)]);
        m.set_squeeze(Squeeze {
            ratio: 0.9,
            floor: 1.0,
        });
        assert_eq!(
            m.on_upgrade(&[HotKey::new(PREP, "1", 50.0)]),
            vec![set(PREP, "1", 45.0, false)]
        );
    }
}
