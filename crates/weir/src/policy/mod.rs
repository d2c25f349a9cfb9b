//! Policies: what a service actually configures.
//!
//! A [`Policy`] is a named rule: which request kinds it applies to, a limiter per key (with
//! per-kind overrides), whether it enforces or only monitors, and what happens when a bucket is
//! exhausted (wait up to `max_wait`, or refuse at once with a retry-after). It counts what it
//! does ([`stats`]), knows which keys it is holding back ([`throttled`]), and can be
//! reconfigured while traffic flows: a changed spec keeps every bucket's state when the kind of
//! limiter stays the same, and never drops a waiter. Changing the kind of limiter (say, token
//! bucket to concurrency) starts every bucket afresh; requests already waiting finish on the old
//! buckets.
//!
//! A [`PolicySet`] holds the named policies of a service; a request that several policies apply
//! to must be admitted by all of them, and if one refuses, what the others took is given back.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`Policy`]: building, reconfiguring, reading its config, stats and limits |
//! | `config.rs` | a policy as configured: its one limiter, named by its table |
//! | `specs.rs` | each limiter's table, the concurrency one's shared pool apart |
//! | `validate.rs`, `shapes.rs` | checking a config; the bucket shapes it makes |
//! | `error.rs` | [`PolicyError`]: what is wrong, named by policy and field |
//! | `request.rs` | [`Request`], [`Rejection`] and its typed [`RejectReason`] |
//! | `admission.rs` | deciding, waiting, rollback; the [`Admission`] a request holds |
//! | `adaptive.rs` | a policy whose engine is adaptive backpressure |
//! | `state.rs` | the state a reconfiguration swaps: config and engine |
//! | `handover.rs` | what buckets carry from one owner to the next, and a new owner's hold |
//! | `held_back.rs` | who the policy holds back: rows and the periodic report |
//! | `throttled.rs`, `stats.rs` | the bounded "who is throttled" table; counters and histograms |
//! | `set.rs` | [`PolicySet`]: every policy that applies must admit |
//! | `principal.rs` | bucket keys from a workload group and a principal |
//!
//! ```
//! use weir::ManualClock;
//! use weir::policy::{Policy, PolicyConfig, Request};
//!
//! let config: PolicyConfig = toml::from_str(r#"
//!     name = "per-tenant"
//!     on_exhausted = "reject"
//!     token_bucket = { rate = 2, burst = 2 }
//! "#)?;
//! let policy = Policy::new(config, ManualClock::new(0))?;
//! let request = Request::new("tenant-a");
//! assert!(policy.try_acquire(&request).is_ok());
//! assert!(policy.try_acquire(&request).is_ok());
//! let refused = policy.try_acquire(&request).unwrap_err();
//! assert_eq!(refused.retry_after().unwrap().as_millis(), 500);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod adaptive;
mod admission;
pub mod config;
mod error;
mod handover;
mod held_back;
pub mod principal;
mod request;
mod set;
mod shapes;
mod specs;
mod state;
pub mod stats;
pub mod throttled;
mod validate;

pub use admission::Admission;
pub use handover::{SpentBucket, SpentState};
pub use held_back::ThrottledRow;
pub use request::{RejectReason, Rejection, Request};
use state::{PolicyState, build_state};

use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

pub use config::{
    ConcurrencySpec, KeyedSpec, LeakyBucketSpec, Limiter, Mode, OnExhausted, OnUnavailable,
    Override, PolicyConfig, PolicyError, Scope, StrictSpec, TokenBucketSpec, WindowSpec,
};
pub use set::{Admissions, PolicySet, PolicySetError};
pub use shapes::KindLimit;
use stats::{PolicyStats, StatsSnapshot};
use throttled::ThrottledKeys;

use crate::clock::{Clock, Nanos};
use crate::limiter::Quota;

/// The buckets a request of some kind is counted in ([`Policy::shape_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketShape {
    /// The policy does not apply to the kind, or keeps no buckets (adaptive).
    NotApplicable,
    /// The kind is not limited.
    Unlimited,
    /// The policy's default buckets, of this shape.
    Default(crate::keyed::Shape),
    /// The kind's own buckets, of this shape.
    Own(crate::keyed::Shape),
}

/// A named policy. See the [module docs](self).
pub struct Policy<C: Clock + Clone = crate::clock::SystemClock> {
    name: String,
    state: ArcSwap<PolicyState<C>>,
    clock: C,
    cores: usize,
    /// Serializes reconfigurations; also holds the baseline of the periodic report.
    reconfiguring: Mutex<ReportBaseline>,
}

#[derive(Debug, Default)]
struct ReportBaseline {
    at: Nanos,
    snapshot: StatsSnapshot,
}

impl<C: Clock + Clone> fmt::Debug for Policy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("config", &self.state.load().config)
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock + Clone> Policy<C> {
    /// A policy from `config`, with `per_core` counting this machine's cores.
    pub fn new(config: PolicyConfig, clock: C) -> Result<Self, PolicyError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Policy::with_cores(config, clock, cores)
    }

    /// A policy from `config`, with `per_core` counting `cores` cores.
    pub fn with_cores(config: PolicyConfig, clock: C, cores: usize) -> Result<Self, PolicyError> {
        config.validate()?;
        let stats = Arc::new(PolicyStats::default());
        let throttled = Arc::new(ThrottledKeys::default());
        let state = build_state(&config, None, &clock, cores, stats, throttled)?;
        let now = clock.now();
        Ok(Policy {
            name: config.name.clone(),
            state: ArcSwap::from_pointee(state),
            clock,
            cores,
            reconfiguring: Mutex::new(ReportBaseline {
                at: now,
                snapshot: StatsSnapshot::default(),
            }),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration in force.
    pub fn config(&self) -> PolicyConfig {
        self.state.load().config.clone()
    }

    /// Reads the configuration in force without copying it (for the request path).
    pub fn with_config<R>(&self, read: impl FnOnce(&PolicyConfig) -> R) -> R {
        read(&self.state.load().config)
    }

    /// Whether the policy applies to requests of `kind` (`None`: of no kind).
    pub fn applies_to(&self, kind: Option<&str>) -> bool {
        self.state.load().config.applies_to(kind)
    }

    /// Changes the policy while traffic flows. The new config is validated first; a rejected one
    /// leaves the policy exactly as it was. Buckets keep their state when the kind of limiter
    /// stays the same; waiters are never dropped.
    pub fn reconfigure(&self, mut config: PolicyConfig) -> Result<(), PolicyError> {
        if config.name.is_empty() {
            config.name = self.name.clone();
        }
        if config.name != self.name {
            return Err(PolicyError {
                policy: self.name.clone(),
                field: "name".to_owned(),
                problem: format!(
                    "cannot change to `{}`: a policy keeps its name",
                    config.name
                ),
            });
        }
        config.validate()?;
        let _serialized = lock(&self.reconfiguring);
        let old = self.state.load_full();
        let state = build_state(
            &config,
            Some(&old),
            &self.clock,
            self.cores,
            Arc::clone(&old.stats),
            Arc::clone(&old.throttled),
        )?;
        self.state.store(Arc::new(state));
        Ok(())
    }

    /// The policy's counters now.
    pub fn stats(&self) -> StatsSnapshot {
        let state = self.state.load();
        state.stats.snapshot(state.counters())
    }

    /// The limit each default bucket enforces: requests (or tokens) per second, or permits.
    /// `None` for an adaptive policy, whose limits are per key and change.
    pub fn limit(&self) -> Option<f64> {
        let state = self.state.load();
        state
            .default_buckets()
            .map(|d| PolicyConfig::limit_of(&d.shape()))
    }

    /// The limit for `kind` (`None`: unlimited, or the policy does not apply).
    pub fn limit_for(&self, kind: Option<&str>) -> Option<f64> {
        let state = self.state.load();
        state
            .buckets(kind)
            .flatten()
            .map(|limiter| PolicyConfig::limit_of(&limiter.shape()))
    }

    /// The shape of the buckets a request of `kind` is counted in, for buckets kept outside the
    /// policy (`scope = "redis"`).
    pub fn shape_for(&self, kind: Option<&str>) -> BucketShape {
        let state = self.state.load();
        if state.adaptive().is_some() {
            return BucketShape::NotApplicable;
        }
        let Some(buckets) = state.buckets(kind) else {
            return BucketShape::NotApplicable;
        };
        let Some(limiter) = buckets else {
            return BucketShape::Unlimited;
        };
        let own = state
            .default_buckets()
            .is_some_and(|default| !Arc::ptr_eq(default, limiter));
        match own {
            true => BucketShape::Own(limiter.shape()),
            false => BucketShape::Default(limiter.shape()),
        }
    }

    /// What `key` of `kind` has left now (see [`KeyedLimiter::quota`]): `None` if the policy
    /// does not apply to `kind`, leaves it unlimited, or is adaptive.
    ///
    /// [`KeyedLimiter::quota`]: crate::keyed::KeyedLimiter::quota
    pub fn quota(&self, kind: Option<&str>, key: &str) -> Option<Quota> {
        let state = self.state.load();
        if state.adaptive().is_some() {
            return None;
        }
        state
            .buckets(kind)
            .flatten()
            .map(|limiter| limiter.quota(key))
    }

    /// Drops idle buckets now (the policy also does this by itself at its key cap).
    pub fn sweep(&self) -> usize {
        let state = self.state.load();
        state.keyed_limiters().map(|limiter| limiter.sweep()).sum()
    }
}
