//! Adaptive backpressure: slow down only the hottest keys when the server says "busy".
//!
//! A library a client embeds to protect a shared server. A uniform limit would penalise every table
//! while the few hot ones keep dominating; instead, when the server answers "busy", the client
//! limits the top-k keys by observed rate, and relaxes once the server has been quiet a while.
//! Two ways of doing so, chosen by [`AdaptiveConfig::control`]:
//!
//! - **converging** (the default, [`Control::Converging`]): a busy signal measures what the
//!   backend accepts and cuts the limited and top-k keys to a max-min fair share of it; every
//!   quiet `downgrade_interval` raises every limited key towards a slowly growing estimate and
//!   releases keys that no longer use their limits. Limits settle just under the capacity; see
//!   `converging.rs` for the algorithm and why.
//! - **step-wise** ([`Control::Stepwise`]): the design it comes from, exactly — each upgrade
//!   limits each top-k key to `ratio ×` its rate or limit, and each quiet period undoes the
//!   newest upgrade whole, from a history stack.
//!
//! Five parts, each pure and tested on its own, wired by [`Backpressure`]:
//!
//! ```text
//! on_busy… ─▶ Coordinator (cooldown, quiet timer) ─▶ Converging or StateMachine (limits)
//!   │ busy answers                                           │ actions
//!   ▼                                                        ▼
//! after_call ─▶ QpsRegistry (rates, top-k, totals)
//! before_call ◀──────────────────────────────────────── Throttler (strict limiter per key)
//! ```
//!
//! - `QpsRegistry` (`registry.rs`): per (RPC type, key) rate over a window, and per RPC type
//!   all calls and busy answers;
//! - `Converging` (`converging.rs`): no time, no I/O — the converging control law;
//! - `StateMachine` (`machine.rs`): no time, no I/O — tighten the snapshot, undo a level;
//! - `Coordinator` (`coordinator.rs`): ticks — whether to decide now, whether to relax now;
//! - `Throttler` (`throttler.rs`): a strict limiter per limited key.
//!
//! The five are internal: their contracts are tested in their files and through
//! [`Backpressure`], and may change without notice.
//!
//! [`host::HostLimiter`] is the other half of client-side protection: a token bucket per RPC
//! type.

mod config;
mod converging;
mod coordinator;
pub mod host;
mod machine;
pub(crate) mod registry;
mod throttler;
mod waits;

use std::collections::BTreeMap;
#[cfg(feature = "tokio")]
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, duration_to_nanos};
pub use config::{AdaptiveConfig, AdaptiveError, Control};
use converging::{Converging, Load, Signal};
use coordinator::Coordinator;
use machine::{Action, HotKey, StateMachine};
use registry::QpsRegistry;
use throttler::Throttler;
pub use waits::WaitsByRpc;

/// The controller's counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BackpressureStats {
    /// Busy signals received.
    pub busy_signals: u64,
    /// Upgrades made (a busy signal past the cooldown that limited something).
    pub upgrades: u64,
    /// Downgrades made (a quiet period that relaxed something).
    pub downgrades: u64,
    /// Upgrade levels not yet undone (step-wise control; 0 when converging).
    pub level: usize,
    /// The converging controller's estimate of the calls a second the backend accepts, while
    /// it limits a key.
    pub capacity: Option<f64>,
    /// Limited keys per RPC type.
    pub throttled_keys: BTreeMap<String, usize>,
    /// Per RPC type: total wait and waits per bucket of the wait histogram.
    pub waits: BTreeMap<String, (Duration, Vec<u64>)>,
}

/// A limited key, for "who is throttled".
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottledTarget {
    /// The RPC type.
    pub rpc: String,
    /// The key.
    pub key: String,
    /// Its limit, requests per second.
    pub qps_limit: f64,
    /// Its observed rate.
    pub current_qps: f64,
}

#[derive(Debug)]
struct ControlState {
    control: Control,
    machine: StateMachine,
    converging: Converging,
    coordinator: Coordinator,
}

/// The controller: busy signals in, per-key limits out. See the [module docs](self).
pub struct Backpressure<C: Clock + Clone = crate::clock::SystemClock> {
    /// Lock order: `config` before `control`. Code holding `control` never takes `config`
    /// (copy what it needs out of `config` first), or a reconfigure and a tick could deadlock.
    config: Mutex<AdaptiveConfig>,
    enabled: AtomicBool,
    dry_run: AtomicBool,
    registry: QpsRegistry,
    control: Mutex<ControlState>,
    throttler: Throttler<C>,
    waits: WaitsByRpc,
    busy_signals: AtomicU64,
    upgrades: AtomicU64,
    downgrades: AtomicU64,
    clock: C,
    /// When the controller was made: rates are not measured over time before it.
    started: crate::clock::Nanos,
}

impl<C: Clock + Clone> std::fmt::Debug for Backpressure<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backpressure")
            .field(
                "config",
                &*self.config.lock().unwrap_or_else(|p| p.into_inner()),
            )
            .finish()
    }
}

impl<C: Clock + Clone> Backpressure<C> {
    /// A controller with `config`, reading time from `clock`.
    pub fn new(config: AdaptiveConfig, clock: C) -> Result<Self, AdaptiveError> {
        config.validate()?;
        Ok(Backpressure {
            enabled: AtomicBool::new(config.enabled),
            dry_run: AtomicBool::new(config.dry_run),
            registry: QpsRegistry::new(duration_to_nanos(config.window), config.max_keys),
            control: Mutex::new(ControlState {
                control: config.control,
                machine: StateMachine::new(config.squeeze()),
                converging: Converging::new(config.tuning()),
                coordinator: Coordinator::new(config.timing()),
            }),
            throttler: Throttler::new(clock.clone()),
            waits: WaitsByRpc::default(),
            busy_signals: AtomicU64::new(0),
            upgrades: AtomicU64::new(0),
            downgrades: AtomicU64::new(0),
            config: Mutex::new(config),
            started: clock.now(),
            clock,
        })
    }

    fn control(&self) -> std::sync::MutexGuard<'_, ControlState> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The controller's clock now: what a caller measures a call's latency with, so that it
    /// agrees with the controller (and a paused clock in tests).
    pub fn now(&self) -> crate::clock::Nanos {
        self.clock.now()
    }

    /// What the converging controller decides on: rates over the registry's recent span, of
    /// the RPC types `rpcs`; the top `top_k` keys of each only if asked (a walk over the keys).
    fn load(&self, converging: &Converging, top_k: Option<usize>, rpcs: &[String]) -> Load {
        let now = self.clock.now();
        let span = self
            .registry
            .recent_span(now)
            .min(now.saturating_sub(self.started))
            .max(1_000_000);
        let seconds = span as f64 / 1e9;
        let mut load = Load::default();
        for rpc in rpcs {
            let (calls, busy) = self.registry.recent_totals(rpc, now);
            load.total += calls as f64 / seconds;
            load.busy += busy as f64 / seconds;
            if let Some(k) = top_k {
                load.top.extend(
                    self.registry
                        .recent_top(rpc, k, now)
                        .into_iter()
                        .map(|(key, calls)| ((rpc.clone(), key), calls as f64 / seconds)),
                );
            }
        }
        load.limited = converging
            .limited()
            .map(|target| {
                let calls = self.registry.recent_calls(&target.0, &target.1, now);
                (target.clone(), calls as f64 / seconds)
            })
            .collect();
        load
    }

    fn rpcs(&self, configured: Vec<String>) -> Vec<String> {
        if configured.is_empty() {
            self.registry.rpcs()
        } else {
            configured
        }
    }

    /// A downstream said "busy" without saying to which call (as `Policy::busy` and the
    /// server's busy endpoint do). Returns true if that tightened some limits.
    ///
    /// Converging: a signal with no call attached counts no call, so it cannot measure the
    /// overload; it cuts the capacity estimate by `ratio` (the step-wise control's cut).
    pub fn on_busy(&self) -> bool {
        self.signal(Signal::Bare, None)
    }

    /// A call of RPC type `rpc` was answered "busy". Returns true if that tightened some
    /// limits. An RPC type not in `rpcs` (when `rpcs` is set) does not take part: its answers
    /// are ignored.
    ///
    /// Converging: the answer is counted against the calls of its type, and the accepted rate
    /// (calls less busy answers) is the capacity estimate.
    pub fn on_busy_for(&self, rpc: &str) -> bool {
        self.signal(Signal::Answer, Some(rpc))
    }

    /// A call of RPC type `rpc` was answered, but slowly (see
    /// [`ThrottleLayer::busy_when_slower_than`](crate::layer::ThrottleLayer::busy_when_slower_than)).
    /// Returns true if that tightened some limits. Ignored for an RPC type not taking part.
    ///
    /// Converging: the call was accepted, so it is no refused call; it sets the estimate to
    /// the accepted rate, and holds it while the limits keep the traffic under it, so a backend
    /// slow on every call is not cut down to the floor.
    pub fn on_slow_for(&self, rpc: &str) -> bool {
        self.signal(Signal::Slow, Some(rpc))
    }

    fn signal(&self, signal: Signal, rpc: Option<&str>) -> bool {
        if !self.enabled.load(Ordering::Relaxed) {
            self.busy_signals.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Copied out before `control` is locked: see the lock order on `config`.
        let (top_k, rpcs, window) = {
            let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
            (config.top_k, config.rpcs.clone(), config.window)
        };
        if let Some(rpc) = rpc
            && !rpcs.is_empty()
            && !rpcs.iter().any(|r| r == rpc)
        {
            return false;
        }
        self.busy_signals.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        if let (Signal::Answer, Some(rpc)) = (signal, rpc) {
            self.registry.record_busy(rpc, now);
        }
        // A slow answer says the backend is at its knee at the rate it takes, which is only
        // known once a window of answers has been counted: before that, the answers of calls
        // still in flight are missing, and the rate would be taken too low.
        if signal == Signal::Slow && now.saturating_sub(self.started) < duration_to_nanos(window) {
            return false;
        }
        let rpcs = self.rpcs(rpcs);
        let mut control = self.control();
        let control = &mut *control;
        if !control.coordinator.report_busy() {
            if control.control == Control::Converging && control.converging.len() > 0 {
                let load = self.load(&control.converging, None, &rpcs);
                control.converging.note_busy(signal, &load);
            }
            return false;
        }
        let actions = match control.control {
            Control::Stepwise => {
                let snapshot: Vec<HotKey> = rpcs
                    .iter()
                    .flat_map(|rpc| self.registry.top_k(rpc, top_k, now))
                    .collect();
                let actions = control.machine.on_upgrade(&snapshot);
                if actions.is_empty() {
                    control.coordinator.upgrade_skipped();
                }
                actions
            }
            Control::Converging => {
                let load = self.load(&control.converging, Some(top_k), &rpcs);
                let actions = control.converging.on_busy(signal, &load);
                let limited = control.converging.len() > 0;
                control.coordinator.set_pending(limited);
                actions
            }
        };
        if actions.is_empty() {
            return false;
        }
        self.apply(&actions);
        self.upgrades.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `ms` milliseconds have passed. Returns true if that relaxed limits (step-wise: a level;
    /// converging: every limited key that could be raised or released). The task
    /// from [`ticker`](Self::ticker) calls this every second.
    pub fn tick(&self, ms: u64) -> bool {
        // Copied out before `control` is locked: see the lock order on `config`.
        let rpcs = {
            let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
            config.rpcs.clone()
        };
        let mut control = self.control();
        if !control.coordinator.tick(ms) {
            return false;
        }
        let actions = match control.control {
            Control::Stepwise => control.machine.on_downgrade(),
            Control::Converging => {
                let rpcs = self.rpcs(rpcs);
                // A quiet round raises and releases limited keys only: no top-k, no key walk.
                let load = self.load(&control.converging, None, &rpcs);
                let actions = control.converging.on_quiet(&load);
                let limited = control.converging.len() > 0;
                control.coordinator.set_pending(limited);
                actions
            }
        };
        if actions.is_empty() {
            return false;
        }
        self.apply(&actions);
        self.downgrades.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn apply(&self, actions: &[Action]) {
        for action in actions {
            match action {
                Action::SetLimit {
                    rpc,
                    key,
                    qps,
                    reset,
                } => self.throttler.set(rpc, key, *qps, *reset),
                Action::RemoveLimit { rpc, key } => self.throttler.remove(rpc, key),
            }
        }
    }

    /// The instant (on this controller's clock) a call to `rpc`/`key` may run; `None` if now.
    /// Takes the slot: use it for exactly one call.
    #[inline]
    pub fn reserve(&self, rpc: &str, key: &str) -> Option<crate::clock::Nanos> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        self.throttler.reserve(rpc, key)
    }

    /// A call to `rpc`/`key` now, if it may run now: `Err(wait)` (nothing taken) otherwise.
    pub fn try_call(&self, rpc: &str, key: &str) -> Result<(), Duration> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.throttler.try_acquire(rpc, key)
    }

    /// Reserves a call to `rpc`/`key` if it may run within `max_wait`: the instant it may run
    /// (`None`: now), or `Err(wait)` with nothing taken.
    pub fn reserve_within(
        &self,
        rpc: &str,
        key: &str,
        max_wait: Duration,
    ) -> Result<Option<crate::clock::Nanos>, Duration> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(None);
        }
        self.throttler.reserve_within(rpc, key, max_wait)
    }

    /// Whether calls only record what they would have waited (dry run).
    pub fn dry_run(&self) -> bool {
        self.dry_run.load(Ordering::Relaxed)
    }

    /// Records a wait of a call of `rpc` (for callers that wait by themselves).
    pub fn record_wait(&self, rpc: &str, waited: Duration) {
        self.waits.record(rpc, waited);
    }

    /// Waits until a call to `rpc`/`key` may run; returns the wait (in dry-run mode, the wait
    /// that would have been, without sleeping).
    #[cfg(feature = "tokio")]
    pub async fn before_call(&self, rpc: &str, key: &str) -> Duration {
        let Some(at) = self.reserve(rpc, key) else {
            return Duration::ZERO;
        };
        let wait = Duration::from_nanos(at.saturating_sub(self.clock.now()));
        if !wait.is_zero() && !self.dry_run.load(Ordering::Relaxed) {
            tokio::time::sleep(wait).await;
        }
        self.waits.record(rpc, wait);
        wait
    }

    /// Records a completed call to `rpc`/`key`.
    #[inline]
    pub fn after_call(&self, rpc: &str, key: &str) {
        if self.enabled.load(Ordering::Relaxed) {
            self.registry.record(rpc, key, self.clock.now());
        }
    }

    /// A future that calls [`tick`](Self::tick) every second until the controller is dropped.
    /// Spawn it on the runtime of your choice (the core does not start tasks itself).
    #[cfg(feature = "tokio")]
    pub fn ticker(self: &Arc<Self>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let weak = Arc::downgrade(self);
        async move {
            let mut interval = tokio::time::interval(Duration::from_secs(1));
            interval.tick().await;
            loop {
                interval.tick().await;
                let Some(controller) = weak.upgrade() else {
                    return;
                };
                controller.tick(1000);
            }
        }
    }

    /// Applies changed settings (all but `window` and `max_keys`, which are fixed at creation):
    /// they take effect from the next signal, tick or call. A rejected config changes nothing.
    pub fn reconfigure(&self, config: AdaptiveConfig) -> Result<(), AdaptiveError> {
        // Lock order: `config`, then `control` (see the field).
        let mut current = self.config.lock().unwrap_or_else(|p| p.into_inner());
        let config = AdaptiveConfig {
            window: current.window,
            max_keys: current.max_keys,
            ..config
        };
        config.validate()?;
        {
            let mut control = self.control();
            if control.control != config.control {
                // The two keep different state: the new one starts from no limits.
                let mut actions = control.converging.clear();
                actions.extend(
                    self.throttler
                        .limited()
                        .into_iter()
                        .map(|(rpc, key, _)| Action::RemoveLimit { rpc, key }),
                );
                self.apply(&actions);
                control.machine = StateMachine::new(config.squeeze());
                control.coordinator = Coordinator::new(config.timing());
                control.control = config.control;
            }
            control.machine.set_squeeze(config.squeeze());
            let lifted = control.converging.set_tuning(config.tuning());
            self.apply(&lifted);
            control.coordinator.set_timing(config.timing());
        }
        self.enabled.store(config.enabled, Ordering::Relaxed);
        self.dry_run.store(config.dry_run, Ordering::Relaxed);
        *current = config;
        Ok(())
    }

    /// The settings in force.
    pub fn config(&self) -> AdaptiveConfig {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The limit on `rpc`/`key`, if any.
    pub fn limit(&self, rpc: &str, key: &str) -> Option<f64> {
        self.throttler.limit(rpc, key)
    }

    /// The observed rate of `rpc`/`key`.
    pub fn qps(&self, rpc: &str, key: &str) -> f64 {
        self.registry.qps(rpc, key, self.clock.now())
    }

    /// The limited keys with their limits and observed rates.
    pub fn throttled(&self) -> Vec<ThrottledTarget> {
        let now = self.clock.now();
        self.throttler
            .limited()
            .into_iter()
            .map(|(rpc, key, qps_limit)| ThrottledTarget {
                current_qps: self.registry.qps(&rpc, &key, now),
                rpc,
                key,
                qps_limit,
            })
            .collect()
    }

    /// The controller's counters now.
    pub fn stats(&self) -> BackpressureStats {
        let mut throttled_keys = BTreeMap::new();
        for (rpc, _, _) in self.throttler.limited() {
            *throttled_keys.entry(rpc).or_insert(0) += 1;
        }
        let (level, capacity) = {
            let control = self.control();
            (control.machine.level(), control.converging.capacity())
        };
        BackpressureStats {
            busy_signals: self.busy_signals.load(Ordering::Relaxed),
            upgrades: self.upgrades.load(Ordering::Relaxed),
            downgrades: self.downgrades.load(Ordering::Relaxed),
            level,
            capacity,
            throttled_keys,
            waits: self.waits.snapshot(),
        }
    }
}
