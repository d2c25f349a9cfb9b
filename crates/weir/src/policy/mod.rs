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

pub mod config;
pub mod principal;
mod set;
pub mod stats;
pub mod throttled;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

pub use config::{
    ConcurrencySpec, KindLimit, LeakyBucketSpec, LimiterSpec, Mode, OnExhausted, OnUnavailable,
    PolicyConfig, PolicyError, StrictSpec, TokenBucketSpec,
};
pub use set::{Admissions, PolicySet};
use stats::{Outcome, PolicyStats, StatsSnapshot, ThrottleReport};
use throttled::{Changes, ThrottledKeys};

use crate::backpressure::{Backpressure, BackpressureStats};
use crate::clock::{Clock, Nanos};
use crate::keyed::{KeyedAdmission, KeyedLimiter, KeyedRefusal, Shape, StoreCounters, Taken};

/// A request asking to be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The bucket: a tenant, a user, an RPC type and table.
    pub key: &'a str,
    /// The kind of work (task kind, RPC type). Empty: no kind — only policies that apply to
    /// every kind see it.
    pub kind: &'a str,
    /// Tokens (or permits) it costs.
    pub cost: u64,
    /// The longest this request is willing to wait (the policy's `max_wait` still caps it).
    pub max_wait: Option<Duration>,
}

impl<'a> Request<'a> {
    /// A request of cost 1 and no kind for `key`.
    pub fn new(key: &'a str) -> Self {
        Request {
            key,
            kind: "",
            cost: 1,
            max_wait: None,
        }
    }

    /// The same request with a kind.
    pub fn kind(self, kind: &'a str) -> Self {
        Request { kind, ..self }
    }

    /// The same request with a cost.
    pub fn cost(self, cost: u64) -> Self {
        Request { cost, ..self }
    }

    /// The same request, waiting at most `max_wait`.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        Request {
            max_wait: Some(max_wait),
            ..self
        }
    }
}

/// Why a policy refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The policy that refused.
    pub policy: String,
    /// Why.
    pub reason: RejectReason,
}

/// The reason behind a [`Rejection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The bucket is exhausted; it could admit after `retry_after` where that is known.
    Limited {
        /// When asking again could succeed (rate limiters), `None` for concurrency limits.
        retry_after: Option<Duration>,
    },
    /// The request waited `max_wait` without getting its turn.
    WaitedTooLong {
        /// The policy's `max_wait`.
        max_wait: Duration,
    },
    /// The policy tracks `max_keys` keys, none idle, and refuses new ones.
    KeysExhausted {
        /// The cap.
        max_keys: usize,
    },
    /// The request costs more than a bucket ever holds. Without waiting it can never be
    /// admitted, however long the caller waits before asking again (a waiting acquire drains
    /// the full bucket and waits for the rest).
    ExceedsCapacity {
        /// What was asked.
        cost: u64,
        /// The most a bucket holds (`burst` or `max`).
        capacity: u64,
    },
    /// The request costs more than the policy allows one request to.
    CostTooLarge {
        /// What was asked.
        cost: u64,
        /// The most one request may cost.
        max: u64,
    },
}

impl Rejection {
    /// When asking again could succeed, where the limiter knows.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.reason {
            RejectReason::Limited { retry_after } => retry_after,
            RejectReason::WaitedTooLong { .. }
            | RejectReason::KeysExhausted { .. }
            | RejectReason::ExceedsCapacity { .. }
            | RejectReason::CostTooLarge { .. } => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy `{}`: ", self.policy)?;
        match self.reason {
            RejectReason::Limited {
                retry_after: Some(after),
            } => write!(f, "rate limited; retry after {after:?}"),
            RejectReason::Limited { retry_after: None } => {
                write!(f, "concurrency limit reached")
            }
            RejectReason::WaitedTooLong { max_wait } => {
                write!(f, "still limited after waiting the maximum of {max_wait:?}")
            }
            RejectReason::KeysExhausted { max_keys } => write!(
                f,
                "tracks its maximum of {max_keys} keys, none idle, and refuses new keys"
            ),
            RejectReason::ExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the bucket's capacity of {capacity}: refused every time it is asked without waiting; lower the cost, raise the bucket's burst, or wait (`on_exhausted = \"wait\"`)"
            ),
            RejectReason::CostTooLarge { cost, max } => {
                write!(f, "cost {cost} exceeds the maximum of {max} per request")
            }
        }
    }
}

impl std::error::Error for Rejection {}

/// The buckets a request of some kind is counted in.
#[derive(Debug)]
enum KindBuckets<C: Clock + Clone> {
    Unlimited,
    Own(Arc<KeyedLimiter<C>>),
}

/// Everything a reconfiguration replaces, swapped in one atomic step.
#[derive(Debug)]
struct PolicyState<C: Clock + Clone> {
    config: PolicyConfig,
    /// The default buckets (`None` for an adaptive policy).
    default: Option<Arc<KeyedLimiter<C>>>,
    kinds: HashMap<String, KindBuckets<C>>,
    /// The controller of an adaptive policy.
    adaptive: Option<Arc<Backpressure<C>>>,
    stats: Arc<PolicyStats>,
    throttled: Arc<ThrottledKeys>,
}

impl<C: Clock + Clone> PolicyState<C> {
    /// The buckets for `kind`: `None` if the policy does not apply, `Some(None)` if the kind has
    /// no buckets (unlimited, or an adaptive policy).
    #[inline]
    fn buckets(&self, kind: &str) -> Option<Option<&Arc<KeyedLimiter<C>>>> {
        if !self.config.applies_to(kind) {
            return None;
        }
        match self.kinds.get(kind) {
            None => Some(self.default.as_ref()),
            Some(KindBuckets::Unlimited) => Some(None),
            Some(KindBuckets::Own(limiter)) => Some(Some(limiter)),
        }
    }

    fn counters(&self) -> StoreCounters {
        let mut total = self
            .default
            .as_ref()
            .map(|d| d.counters())
            .unwrap_or_default();
        for buckets in self.kinds.values() {
            if let KindBuckets::Own(limiter) = buckets {
                let c = limiter.counters();
                total.keys += c.keys;
                total.evictions += c.evictions;
                total.overflow_hits += c.overflow_hits;
            }
        }
        total
    }
}

/// An admitted request. Dropping it marks the request finished (and releases concurrency
/// permits); [`Policy::rollback`] gives back what it took instead.
#[derive(Debug)]
#[must_use = "dropping an admission finishes the request and releases its permits"]
pub struct Admission<C: Clock + Clone> {
    state: Option<Arc<PolicyState<C>>>,
    taken: Option<Taken>,
    waited: Duration,
    outcome: Option<Outcome>,
}

impl<C: Clock + Clone> Admission<C> {
    /// An admission by a policy that does not apply to the request: nothing counted.
    fn untouched() -> Self {
        Admission {
            state: None,
            taken: None,
            waited: Duration::ZERO,
            outcome: None,
        }
    }

    /// How long the request waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the request had to wait.
    pub fn throttled(&self) -> bool {
        self.outcome == Some(Outcome::Throttled)
    }

    /// Whether the limiter refused but the policy admitted because it only monitors.
    pub fn would_throttle(&self) -> bool {
        self.outcome == Some(Outcome::WouldThrottle)
    }

    /// Whether the policy applied to the request at all.
    pub fn applied(&self) -> bool {
        self.state.is_some()
    }
}

impl<C: Clock + Clone> Drop for Admission<C> {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            state.stats.finish();
        }
    }
}

/// A named policy. See the [module docs](self).
pub struct Policy<C: Clock + Clone> {
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

    /// Whether the policy applies to requests of `kind`.
    pub fn applies_to(&self, kind: &str) -> bool {
        self.state.load().config.applies_to(kind)
    }

    /// Decides now, without waiting (whatever `on_exhausted` says).
    #[inline]
    pub fn try_acquire(&self, request: &Request<'_>) -> Result<Admission<C>, Rejection> {
        let state = self.state.load();
        let Some(buckets) = state.buckets(request.kind) else {
            return Ok(Admission::untouched());
        };
        state.stats.start();
        self.check_cost(&state, request)?;
        if let Some(adaptive) = &state.adaptive {
            return self.try_adaptive(&state, adaptive, request);
        }
        let Some(limiter) = buckets else {
            return Ok(self.admit(&state, None, Duration::ZERO, Outcome::Admitted));
        };
        match limiter.try_acquire(request.key, request.cost) {
            Ok(grant) => Ok(self.granted(&state, limiter, request, grant)),
            // Deciding now never times out: no wait to report.
            Err(refusal) => self.refused(&state, limiter, request, refusal, Duration::ZERO),
        }
    }

    /// Decides, waiting up to `max_wait` (the policy's, or the request's if shorter) if the
    /// policy says `wait`.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, request: &Request<'_>) -> Result<Admission<C>, Rejection> {
        let state = self.state.load_full();
        let max_wait = request
            .max_wait
            .map_or(state.config.max_wait, |w| w.min(state.config.max_wait));
        let waits = state.config.on_exhausted == OnExhausted::Wait
            && state.config.mode == config::Mode::Enforce
            && !max_wait.is_zero();
        if !waits {
            drop(state);
            return self.try_acquire(request);
        }
        let Some(buckets) = state.buckets(request.kind) else {
            return Ok(Admission::untouched());
        };
        state.stats.start();
        self.check_cost(&state, request)?;
        if let Some(adaptive) = &state.adaptive {
            return self
                .wait_adaptive(&state, adaptive, request, max_wait)
                .await;
        }
        let Some(limiter) = buckets else {
            return Ok(self.admit(&state, None, Duration::ZERO, Outcome::Admitted));
        };
        let limiter = Arc::clone(limiter);
        state.stats.waiting(1);
        let waiting = StillWaiting(&state.stats);
        let decided = limiter.acquire(request.key, request.cost, max_wait).await;
        drop(waiting);
        match decided {
            Ok(grant) => Ok(self.granted(&state, &limiter, request, grant)),
            Err(refusal) => self.refused(&state, &limiter, request, refusal, max_wait),
        }
    }

    /// Lets through a request that has no bucket key (its principal has no value for the
    /// policy's dimension), counting it as such if the policy applies to its kind.
    pub fn pass_unkeyed(&self, kind: &str) {
        let state = self.state.load();
        if state.config.applies_to(kind) {
            state.stats.unkeyed();
        }
    }

    /// An adaptive policy decides without waiting: the key's next slot, if it is limited.
    fn try_adaptive(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
    ) -> Result<Admission<C>, Rejection> {
        match adaptive.try_call(request.kind, request.key) {
            Ok(()) => {
                adaptive.after_call(request.kind, request.key);
                Ok(self.admit(state, None, Duration::ZERO, Outcome::Admitted))
            }
            Err(wait) => self.adaptive_refused(state, adaptive, request, wait),
        }
    }

    /// An adaptive policy that waits: takes the key's slot if it comes within `max_wait`.
    #[cfg(feature = "tokio")]
    async fn wait_adaptive(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
        max_wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        let reserved = adaptive.reserve_within(request.kind, request.key, max_wait);
        match reserved {
            Err(wait) => self.adaptive_refused(state, adaptive, request, wait),
            Ok(None) => {
                adaptive.after_call(request.kind, request.key);
                Ok(self.admit(state, None, Duration::ZERO, Outcome::Admitted))
            }
            Ok(Some(at)) => {
                let wait = Duration::from_nanos(at.saturating_sub(self.clock.now()));
                if !wait.is_zero() {
                    state.stats.waiting(1);
                    let waiting = StillWaiting(&state.stats);
                    tokio::time::sleep(wait).await;
                    drop(waiting);
                }
                adaptive.record_wait(request.kind, wait);
                adaptive.after_call(request.kind, request.key);
                let outcome = if wait.is_zero() {
                    Outcome::Admitted
                } else {
                    Outcome::Throttled
                };
                Ok(self.admit(state, None, wait, outcome))
            }
        }
    }

    fn adaptive_refused(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
        wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        // "Who is throttled" for an adaptive policy comes from its controller's limits.
        if state.config.mode == config::Mode::Monitor {
            adaptive.after_call(request.kind, request.key);
            return Ok(self.admit(state, None, Duration::ZERO, Outcome::WouldThrottle));
        }
        state.stats.decided(Outcome::Rejected, Duration::ZERO);
        Err(self.rejection(RejectReason::Limited {
            retry_after: Some(wait),
        }))
    }

    /// A downstream said "busy": an adaptive policy tightens its hottest keys. Returns whether
    /// limits were tightened, or `None` if the policy is not adaptive.
    pub fn busy(&self) -> Option<bool> {
        self.state.load().adaptive.as_ref().map(|a| a.on_busy())
    }

    /// `ms` milliseconds have passed: an adaptive policy may relax a level. Call it every second
    /// (a server runs one task for all its policies).
    pub fn tick(&self, ms: u64) {
        if let Some(adaptive) = &self.state.load().adaptive {
            adaptive.tick(ms);
        }
    }

    /// The adaptive controller's counters, for an adaptive policy.
    pub fn backpressure_stats(&self) -> Option<BackpressureStats> {
        self.state.load().adaptive.as_ref().map(|a| a.stats())
    }

    /// Gives back what `admission` took (a request that another policy refused).
    pub fn rollback(&self, request: &Request<'_>, mut admission: Admission<C>) {
        let (Some(state), Some(taken)) = (&admission.state, admission.taken.take()) else {
            return;
        };
        if let Some(Some(limiter)) = state.buckets(request.kind) {
            limiter.give_back(request.key, taken);
        }
    }

    fn check_cost(&self, state: &PolicyState<C>, request: &Request<'_>) -> Result<(), Rejection> {
        match state.config.max_cost {
            Some(max) if request.cost > max => {
                state.stats.decided(Outcome::Rejected, Duration::ZERO);
                Err(self.rejection(RejectReason::CostTooLarge {
                    cost: request.cost,
                    max,
                }))
            }
            _ => Ok(()),
        }
    }

    fn admit(
        &self,
        state: &Arc<PolicyState<C>>,
        taken: Option<Taken>,
        waited: Duration,
        outcome: Outcome,
    ) -> Admission<C> {
        state.stats.decided(outcome, waited);
        Admission {
            state: Some(Arc::clone(state)),
            taken,
            waited,
            outcome: Some(outcome),
        }
    }

    fn granted(
        &self,
        state: &Arc<PolicyState<C>>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
        grant: KeyedAdmission,
    ) -> Admission<C> {
        let outcome = if grant.waited.is_zero() {
            if grant.tracked {
                state.throttled.admitted(request.key, self.clock.now());
            }
            Outcome::Admitted
        } else {
            self.record_throttled(state, limiter, request);
            Outcome::Throttled
        };
        self.admit(state, Some(grant.taken), grant.waited, outcome)
    }

    /// Counts a refusal and says why; `max_wait` is how long a request that timed out waited.
    fn refused(
        &self,
        state: &Arc<PolicyState<C>>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
        refusal: KeyedRefusal,
        max_wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        self.record_throttled(state, limiter, request);
        if state.config.mode == config::Mode::Monitor {
            return Ok(self.admit(state, None, Duration::ZERO, Outcome::WouldThrottle));
        }
        // Only a request that waited its whole `max_wait` has waited at all.
        let (reason, waited) = match refusal {
            KeyedRefusal::Limited(crate::Refused::ExceedsCapacity { cost, capacity }) => (
                RejectReason::ExceedsCapacity { cost, capacity },
                Duration::ZERO,
            ),
            KeyedRefusal::Limited(refused) => (
                RejectReason::Limited {
                    retry_after: refused.retry_after(),
                },
                Duration::ZERO,
            ),
            KeyedRefusal::KeysExhausted => (
                RejectReason::KeysExhausted {
                    max_keys: state.config.max_keys,
                },
                Duration::ZERO,
            ),
            KeyedRefusal::TimedOut => (RejectReason::WaitedTooLong { max_wait }, max_wait),
        };
        state.stats.decided(Outcome::Rejected, waited);
        Err(self.rejection(reason))
    }

    fn rejection(&self, reason: RejectReason) -> Rejection {
        Rejection {
            policy: self.name.clone(),
            reason,
        }
    }

    /// Notes a throttled key in the "who is throttled" table and keeps the cell marks in step.
    fn record_throttled(
        &self,
        state: &PolicyState<C>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
    ) {
        let changes = state
            .throttled
            .throttled(request.key, request.kind, self.clock.now());
        if changes.added {
            limiter.set_tracked(request.key, true);
        }
        self.untrack(state, changes);
    }

    fn untrack(&self, state: &PolicyState<C>, changes: Changes) {
        for (key, kind) in changes.removed {
            if let Some(Some(limiter)) = state.buckets(&kind) {
                limiter.set_tracked(&key, false);
            }
        }
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
            .default
            .as_ref()
            .map(|d| PolicyConfig::limit_of(&d.shape()))
    }

    /// The limit for `kind` (`None`: unlimited, or the policy does not apply).
    pub fn limit_for(&self, kind: &str) -> Option<f64> {
        let state = self.state.load();
        state
            .buckets(kind)
            .flatten()
            .map(|limiter| PolicyConfig::limit_of(&limiter.shape()))
    }

    /// The keys this policy is holding back, most requests per second first, at most `limit`.
    pub fn throttled_keys(&self, limit: usize) -> Vec<ThrottledRow> {
        let state = self.state.load();
        if let Some(adaptive) = &state.adaptive {
            let mut rows: Vec<ThrottledRow> = adaptive
                .throttled()
                .into_iter()
                .map(|t| ThrottledRow {
                    policy: self.name.clone(),
                    key: t.key,
                    kind: t.rpc,
                    qps_limit: Some(t.qps_limit),
                    current_qps: t.current_qps,
                    in_flight: 0,
                    waiters: 0,
                })
                .collect();
            rows.sort_by(|a, b| b.current_qps.total_cmp(&a.current_qps));
            rows.truncate(limit);
            return rows;
        }
        let (keys, changes) = state.throttled.rows(self.clock.now(), limit);
        self.untrack(&state, changes);
        keys.into_iter()
            .map(|k| {
                let limiter = state.buckets(&k.kind).flatten();
                let (in_flight, waiters) =
                    limiter.and_then(|l| l.occupancy(&k.key)).unwrap_or((0, 0));
                ThrottledRow {
                    policy: self.name.clone(),
                    qps_limit: limiter.map(|l| PolicyConfig::limit_of(&l.shape())),
                    key: k.key,
                    kind: k.kind,
                    current_qps: k.current_qps,
                    in_flight,
                    waiters,
                }
            })
            .collect()
    }

    /// "Policy P was throttled in the last N s", if anything was throttled since the last call
    /// (or since the policy was created). Call it periodically.
    pub fn report(&self) -> Option<ThrottleReport> {
        let now = self.clock.now();
        let current = self.stats();
        let mut baseline = lock(&self.reconfiguring);
        let report = ThrottleReport::between(
            &self.name,
            Duration::from_nanos(now.saturating_sub(baseline.at)),
            &baseline.snapshot,
            &current,
            self.limit(),
        );
        *baseline = ReportBaseline {
            at: now,
            snapshot: current,
        };
        report
    }

    /// Drops idle buckets now (the policy also does this by itself at its key cap).
    pub fn sweep(&self) -> usize {
        let state = self.state.load();
        let mut dropped = state.default.as_ref().map_or(0, |d| d.sweep());
        for buckets in state.kinds.values() {
            if let KindBuckets::Own(limiter) = buckets {
                dropped += limiter.sweep();
            }
        }
        dropped
    }
}

/// Decrements the waiter gauge however the wait ends.
#[cfg(feature = "tokio")]
struct StillWaiting<'a>(&'a PolicyStats);

#[cfg(feature = "tokio")]
impl Drop for StillWaiting<'_> {
    fn drop(&mut self) {
        self.0.waiting(-1);
    }
}

/// A row of "who is throttled".
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ThrottledRow {
    /// The policy.
    pub policy: String,
    /// The key held back.
    pub key: String,
    /// The kind of its latest request.
    pub kind: String,
    /// The limit of its bucket (per second, or permits); `None` if unlimited.
    pub qps_limit: Option<f64>,
    /// Requests per second seen for it.
    pub current_qps: f64,
    /// Permits it holds now (concurrency).
    pub in_flight: u64,
    /// Its requests waiting now.
    pub waiters: u64,
}

/// Builds the buckets for `config`, reusing (and reshaping) those of `old` where the kind of
/// limiter is unchanged.
fn build_state<C: Clock + Clone>(
    config: &PolicyConfig,
    old: Option<&PolicyState<C>>,
    clock: &C,
    cores: usize,
    stats: Arc<PolicyStats>,
    throttled: Arc<ThrottledKeys>,
) -> Result<PolicyState<C>, PolicyError> {
    if let LimiterSpec::Adaptive(adaptive) = config.limiter()? {
        // In a policy the controller is on; monitor mode makes it a dry run.
        let settings = crate::backpressure::AdaptiveConfig {
            enabled: true,
            dry_run: adaptive.dry_run || config.mode == config::Mode::Monitor,
            ..adaptive.clone()
        };
        let invalid = |e| PolicyError::from_adaptive(&config.name, e);
        let controller = match old.and_then(|s| s.adaptive.as_ref()) {
            Some(existing) => {
                existing.reconfigure(settings).map_err(invalid)?;
                Arc::clone(existing)
            }
            None => Arc::new(Backpressure::new(settings, clock.clone()).map_err(invalid)?),
        };
        return Ok(PolicyState {
            config: config.clone(),
            default: None,
            kinds: HashMap::new(),
            adaptive: Some(controller),
            stats,
            throttled,
        });
    }
    let reuse = |existing: Option<&Arc<KeyedLimiter<C>>>, shape: Shape| {
        if let Some(limiter) = existing {
            if limiter.reshape(shape) {
                limiter.set_bounds(config.max_keys, config.overflow);
                return Arc::clone(limiter);
            }
        }
        Arc::new(KeyedLimiter::new(
            shape,
            config.max_keys,
            config.overflow,
            clock.clone(),
        ))
    };
    let default = reuse(
        old.and_then(|s| s.default.as_ref()),
        config.default_shape(cores)?,
    );
    let mut kinds = HashMap::new();
    let spec = config.limiter()?;
    for kind in spec.overrides().keys() {
        match config.kind_limit(kind, cores)? {
            None | Some(KindLimit::Default) => {}
            Some(KindLimit::Unlimited) => {
                kinds.insert(kind.clone(), KindBuckets::Unlimited);
            }
            Some(KindLimit::Own(shape)) => {
                let existing = old.and_then(|s| match s.kinds.get(kind) {
                    Some(KindBuckets::Own(limiter)) => Some(limiter),
                    _ => None,
                });
                kinds.insert(kind.clone(), KindBuckets::Own(reuse(existing, shape)));
            }
        }
    }
    Ok(PolicyState {
        config: config.clone(),
        default: Some(default),
        kinds,
        adaptive: None,
        stats,
        throttled,
    })
}
