//! The converging controller: per-key limits that settle just under the backend's capacity.
//!
//! Pure logic, no clock and no I/O, like the step-wise [`StateMachine`](super::machine): the
//! controller hands it what it measured over the recent span (a [`Load`]) when a busy signal
//! passes the cooldown ([`on_busy`](Converging::on_busy)) and after each quiet
//! `downgrade_interval` ([`on_quiet`](Converging::on_quiet)), and applies the [`Action`]s it
//! returns.
//!
//! # Why this algorithm
//!
//! The step-wise design undoes only its newest step and drops it whole, so it overshoots into
//! overload on every relax and starves a key whose step sits lower in the stack. The aggregate
//! controllers that do converge share two ideas, which this keeps:
//!
//! - **Tighten to a measured level, relax gently towards it.** Google's client-side throttling
//!   sizes its admission from *accepted vs requested*; Netflix's Vegas and Gradient2 and Envoy's
//!   gradient filter estimate the level the backend sustains and grow only slowly above it
//!   (AIMD's additive probe, without its blind halving). Here a busy signal sets the *capacity
//!   estimate* to the calls the backend accepted over the recent span (calls sent minus busy
//!   answers), and each quiet interval raises the estimate by `increase` (× 1.05 by default): a
//!   probe of a few per cent, so after an overload the limits come back to the last known-good
//!   level at once and then creep above it, rather than jumping to full demand. From the third
//!   quiet interval in a row the step doubles each time (× 1.05², × 1.05⁴, … up to × 1.05¹⁶),
//!   as TCP's slow start does: a busy answer measured in a burst can understate the capacity,
//!   and a fixed small step would take many intervals to win it back.
//! - **Limits follow from the estimate, not from a history.** Every decision recomputes the
//!   limits from the estimate, so every limited key relaxes, not only the newest, and a cut is
//!   as deep as the overload (sent vs accepted) and no deeper.
//!
//! None of the anchors is per key; Weir's addition is how the estimate is shared. The budget is
//! the estimate less `headroom` (5 % by default, which keeps busy answers rare) less what the
//! keys outside the set use; the set is the limited keys and the current top-k. The budget is
//! *water-filled* over the set: max-min fair, a key wanting less than the fair share keeps what
//! it wants, and the others split the rest equally.
//!
//! # The rules
//!
//! On a busy signal past the cooldown, with `qps` each key's recent rate, `total` the calls of
//! the RPC types taking part and `busy` the busy answers to them:
//!
//! ```text
//! accepted = total − busy                     (calls a second the backend took)
//! capacity = accepted                         (a busy answer: the overload is measured)
//!          = ratio × accepted                 (a signal with no call attached, say a POST)
//!          = accepted, or the estimate held   (a slow answer: see below)
//! budget   = capacity × (1 − headroom) − Σ qps of keys outside the set
//! share    = water-fill(budget, qps of each key in the set)
//! a key whose share < qps:  limit = max(share, ratio × (limit or qps), floor), if tighter
//! ```
//!
//! The three kinds of signal differ in what they tell about the backend. A busy answer is one
//! refused call among `total`, so the accepted rate is the capacity. A signal with no call
//! attached (`Policy::busy`, `POST /v1/busy`) counts no call, so it cannot measure the overload:
//! it cuts by `ratio`, as the step-wise control does. A slow answer was accepted: the backend
//! is at its knee, not over it, so it sets the estimate to the accepted rate (limits then leave
//! `headroom` of it unused), but while the traffic already stays within the estimate's
//! headroom it holds the estimate — a backend slow on every call would otherwise be cut by
//! `headroom` on every signal, down to the floor. The estimate never goes below what the
//! limited keys at the floor carry.
//!
//! A busy signal never raises a limit and never newly limits a key outside the top-k; `ratio`
//! bounds one cut (no key loses more than `1 − ratio` of its limit or rate at once). A signal
//! the cooldown refuses cuts nothing, but it is no quiet time either: it restarts the count of
//! quiet rounds and lowers the estimate to what it measures ([`note_busy`](Converging::note_busy)).
//!
//! After each quiet interval the estimate, or the rate the backend accepted over it if higher,
//! first *returns*: if it is below the rate the backend accepted when the last cut was made (the
//! peak), it goes back to the peak at once — a transient signal, or a cut by `ratio` deeper than
//! the overload, is undone in one quiet round, as TCP CUBIC returns to its last window before
//! probing. From the peak on it grows (above). A signal refused by the cooldown lowers the peak
//! to the accepted rate it measures: busy again at a level, that level is no place to return.
//! Then every limited key is looked at: one that used less than 90 % of its limit for two
//! rounds running is released (its demand is under its limit); one whose share of the grown
//! estimate, headroom included, gives it what it sent when the signal that limited it came is
//! released too, as the step-wise control lets go of its last step — at the first quiet round
//! after its cut only (later, what it sends is its limit's, and what it wants is unknown); the
//! others take their water-filled share, if that is more than their limit (at most × 4 a
//! round), with queued reservations dropped. (A key's rate is measured over at most two
//! thirds of the window, which the controller's settings keep within one quiet interval: a key
//! just raised is judged on calls made under its new limit.)
//!
//! [`Action`]: super::machine::Action

use std::collections::{BTreeMap, BTreeSet};

use super::machine::{Action, Target};

/// A key using less than this share of its limit is not held back by it.
const USED: f64 = 0.9;
/// Quiet rounds in a row a key must leave its limit unused before it is released.
const IDLE_ROUNDS: u8 = 2;
/// The most one quiet round multiplies a limit by.
const MAX_RAISE: f64 = 4.0;
/// Limits and estimates stay below this (calls a second); a key that would need more is free.
const CEILING: f64 = 1e9;

/// The converging controller's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// The deepest one cut goes: a key keeps at least this share of its limit (or rate).
    pub ratio: f64,
    /// Limits never go below this.
    pub floor: f64,
    /// Each quiet round multiplies the capacity estimate by this (> 1).
    pub increase: f64,
    /// The share of the capacity estimate left unused (0 ≤ headroom < 1).
    pub headroom: f64,
}

/// What a busy signal is, which decides what it says about the backend's capacity (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A call was answered busy (and counted among the load's busy answers).
    Answer,
    /// A call was answered, but slowly: accepted, and a sign the backend is at its knee.
    Slow,
    /// A signal with no call attached: a downstream said "busy" without saying to what.
    Bare,
}

/// What the controller measured over the recent span, in calls a second.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Load {
    /// Calls sent, every key of every RPC type taking part.
    pub total: f64,
    /// Busy answers to those calls.
    pub busy: f64,
    /// The top-k busiest keys of each RPC type, with their rates: the only keys a busy signal
    /// may newly limit.
    pub top: Vec<(Target, f64)>,
    /// The rate of each limited key (see [`Converging::limited`]); a missing key counts as 0.
    pub limited: BTreeMap<Target, f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Limit {
    qps: f64,
    /// Quiet rounds in a row the key left its limit unused.
    idle: u8,
    /// Its rate when the busy signal that limited it came: what it wanted then. `None` after
    /// the first quiet round: what it wants is unknown, its rate being its limit's.
    from: Option<f64>,
}

/// The converging controller's state; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Converging {
    tuning: Tuning,
    limits: BTreeMap<Target, Limit>,
    /// Accepted calls a second, as last measured and grown since; `None` with no limit.
    capacity: Option<f64>,
    /// The rate the backend accepted when the last cut was made: the level the estimate
    /// returns to after a quiet round, before probing above it.
    peak: Option<f64>,
    /// Quiet rounds in a row: since the last busy signal, whether or not it cut anything.
    quiet_rounds: u32,
}

/// Max-min fair shares of `budget` for `demands` (infinite: wants all it can get), in the
/// order given.
fn water_fill(budget: f64, demands: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| demands[a].total_cmp(&demands[b]));
    let mut shares = vec![0.0; demands.len()];
    let mut left = budget.max(0.0);
    for (done, &i) in order.iter().enumerate() {
        let fair = left / (order.len() - done) as f64;
        let share = demands[i].min(fair);
        shares[i] = share;
        left -= share;
    }
    shares
}

impl Converging {
    /// A controller with no limits and no estimate.
    pub fn new(tuning: Tuning) -> Self {
        Converging {
            tuning,
            limits: BTreeMap::new(),
            capacity: None,
            peak: None,
            quiet_rounds: 0,
        }
    }

    /// Changes the parameters; the next decision uses them. A limit under a raised floor is
    /// lifted to it at once (no limit is ever below the floor): the actions returned say so.
    pub fn set_tuning(&mut self, tuning: Tuning) -> Vec<Action> {
        self.tuning = tuning;
        let floor = self.tuning.floor;
        self.limits
            .iter_mut()
            .filter(|(_, limit)| limit.qps < floor)
            .map(|(target, limit)| {
                limit.qps = floor;
                set_limit(target, floor, false)
            })
            .collect()
    }

    /// The limited keys.
    pub fn limited(&self) -> impl Iterator<Item = &Target> {
        self.limits.keys()
    }

    /// How many keys are limited.
    pub fn len(&self) -> usize {
        self.limits.len()
    }

    /// The capacity estimate, calls a second, if any key is limited.
    pub fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// The capacity `signal` measures in `load` (see the [module docs](self)).
    fn measured(&self, signal: Signal, load: &Load) -> f64 {
        let accepted = (load.total - load.busy).clamp(0.0, CEILING);
        match signal {
            Signal::Answer => accepted,
            Signal::Bare => self.tuning.ratio * accepted,
            Signal::Slow => match self.capacity {
                // The limits keep the traffic within the estimate's headroom already: a slow
                // answer now says the backend is slow at this level, not that it takes less.
                // (Half the headroom: a rate measured just after a cut still has some calls
                // from before it.)
                Some(estimate) if accepted <= estimate * (1.0 - self.tuning.headroom / 2.0) => {
                    estimate
                }
                _ => accepted,
            },
        }
    }

    /// The least estimate: what the limited keys carry at the floor (so that a stream of
    /// signals cannot talk the estimate down to nothing).
    fn least(&self) -> f64 {
        self.tuning.floor * self.limits.len().max(1) as f64
    }

    /// A busy signal the cooldown refused: no cut, but no quiet time either — the count of
    /// quiet rounds starts again, and the estimate is lowered to what the signal measures (a
    /// signal with no call attached measures the accepted rate: many of them in a cooldown
    /// are no deeper an overload than one).
    pub fn note_busy(&mut self, signal: Signal, load: &Load) {
        self.quiet_rounds = 0;
        let measured = match signal {
            Signal::Bare => self.measured(Signal::Answer, load),
            _ => self.measured(signal, load),
        };
        let least = self.least();
        if let Some(capacity) = &mut self.capacity {
            *capacity = capacity.min(measured).max(least);
        }
        // Busy again at this level: it is no level to return to.
        let accepted = self.measured(Signal::Answer, load).max(least);
        if let Some(peak) = &mut self.peak {
            *peak = peak.min(accepted);
        }
    }

    /// A busy signal past the cooldown: cuts the keys of the set to their fair share of the
    /// measured capacity.
    pub fn on_busy(&mut self, signal: Signal, load: &Load) -> Vec<Action> {
        let Tuning {
            ratio,
            floor,
            headroom,
            ..
        } = self.tuning;
        let accepted = self.measured(signal, load);
        self.capacity = Some(accepted);
        self.peak = Some(self.measured(Signal::Answer, load));
        self.quiet_rounds = 0;
        let mut set: BTreeMap<Target, f64> = self
            .limits
            .keys()
            .map(|t| (t.clone(), load.limited.get(t).copied().unwrap_or(0.0)))
            .collect();
        let top: BTreeSet<&Target> = load.top.iter().map(|(t, _)| t).collect();
        for (target, qps) in &load.top {
            set.entry(target.clone()).or_insert(*qps);
        }
        let demands: Vec<f64> = set.values().copied().collect();
        let others = (load.total - demands.iter().sum::<f64>()).max(0.0);
        let budget = accepted * (1.0 - headroom) - others;
        let shares = water_fill(budget, &demands);
        let mut actions = Vec::new();
        for ((target, qps), share) in set.into_iter().zip(shares) {
            if share >= qps {
                continue;
            }
            match self.limits.get_mut(&target) {
                Some(limit) => {
                    let new = share.max(limit.qps * ratio).max(floor);
                    if new < limit.qps {
                        limit.qps = new;
                        limit.idle = 0;
                        actions.push(set_limit(&target, new, false));
                    }
                }
                None if top.contains(&target) => {
                    let new = share.max(qps * ratio).max(floor).min(CEILING);
                    if new < qps {
                        actions.push(set_limit(&target, new, false));
                        let limit = Limit {
                            qps: new,
                            idle: 0,
                            from: Some(qps),
                        };
                        self.limits.insert(target, limit);
                    }
                }
                None => {}
            }
        }
        if self.limits.is_empty() {
            self.capacity = None;
            self.peak = None;
        } else {
            self.capacity = Some(accepted.max(self.least()));
        }
        actions
    }

    /// A quiet `downgrade_interval` has passed: grows the estimate, releases keys that no
    /// longer use their limits, and raises the others to their share of it.
    pub fn on_quiet(&mut self, load: &Load) -> Vec<Action> {
        if self.limits.is_empty() {
            self.capacity = None;
            self.peak = None;
            return Vec::new();
        }
        let Tuning {
            increase, headroom, ..
        } = self.tuning;
        // A quiet interval is one in which the backend took `total − busy` without complaint:
        // an estimate measured low (in a burst, or cut blind by a signal with no call
        // attached) is at least that.
        let accepted = load.total - load.busy;
        let before = self.capacity.map_or(load.total, |c| c.max(accepted));
        // Two rounds at `increase`, then the step doubles each quiet round: a probe stays
        // small near the level last measured, and a low estimate is left behind quickly.
        let steps = 1 << self.quiet_rounds.saturating_sub(1).min(4);
        self.quiet_rounds = self.quiet_rounds.saturating_add(1);
        let capacity = match self.peak {
            // Back at once to the level the backend took when the cut was made: a cut deeper
            // than the overload (one by `ratio`, or measured in a burst) is undone in one
            // quiet round, as TCP CUBIC returns to its last window before probing.
            Some(peak) if before < peak => peak,
            _ => (before * increase.powi(steps))
                .max(before + self.tuning.floor)
                .min(CEILING),
        };
        self.capacity = Some(capacity);
        let mut actions = Vec::new();
        let mut released = Vec::new();
        // (key, its rate, its demand: its rate if its limit is not holding it back)
        let mut set: Vec<(Target, f64, f64)> = Vec::new();
        for (target, limit) in &mut self.limits {
            let qps = load.limited.get(target).copied().unwrap_or(0.0);
            if qps < limit.qps * USED {
                limit.idle = limit.idle.saturating_add(1);
                if limit.idle >= IDLE_ROUNDS {
                    released.push(target.clone());
                } else {
                    set.push((target.clone(), qps, qps));
                }
            } else {
                limit.idle = 0;
                set.push((target.clone(), qps, f64::INFINITY));
            }
        }
        let from: BTreeMap<Target, Option<f64>> = self
            .limits
            .iter()
            .map(|(target, limit)| (target.clone(), limit.from))
            .collect();
        let used: f64 = set.iter().map(|(_, qps, _)| qps).sum();
        // Released keys' calls are in the total, outside the set.
        let others = (load.total - used).max(0.0);
        let budget = capacity * (1.0 - headroom) - others;
        let demands: Vec<f64> = set.iter().map(|(_, _, demand)| *demand).collect();
        let shares = water_fill(budget, &demands);
        // The same estimate with no headroom kept: the test of whether a key can be given back
        // all it sent before its cut. Given back, it shows whether the cut was a transient; if
        // not, the next signal cuts it again, and it is not given back so again (its `from`
        // is cleared).
        // A key held back by its limit is taken to want what it sent before its cut, if known.
        let wants: Vec<f64> = set
            .iter()
            .map(|(target, _, demand)| match from[target] {
                Some(from) if demand.is_infinite() => from,
                _ => *demand,
            })
            .collect();
        let whole = water_fill(capacity - others, &wants);
        let raised: Vec<(Target, f64, f64)> = set
            .into_iter()
            .zip(shares.into_iter().zip(whole))
            .filter(|((_, _, demand), _)| demand.is_infinite())
            .filter_map(|((target, _, _), (share, whole))| {
                let old = self.limits[&target].qps;
                let new = share.min(old * MAX_RAISE);
                // Within the headroom of it: rates measured over a span that saw the signal
                // are a little off either way.
                let wanted = from[&target].map_or(f64::INFINITY, |from| from * (1.0 - headroom));
                (new > old || whole >= wanted).then_some((target, new, whole - wanted))
            })
            .collect();
        for (target, new, spare) in raised {
            if new >= CEILING || spare >= 0.0 {
                released.push(target);
                continue;
            }
            if let Some(limit) = self.limits.get_mut(&target) {
                limit.qps = new;
            }
            actions.push(set_limit(&target, new, true));
        }
        // A key is given back what it sent once, at the first quiet round after its cut: after
        // that, what it sends is its limit's, and what it wants is unknown.
        for limit in self.limits.values_mut() {
            limit.from = None;
        }
        for target in released {
            self.limits.remove(&target);
            actions.push(Action::RemoveLimit {
                rpc: target.0,
                key: target.1,
            });
        }
        if self.limits.is_empty() {
            self.capacity = None;
            self.peak = None;
        }
        actions
    }

    /// Drops every limit and the estimate; returns what to apply.
    pub fn clear(&mut self) -> Vec<Action> {
        self.capacity = None;
        self.peak = None;
        std::mem::take(&mut self.limits)
            .into_keys()
            .map(|(rpc, key)| Action::RemoveLimit { rpc, key })
            .collect()
    }

    #[cfg(test)]
    /// The limit on `target`, if any.
    pub fn limit(&self, target: &Target) -> Option<f64> {
        self.limits.get(target).map(|l| l.qps)
    }
}

fn set_limit(target: &Target, qps: f64, reset: bool) -> Action {
    Action::SetLimit {
        rpc: target.0.clone(),
        key: target.1.clone(),
        qps,
        reset,
    }
}

#[cfg(test)]
mod tests;
