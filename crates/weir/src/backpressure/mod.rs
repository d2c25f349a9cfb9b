//! Adaptive backpressure: slow down only the hottest keys when the server says "busy".
//!
//! A library a client embeds to protect a shared server. A uniform limit would penalise every table
//! while the few hot ones keep dominating; instead, when the server answers "busy", the client
//! finds the top-k keys by observed rate and limits each to `ratio ×` its rate, then relaxes step
//! by step once the server has been quiet a while.
//!
//! Four parts, each pure and tested on its own, wired by [`Backpressure`]:
//!
//! ```text
//! busy signal ─▶ Coordinator (cooldown, quiet timer) ─▶ StateMachine (levels, limits)
//!                                                            │ actions
//! after_call ─▶ QpsRegistry (rates, top-k)                   ▼
//! before_call ◀──────────────────────────────────────── Throttler (strict limiter per key)
//! ```
//!
//! - `QpsRegistry` (`registry.rs`): per (RPC type, key) rate over a window;
//! - `StateMachine` (`machine.rs`): no time, no I/O — tighten the snapshot, undo a level;
//! - `Coordinator` (`coordinator.rs`): ticks — whether to upgrade now, whether to downgrade now;
//! - `Throttler` (`throttler.rs`): a strict limiter per limited key.
//!
//! The four are internal: their contracts are tested in their files and through
//! [`Backpressure`], and may change without notice.
//!
//! [`host::HostLimiter`] is the other half of client-side protection: a token bucket per RPC
//! type.

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

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, duration_to_nanos};
use coordinator::{Coordinator, Timing};
use machine::{Action, HotKey, Squeeze, StateMachine};
use registry::QpsRegistry;
use throttler::Throttler;
pub use waits::WaitsByRpc;

fn is_false(value: &bool) -> bool {
    !*value
}

/// The adaptive controller's settings (`adaptive = { … }` in a policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConfig {
    /// The global switch (default off: adaptive backpressure is opt-in). Not a policy field: a
    /// policy's controller is always on.
    #[serde(default, skip_serializing_if = "is_false")]
    pub enabled: bool,
    /// Decide and record, but never make a call wait. Not a policy field: a policy in
    /// `mode = "monitor"` is a dry run.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Keys limited per RPC type per upgrade (default 2).
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Each upgrade multiplies a key's limit by this (default 0.75).
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    /// Limits never go below this many requests per second (default 1).
    #[serde(default = "default_floor")]
    pub floor: f64,
    /// The window rates are measured over (default 3 s). Fixed at creation.
    #[serde(default = "three_seconds", with = "humantime_serde")]
    pub window: Duration,
    /// The least time between two upgrades (default 3 s).
    #[serde(default = "three_seconds", with = "humantime_serde")]
    pub upgrade_interval: Duration,
    /// Quiet time after which one upgrade is undone (default 3 s).
    #[serde(default = "three_seconds", with = "humantime_serde")]
    pub downgrade_interval: Duration,
    /// The RPC types that take part (default: every type seen).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpcs: Vec<String>,
    /// Keys whose rate is tracked, per RPC type (default 100 000).
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
}

fn default_top_k() -> usize {
    2
}
fn default_ratio() -> f64 {
    0.75
}
fn default_floor() -> f64 {
    1.0
}
fn three_seconds() -> Duration {
    Duration::from_secs(3)
}
fn default_max_keys() -> usize {
    100_000
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            enabled: false,
            dry_run: false,
            top_k: default_top_k(),
            ratio: default_ratio(),
            floor: default_floor(),
            window: three_seconds(),
            upgrade_interval: three_seconds(),
            downgrade_interval: three_seconds(),
            rpcs: Vec::new(),
            max_keys: default_max_keys(),
        }
    }
}

/// An adaptive config that does not hold together; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`adaptive.{field}` {problem}")]
pub struct AdaptiveError {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl AdaptiveConfig {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), AdaptiveError> {
        let err = |field, problem: &str| {
            Err(AdaptiveError {
                field,
                problem: problem.to_owned(),
            })
        };
        if !(self.ratio > 0.0 && self.ratio < 1.0) {
            return err("ratio", "must be between 0 and 1 (exclusive)");
        }
        if !(self.floor.is_finite() && self.floor > 0.0) {
            return err("floor", "must be a finite number greater than zero");
        }
        // A key is never limited below the floor, so a floor a strict limiter can represent
        // keeps every limit the controller sets representable.
        if let Err(e) = (crate::limiter::StrictConfig { qps: self.floor }).validate() {
            let problem = e.to_string().replacen("`qps`", "it", 1);
            return err("floor", &problem);
        }
        if self.top_k == 0 {
            return err("top_k", "must be at least 1");
        }
        if self.window < Duration::from_millis(3) {
            return err("window", "must be at least 3ms");
        }
        if self.upgrade_interval.is_zero() {
            return err("upgrade_interval", "must be greater than zero");
        }
        if self.downgrade_interval.is_zero() {
            return err("downgrade_interval", "must be greater than zero");
        }
        if self.max_keys == 0 {
            return err("max_keys", "must be at least 1");
        }
        Ok(())
    }

    fn timing(&self) -> Timing {
        Timing {
            upgrade_cooldown: self.upgrade_interval.as_millis() as u64,
            downgrade_after: self.downgrade_interval.as_millis() as u64,
        }
    }

    fn squeeze(&self) -> Squeeze {
        Squeeze {
            ratio: self.ratio,
            floor: self.floor,
        }
    }
}

/// The controller's counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BackpressureStats {
    /// Busy signals received.
    pub busy_signals: u64,
    /// Upgrades made (a busy signal past the cooldown that limited something).
    pub upgrades: u64,
    /// Downgrades made.
    pub downgrades: u64,
    /// Upgrade levels not yet undone.
    pub level: usize,
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
struct Control {
    machine: StateMachine,
    coordinator: Coordinator,
}

/// The controller: busy signals in, per-key limits out. See the [module docs](self).
pub struct Backpressure<C: Clock + Clone = crate::clock::SystemClock> {
    config: Mutex<AdaptiveConfig>,
    enabled: AtomicBool,
    dry_run: AtomicBool,
    registry: QpsRegistry,
    control: Mutex<Control>,
    throttler: Throttler<C>,
    waits: WaitsByRpc,
    busy_signals: AtomicU64,
    upgrades: AtomicU64,
    downgrades: AtomicU64,
    clock: C,
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
            control: Mutex::new(Control {
                machine: StateMachine::new(config.squeeze()),
                coordinator: Coordinator::new(config.timing()),
            }),
            throttler: Throttler::new(clock.clone()),
            waits: WaitsByRpc::default(),
            busy_signals: AtomicU64::new(0),
            upgrades: AtomicU64::new(0),
            downgrades: AtomicU64::new(0),
            config: Mutex::new(config),
            clock,
        })
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The server said "busy". Returns true if that tightened some limits.
    pub fn on_busy(&self) -> bool {
        self.busy_signals.fetch_add(1, Ordering::Relaxed);
        if !self.enabled.load(Ordering::Relaxed) {
            return false;
        }
        let (top_k, rpcs) = {
            let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
            (config.top_k, config.rpcs.clone())
        };
        let mut control = self.control();
        if !control.coordinator.report_busy() {
            return false;
        }
        let now = self.clock.now();
        let rpcs = if rpcs.is_empty() {
            self.registry.rpcs()
        } else {
            rpcs
        };
        let snapshot: Vec<HotKey> = rpcs
            .iter()
            .flat_map(|rpc| self.registry.top_k(rpc, top_k, now))
            .collect();
        let actions = control.machine.on_upgrade(&snapshot);
        if actions.is_empty() {
            control.coordinator.upgrade_skipped();
            return false;
        }
        self.apply(&actions);
        self.upgrades.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `ms` milliseconds have passed. Returns true if that relaxed a level of limits. The task
    /// from [`ticker`](Self::ticker) calls this every second.
    pub fn tick(&self, ms: u64) -> bool {
        let mut control = self.control();
        if !control.coordinator.tick(ms) {
            return false;
        }
        let actions = control.machine.on_downgrade();
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
        config.validate()?;
        let mut current = self.config.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut control = self.control();
            control.machine.set_squeeze(config.squeeze());
            control.coordinator.set_timing(config.timing());
        }
        self.enabled.store(config.enabled, Ordering::Relaxed);
        self.dry_run.store(config.dry_run, Ordering::Relaxed);
        *current = AdaptiveConfig {
            window: current.window,
            max_keys: current.max_keys,
            ..config
        };
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
        BackpressureStats {
            busy_signals: self.busy_signals.load(Ordering::Relaxed),
            upgrades: self.upgrades.load(Ordering::Relaxed),
            downgrades: self.downgrades.load(Ordering::Relaxed),
            level: self.control().machine.level(),
            throttled_keys,
            waits: self.waits.snapshot(),
        }
    }
}
