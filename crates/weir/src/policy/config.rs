//! What a policy is made of, as configuration: the serde types the server loads from TOML and
//! takes as JSON, and their validation.
//!
//! A policy names exactly one limiter table. In TOML:
//!
//! ```toml
//! [[policy]]
//! name = "getpage"
//! kinds = ["PageRequestHandler"]
//! on_exhausted = "wait"
//! max_wait = "5s"
//! leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 500, max = 5000 }
//! ```
//!
//! Validation reports every problem with the policy's name and the field's path, e.g.
//! ``policy `getpage`: `leaky_bucket.refill_amount` must be greater than zero``.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backpressure::AdaptiveConfig;
use crate::error::ConfigError;
use crate::keyed::{Overflow, Shape};
use crate::limiter::gcra::Params;
use crate::limiter::{LeakyBucketConfig, StrictConfig, TokenBucketConfig};

/// Whether a policy enforces its decisions or only records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Refuse or delay what the limiter says to.
    #[default]
    Enforce,
    /// Decide and count `would_throttle`, but admit everything (a dry run).
    Monitor,
}

/// What happens to a request the limiter cannot admit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Wait for a turn, up to `max_wait`, then refuse.
    #[default]
    Wait,
    /// Refuse at once, with a retry-after.
    Reject,
}

/// What a node does when the owner of a shared concurrency pool cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// Admit, and count it (fail open).
    #[default]
    Open,
    /// Refuse.
    Closed,
    /// Admit at most `ceil(shared_limit / N)` extra on this node.
    LocalShare,
}

/// Per-kind values: `-1` = the policy's default, `0` = unlimited, `> 0` = that value.
pub type Overrides = BTreeMap<String, f64>;

/// `token_bucket = { rate, burst?, per_core?, overrides? }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketSpec {
    /// Tokens per second.
    pub rate: f64,
    /// Largest burst; defaults to `rate` rounded up (`burst = qps`, as a host-level RPC limiter
    /// has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Multiply rate and burst by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind rates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: Overrides,
}

/// `leaky_bucket = { initial?, refill_interval, refill_amount, max, fair?, per_core?, overrides? }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakyBucketSpec {
    /// Tokens a new bucket starts with (default 0).
    #[serde(default)]
    pub initial: u64,
    /// Over this interval, `refill_amount` tokens are added.
    #[serde(with = "humantime_serde")]
    pub refill_interval: Duration,
    /// Tokens added per interval.
    pub refill_amount: u64,
    /// The most tokens a bucket holds.
    pub max: u64,
    /// Serve waiters strictly in arrival order (default true).
    #[serde(default = "yes")]
    pub fair: bool,
    /// Multiply `refill_amount`, `max` and `initial` by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind `refill_amount`s (`max` and `initial` scale with them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: Overrides,
}

/// `strict = { qps, per_core?, overrides? }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrictSpec {
    /// Requests per second, exactly spaced.
    pub qps: f64,
    /// Multiply qps by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind qps.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: Overrides,
}

/// `concurrency = { node_limit, shared_limit?, lease_ttl?, on_unavailable?, per_core?, overrides? }`.
///
/// The core enforces `node_limit`; `shared_limit`, `lease_ttl` and `on_unavailable` configure the
/// cluster-wide tier, which the cluster layer adds on top.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// In-flight requests per key on this node. 0: no node tier (everything goes to the shared
    /// pool, where there is one).
    pub node_limit: u64,
    /// In-flight requests per key across the cluster, beyond the node tiers (default 0).
    #[serde(default)]
    pub shared_limit: u64,
    /// How long a shared permit lives unless renewed (default 30 s).
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// What to do when the shared pool cannot be asked (default `open`).
    #[serde(default)]
    pub on_unavailable: OnUnavailable,
    /// Multiply `node_limit` by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind `node_limit`s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: Overrides,
}

/// One policy, as written in a config file or sent to the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy's name (over HTTP it comes from the URL).
    #[serde(default)]
    pub name: String,
    /// The kinds the policy applies to; empty = every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Enforce, or only record (default `enforce`).
    #[serde(default)]
    pub mode: Mode,
    /// Wait or reject when exhausted (default `wait`).
    #[serde(default)]
    pub on_exhausted: OnExhausted,
    /// The longest a request waits (default 5 s).
    #[serde(default = "default_max_wait", with = "humantime_serde")]
    pub max_wait: Duration,
    /// The most keys tracked at once (default 100 000).
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// New keys beyond `max_keys`, when nothing is idle: `shared` (default) or `reject`.
    #[serde(default)]
    pub overflow: Overflow,
    /// The largest cost one request may ask for (default: no limit beyond the limiter's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<u64>,
    /// A token bucket per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_bucket: Option<TokenBucketSpec>,
    /// A leaky bucket per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaky_bucket: Option<LeakyBucketSpec>,
    /// A strict limiter per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<StrictSpec>,
    /// A concurrency limit per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
    /// Adaptive backpressure: keys are (kind = RPC type, key = table), limited only when a
    /// downstream reports "busy". In a policy the controller is always on; `mode = "monitor"`
    /// makes it a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveConfig>,
}

fn is_false(b: &bool) -> bool {
    !*b
}
fn yes() -> bool {
    true
}
fn default_max_wait() -> Duration {
    Duration::from_secs(5)
}
fn default_max_keys() -> usize {
    100_000
}
fn default_lease_ttl() -> Duration {
    Duration::from_secs(30)
}

/// The one limiter table of a policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimiterSpec<'a> {
    /// `token_bucket`.
    TokenBucket(&'a TokenBucketSpec),
    /// `leaky_bucket`.
    LeakyBucket(&'a LeakyBucketSpec),
    /// `strict`.
    Strict(&'a StrictSpec),
    /// `concurrency`.
    Concurrency(&'a ConcurrencySpec),
    /// `adaptive`.
    Adaptive(&'a AdaptiveConfig),
}

/// Adaptive policies have no per-kind overrides.
static NO_OVERRIDES: Overrides = BTreeMap::new();

impl LimiterSpec<'_> {
    /// The table's name in config.
    pub fn table(&self) -> &'static str {
        match self {
            LimiterSpec::TokenBucket(_) => "token_bucket",
            LimiterSpec::LeakyBucket(_) => "leaky_bucket",
            LimiterSpec::Strict(_) => "strict",
            LimiterSpec::Concurrency(_) => "concurrency",
            LimiterSpec::Adaptive(_) => "adaptive",
        }
    }

    pub(crate) fn overrides(&self) -> &Overrides {
        match self {
            LimiterSpec::TokenBucket(s) => &s.overrides,
            LimiterSpec::LeakyBucket(s) => &s.overrides,
            LimiterSpec::Strict(s) => &s.overrides,
            LimiterSpec::Concurrency(s) => &s.overrides,
            LimiterSpec::Adaptive(_) => &NO_OVERRIDES,
        }
    }

    fn per_core(&self) -> bool {
        match self {
            LimiterSpec::TokenBucket(s) => s.per_core,
            LimiterSpec::LeakyBucket(s) => s.per_core,
            LimiterSpec::Strict(s) => s.per_core,
            LimiterSpec::Concurrency(s) => s.per_core,
            LimiterSpec::Adaptive(_) => false,
        }
    }
}

/// A policy config that does not hold together. Names the policy and the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("policy `{policy}`: `{field}` {problem}")]
pub struct PolicyError {
    /// The policy's name.
    pub policy: String,
    /// The field's path, e.g. `token_bucket.rate`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl PolicyError {
    fn new(policy: &str, field: impl Into<String>, problem: impl Into<String>) -> Self {
        // The error is printed for an operator: a name's control codes are shown escaped.
        let policy = if policy.chars().any(char::is_control) {
            policy.escape_debug().to_string()
        } else {
            policy.to_owned()
        };
        PolicyError {
            policy,
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn from_limiter(policy: &str, table: &str, err: &ConfigError) -> Self {
        let message = err.to_string();
        // ConfigError's text starts with the quoted field; keep only what follows it.
        let problem = message
            .split_once("` ")
            .map_or(message.as_str(), |(_, rest)| rest)
            .to_owned();
        PolicyError::new(policy, format!("{table}.{}", err.field()), problem)
    }

    /// An adaptive table's problem, named as `adaptive.FIELD` of `policy`.
    pub(crate) fn from_adaptive(policy: &str, err: crate::backpressure::AdaptiveError) -> Self {
        PolicyError::new(policy, format!("adaptive.{}", err.field), err.problem)
    }
}

/// How a kind is limited under a policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KindLimit {
    /// The policy's default buckets.
    Default,
    /// No limit for this kind (override 0): admitted, counted, never throttled.
    Unlimited,
    /// Buckets of its own, of this shape (override > 0).
    Own(Shape),
}

impl PolicyConfig {
    /// The policy's one limiter table.
    pub fn limiter(&self) -> Result<LimiterSpec<'_>, PolicyError> {
        let tables: Vec<LimiterSpec<'_>> = [
            self.token_bucket.as_ref().map(LimiterSpec::TokenBucket),
            self.leaky_bucket.as_ref().map(LimiterSpec::LeakyBucket),
            self.strict.as_ref().map(LimiterSpec::Strict),
            self.concurrency.as_ref().map(LimiterSpec::Concurrency),
            self.adaptive.as_ref().map(LimiterSpec::Adaptive),
        ]
        .into_iter()
        .flatten()
        .collect();
        match tables.as_slice() {
            [one] => Ok(*one),
            [] => Err(PolicyError::new(
                &self.name,
                "limiter",
                "is missing: give exactly one of token_bucket, leaky_bucket, strict, concurrency, adaptive",
            )),
            many => Err(PolicyError::new(
                &self.name,
                "limiter",
                format!(
                    "is ambiguous: give exactly one limiter table, not {}",
                    many.iter()
                        .map(LimiterSpec::table)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            )),
        }
    }

    /// Checks the whole policy; the error names the policy and the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_all().map_or(Ok(()), |errors| {
            Err(errors.into_iter().next().expect("non-empty"))
        })
    }

    /// Every problem with the policy (empty: none).
    pub fn problems(&self) -> Vec<PolicyError> {
        self.validate_all().unwrap_or_default()
    }

    fn validate_all(&self) -> Option<Vec<PolicyError>> {
        let name = self.name.as_str();
        let mut errors = Vec::new();
        if name.trim().is_empty() {
            errors.push(PolicyError::new(name, "name", "must not be empty"));
        }
        // Names and kinds are printed in logs, tables and metrics: no terminal control codes.
        if name.chars().any(char::is_control) {
            errors.push(PolicyError::new(
                name,
                "name",
                "must not contain control characters",
            ));
        }
        if self.kinds.iter().any(|k| k.chars().any(char::is_control)) {
            errors.push(PolicyError::new(
                name,
                "kinds",
                "must not contain control characters",
            ));
        }
        if self.kinds.iter().any(|k| k.trim().is_empty()) {
            errors.push(PolicyError::new(
                name,
                "kinds",
                "must not contain an empty kind",
            ));
        }
        if self.max_keys == 0 {
            errors.push(PolicyError::new(name, "max_keys", "must be at least 1"));
        }
        if self.max_cost == Some(0) {
            errors.push(PolicyError::new(name, "max_cost", "must be at least 1"));
        }
        match self.limiter() {
            Err(e) => errors.push(e),
            Ok(LimiterSpec::Adaptive(adaptive)) => {
                if let Err(e) = adaptive.validate() {
                    errors.push(PolicyError::from_adaptive(name, e));
                }
            }
            Ok(spec) => {
                if let Err(e) = self.shape_for(spec, 1.0) {
                    errors.push(e);
                }
                let table = spec.table();
                for (kind, &value) in spec.overrides() {
                    if kind.trim().is_empty() {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides"),
                            "must not name an empty kind",
                        ));
                    } else if !value.is_finite() || (value < 0.0 && value != -1.0) {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides.{kind}"),
                            format!("must be -1 (default), 0 (unlimited) or > 0, got {value}"),
                        ));
                    } else if value.fract() != 0.0
                        && matches!(
                            spec,
                            LimiterSpec::LeakyBucket(_) | LimiterSpec::Concurrency(_)
                        )
                    {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides.{kind}"),
                            format!("must be a whole number, got {value}"),
                        ));
                    } else if value > 0.0 {
                        if let Err(e) = self.shape_with_value(spec, value, 1.0) {
                            errors.push(PolicyError::new(
                                name,
                                format!("{table}.overrides.{kind}"),
                                e.problem,
                            ));
                        }
                    }
                }
            }
        }
        (!errors.is_empty()).then_some(errors)
    }

    /// The shape of the default buckets, with `cores` applied where `per_core` is set.
    pub fn default_shape(&self, cores: usize) -> Result<Shape, PolicyError> {
        let spec = self.limiter()?;
        self.shape_for(spec, core_factor(spec, cores))
    }

    /// How `kind` is limited: not at all (`None`: the policy does not apply to it), by the
    /// default buckets, without limit, or by buckets of its own.
    pub fn kind_limit(&self, kind: &str, cores: usize) -> Result<Option<KindLimit>, PolicyError> {
        if !self.applies_to(kind) {
            return Ok(None);
        }
        let spec = self.limiter()?;
        match spec.overrides().get(kind) {
            None => Ok(Some(KindLimit::Default)),
            Some(&-1.0) => Ok(Some(KindLimit::Default)),
            Some(&0.0) => Ok(Some(KindLimit::Unlimited)),
            Some(&v) => {
                let factor = core_factor(spec, cores);
                let shape = self.shape_with_value(spec, v, factor)?;
                Ok(Some(KindLimit::Own(shape)))
            }
        }
    }

    /// Whether the policy applies to requests of `kind`.
    pub fn applies_to(&self, kind: &str) -> bool {
        self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind)
    }

    /// The limit a bucket of `shape` enforces, in the unit people read: requests (or tokens)
    /// per second for rate limiters, permits for concurrency.
    pub fn limit_of(shape: &Shape) -> f64 {
        match *shape {
            Shape::Gcra { interval, .. } | Shape::Strict { interval } => 1e9 / interval as f64,
            Shape::Concurrency { limit } => limit as f64,
        }
    }

    /// The default shape scaled by `factor` (1 = as configured).
    fn shape_for(&self, spec: LimiterSpec<'_>, factor: f64) -> Result<Shape, PolicyError> {
        let name = &self.name;
        let table = spec.table();
        let limiter_err = |e: ConfigError| PolicyError::from_limiter(name, table, &e);
        match spec {
            LimiterSpec::TokenBucket(s) => {
                let rate = s.rate * factor;
                let burst = scale_count(
                    s.burst.unwrap_or_else(|| s.rate.ceil().max(1.0) as u64),
                    factor,
                );
                let config = TokenBucketConfig { rate, burst };
                config.validate().map_err(limiter_err)?;
                Ok(Shape::Gcra {
                    interval: Params::interval_for_rate(rate),
                    capacity: burst,
                    initial: burst,
                    fair: false,
                })
            }
            LimiterSpec::LeakyBucket(s) => {
                let config = LeakyBucketConfig {
                    initial: scale_count(s.initial, factor),
                    refill_interval: s.refill_interval,
                    refill_amount: scale_count(s.refill_amount, factor),
                    max: scale_count(s.max, factor),
                    fair: s.fair,
                };
                config.validate().map_err(limiter_err)?;
                let params = config.params();
                Ok(Shape::Gcra {
                    interval: params.interval,
                    capacity: config.max,
                    initial: config.initial,
                    fair: config.fair,
                })
            }
            LimiterSpec::Strict(s) => {
                let config = StrictConfig {
                    qps: s.qps * factor,
                };
                config.validate().map_err(limiter_err)?;
                Ok(Shape::Strict {
                    interval: Params::interval_for_rate(config.qps),
                })
            }
            LimiterSpec::Adaptive(_) => Err(PolicyError::new(
                name,
                "adaptive",
                "has no bucket shape: its keys are limited one by one",
            )),
            LimiterSpec::Concurrency(s) => {
                if s.lease_ttl.is_zero() {
                    return Err(PolicyError::new(
                        name,
                        "concurrency.lease_ttl",
                        "must be greater than zero",
                    ));
                }
                Ok(Shape::Concurrency {
                    limit: scale_count(s.node_limit, factor),
                })
            }
        }
    }

    /// The shape with the limiter's main number replaced by `value` (an override), and the
    /// numbers tied to it scaled alike.
    fn shape_with_value(
        &self,
        spec: LimiterSpec<'_>,
        value: f64,
        factor: f64,
    ) -> Result<Shape, PolicyError> {
        let main = match spec {
            LimiterSpec::TokenBucket(s) => s.rate,
            LimiterSpec::LeakyBucket(s) => s.refill_amount as f64,
            LimiterSpec::Strict(s) => s.qps,
            LimiterSpec::Concurrency(_) => {
                // A concurrency override is the limit itself, not a ratio of a limit that may
                // be 0.
                let limit = scale_count(value.round() as u64, factor);
                return Ok(Shape::Concurrency { limit });
            }
            LimiterSpec::Adaptive(_) => 1.0,
        };
        self.shape_for(spec, factor * value / main)
    }
}

fn core_factor(spec: LimiterSpec<'_>, cores: usize) -> f64 {
    if spec.per_core() {
        cores.max(1) as f64
    } else {
        1.0
    }
}

/// Scales a whole count, rounding to nearest and keeping a non-zero count non-zero.
fn scale_count(count: u64, factor: f64) -> u64 {
    if count == 0 {
        return 0;
    }
    ((count as f64 * factor).round() as u64).max(1)
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::Monitor => "monitor",
        })
    }
}
