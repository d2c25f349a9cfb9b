//! What a policy is made of, as configuration: the serde types the server loads from TOML and
//! takes as JSON. They are checked in `validate.rs`, and turned into bucket shapes in
//! `shapes.rs`.
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

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backpressure::AdaptiveConfig;
use crate::limiter::{Count, fixed_window, sliding_window};

pub use super::error::PolicyError;
pub use super::specs::{
    ConcurrencySpec, DEFAULT_MAX_LOAN, LeakyBucketSpec, LimitValue, OnUnavailable, Override,
    Overrides, SharedPoolSpec, StrictSpec, TokenBucketSpec, WindowSpec,
};
use crate::keyed::Overflow;

/// Whether a policy enforces its decisions or only records them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Wait for a turn, up to `max_wait`, then refuse.
    #[default]
    Wait,
    /// Refuse at once, with a retry-after.
    Reject,
}

/// Where a rate policy's buckets live.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// A bucket per key on each node: N nodes admit up to N times the rate (default).
    #[default]
    Node,
    /// One bucket per key in the whole cluster, decided by its owner on the ring (cluster mode;
    /// a node alone decides every bucket itself).
    Cluster,
    /// One bucket per key in the server's Redis (`[redis]`), shared by every node that uses it:
    /// each decision is one script run there, so the nodes keep no state of their own.
    Redis,
}

/// One policy, as written in a config file or sent to the API.
///
/// It has exactly one [`Limiter`]. The wire form names it by its table (`token_bucket`,
/// `leaky_bucket`, `strict`, a window's such as `fixed_window`, `concurrency`, `adaptive`);
/// parsing refuses none or two, so a parsed policy cannot hold an illegal combination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawPolicyConfig", into = "RawPolicyConfig")]
pub struct PolicyConfig {
    /// The policy's name (over HTTP it comes from the URL).
    pub name: String,
    /// The kinds the policy applies to; empty = every kind.
    pub kinds: Vec<String>,
    /// Enforce, or only record (default `enforce`).
    pub mode: Mode,
    /// Wait or reject when exhausted (default `wait`).
    pub on_exhausted: OnExhausted,
    /// The longest a request waits (default 5 s).
    pub max_wait: Duration,
    /// The most keys tracked at once (default 100 000).
    pub max_keys: usize,
    /// New keys beyond `max_keys`, when nothing is idle: `shared` (default) or `reject`.
    pub overflow: Overflow,
    /// The largest cost one request may ask for (default: no limit beyond the limiter's own).
    pub max_cost: Option<u64>,
    /// A bucket per key on each node (default), or one per key in the cluster.
    pub scope: Scope,
    /// `scope = "cluster"`: for how long a bucket's new owner holds it to the share of its
    /// capacity that its time as owner is of this period (or of the refill time, if shorter),
    /// because an owner that crashed could not hand over what it had spent (default 0 s: a
    /// bucket whose owner crashed starts full on the next; at least the refill time, a crash
    /// over-admits nothing).
    pub learning_period: Duration,
    /// `scope = "cluster"`: whether a node that asks for a bucket often may be lent a share
    /// of its rate and decide within it (default), or forwards every request to the owner.
    pub assignments: bool,
    /// The policy's one limiter.
    pub limiter: Limiter,
}

/// A policy's one limiter.
#[derive(Debug, Clone, PartialEq)]
pub enum Limiter {
    /// A bucket per key.
    Keyed(KeyedSpec),
    /// Adaptive backpressure (`adaptive`): keys are (kind = RPC type, key = table), limited only
    /// when a downstream reports "busy". In a policy the controller is always on;
    /// `mode = "monitor"` makes it a dry run.
    Adaptive(AdaptiveConfig),
}

/// The limiter of a policy that keeps a bucket per key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyedSpec {
    /// `token_bucket`.
    TokenBucket(TokenBucketSpec),
    /// `leaky_bucket`.
    LeakyBucket(LeakyBucketSpec),
    /// `strict`.
    Strict(StrictSpec),
    /// `concurrency`.
    Concurrency(ConcurrencySpec),
    /// A window limiter's table: `fixed_window`, or another [`Count`]'s.
    Window(Count, WindowSpec),
}

/// Each window limiter's table: how it counts, and where the wire form keeps it.
type WindowTable = (Count, fn(&mut RawPolicyConfig) -> &mut Option<WindowSpec>);

/// The window limiters, in the order they are listed.
const WINDOW_TABLES: &[WindowTable] = &[
    (fixed_window::COUNT, |raw| &mut raw.fixed_window),
    (sliding_window::COUNT, |raw| &mut raw.sliding_window),
];

/// Every limiter table a policy can name, one of which it must.
pub fn limiter_tables() -> impl Iterator<Item = &'static str> {
    let windows = WINDOW_TABLES.iter().map(|(count, _)| count.name());
    ["token_bucket", "leaky_bucket", "strict"]
        .into_iter()
        .chain(windows)
        .chain(["concurrency", "adaptive"])
}

impl TryFrom<RawPolicyConfig> for PolicyConfig {
    type Error = PolicyError;

    fn try_from(mut raw: RawPolicyConfig) -> Result<Self, PolicyError> {
        let windows: Vec<Limiter> = WINDOW_TABLES
            .iter()
            .filter_map(|&(count, table)| {
                let spec = table(&mut raw).take()?;
                Some(Limiter::Keyed(KeyedSpec::Window(count, spec)))
            })
            .collect();
        let mut tables: Vec<Limiter> = [
            raw.token_bucket
                .map(|s| Limiter::Keyed(KeyedSpec::TokenBucket(s))),
            raw.leaky_bucket
                .map(|s| Limiter::Keyed(KeyedSpec::LeakyBucket(s))),
            raw.strict.map(|s| Limiter::Keyed(KeyedSpec::Strict(s))),
            raw.concurrency
                .map(|s| Limiter::Keyed(KeyedSpec::Concurrency(s))),
            raw.adaptive.map(Limiter::Adaptive),
        ]
        .into_iter()
        .flatten()
        .chain(windows)
        .collect();
        let limiter = match tables.len() {
            1 => tables.remove(0),
            0 => {
                return Err(PolicyError::new(
                    &raw.name,
                    "limiter",
                    format!(
                        "is missing: give exactly one of {}",
                        limiter_tables().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            _ => {
                return Err(PolicyError::new(
                    &raw.name,
                    "limiter",
                    format!(
                        "is ambiguous: give exactly one limiter table, not {}",
                        tables
                            .iter()
                            .map(Limiter::table)
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                ));
            }
        };
        Ok(PolicyConfig {
            name: raw.name,
            kinds: raw.kinds,
            mode: raw.mode,
            on_exhausted: raw.on_exhausted,
            max_wait: raw.max_wait,
            max_keys: raw.max_keys,
            overflow: raw.overflow,
            max_cost: raw.max_cost,
            scope: raw.scope,
            learning_period: raw.learning_period,
            assignments: raw.assignments,
            limiter,
        })
    }
}

impl From<PolicyConfig> for RawPolicyConfig {
    fn from(config: PolicyConfig) -> Self {
        let mut raw = RawPolicyConfig {
            name: config.name,
            kinds: config.kinds,
            mode: config.mode,
            on_exhausted: config.on_exhausted,
            max_wait: config.max_wait,
            max_keys: config.max_keys,
            overflow: config.overflow,
            max_cost: config.max_cost,
            scope: config.scope,
            learning_period: config.learning_period,
            assignments: config.assignments,
            token_bucket: None,
            leaky_bucket: None,
            strict: None,
            fixed_window: None,
            sliding_window: None,
            concurrency: None,
            adaptive: None,
        };
        match config.limiter {
            Limiter::Keyed(KeyedSpec::TokenBucket(s)) => raw.token_bucket = Some(s),
            Limiter::Keyed(KeyedSpec::LeakyBucket(s)) => raw.leaky_bucket = Some(s),
            Limiter::Keyed(KeyedSpec::Strict(s)) => raw.strict = Some(s),
            Limiter::Keyed(KeyedSpec::Window(count, s)) => {
                if let Some((_, table)) = WINDOW_TABLES.iter().find(|(c, _)| *c == count) {
                    *table(&mut raw) = Some(s);
                }
            }
            Limiter::Keyed(KeyedSpec::Concurrency(s)) => raw.concurrency = Some(s),
            Limiter::Adaptive(a) => raw.adaptive = Some(a),
        }
        raw
    }
}

/// The wire form of a [`PolicyConfig`]: the limiter as optional tables, of which exactly one
/// must be given.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicyConfig {
    /// The policy's name (over HTTP it comes from the URL).
    #[serde(default)]
    name: String,
    /// The kinds the policy applies to; empty = every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kinds: Vec<String>,
    /// Enforce, or only record (default `enforce`).
    #[serde(default)]
    mode: Mode,
    /// Wait or reject when exhausted (default `wait`).
    #[serde(default)]
    on_exhausted: OnExhausted,
    /// The longest a request waits (default 5 s).
    #[serde(default = "default_max_wait", with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    max_wait: Duration,
    /// The most keys tracked at once (default 100 000).
    #[serde(default = "default_max_keys")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    max_keys: usize,
    /// New keys beyond `max_keys`, when nothing is idle: `shared` (default) or `reject`.
    #[serde(default)]
    overflow: Overflow,
    /// The largest cost one request may ask for (default: no limit beyond the limiter's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    max_cost: Option<u64>,
    /// A bucket per key on each node (default), or one per key in the cluster.
    #[serde(default, skip_serializing_if = "is_node_scope")]
    scope: Scope,
    /// `scope = "cluster"`: how long a bucket's new owner holds it to its tenure's share.
    #[serde(
        default,
        with = "crate::duration::serde",
        skip_serializing_if = "Duration::is_zero"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    learning_period: Duration,
    /// `scope = "cluster"`: shares of a hot bucket's rate lent to the nodes that ask for it.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    assignments: bool,
    /// A token bucket per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token_bucket: Option<TokenBucketSpec>,
    /// A leaky bucket per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    leaky_bucket: Option<LeakyBucketSpec>,
    /// A strict limiter per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    strict: Option<StrictSpec>,
    /// A fixed window per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fixed_window: Option<WindowSpec>,
    /// A sliding window counter per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sliding_window: Option<WindowSpec>,
    /// A concurrency limit per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    concurrency: Option<ConcurrencySpec>,
    /// Adaptive backpressure: keys are (kind = RPC type, key = table), limited only when a
    /// downstream reports "busy". In a policy the controller is always on; `mode = "monitor"`
    /// makes it a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    adaptive: Option<AdaptiveConfig>,
}

#[cfg(feature = "openapi")]
crate::openapi::schema_as!(PolicyConfig, RawPolicyConfig);

fn is_node_scope(scope: &Scope) -> bool {
    *scope == Scope::Node
}
fn default_max_wait() -> Duration {
    Duration::from_secs(5)
}
fn default_max_keys() -> usize {
    100_000
}

impl Limiter {
    /// The table's name in config.
    pub fn table(&self) -> &'static str {
        match self {
            Limiter::Keyed(spec) => spec.table(),
            Limiter::Adaptive(_) => "adaptive",
        }
    }
}

impl KeyedSpec {
    /// The table's name in config.
    pub fn table(&self) -> &'static str {
        match self {
            KeyedSpec::TokenBucket(_) => "token_bucket",
            KeyedSpec::LeakyBucket(_) => "leaky_bucket",
            KeyedSpec::Strict(_) => "strict",
            KeyedSpec::Window(count, _) => count.name(),
            KeyedSpec::Concurrency(_) => "concurrency",
        }
    }

    /// Per-kind values of the limiter's main number, each as a rate (a count's value is
    /// whole).
    pub fn overrides(&self) -> Vec<(&str, Override)> {
        fn each<T: LimitValue>(overrides: &Overrides<T>) -> Vec<(&str, Override)> {
            let each = overrides.iter();
            each.map(|(kind, value)| (kind.as_str(), value.as_f64()))
                .collect()
        }
        match self {
            KeyedSpec::TokenBucket(s) => each(&s.overrides),
            KeyedSpec::LeakyBucket(s) => each(&s.overrides),
            KeyedSpec::Strict(s) => each(&s.overrides),
            KeyedSpec::Window(_, s) => each(&s.overrides),
            KeyedSpec::Concurrency(s) => each(&s.overrides),
        }
    }

    /// How `kind` is overridden, if it is.
    pub fn override_of(&self, kind: &str) -> Option<Override> {
        self.overrides()
            .into_iter()
            .find_map(|(k, value)| (k == kind).then_some(value))
    }

    /// A limiter of `limit` hits per `window`, named by its table: a window limiter, or a
    /// `token_bucket` refilling `limit` over `window` with a burst of `limit` (no double burst
    /// at a window's edge). How a rule of the Envoy rate limit service is counted.
    pub fn per_window(table: &str, limit: u64, window: Duration) -> Option<KeyedSpec> {
        if table == "token_bucket" {
            return Some(KeyedSpec::TokenBucket(TokenBucketSpec {
                rate: limit as f64 / window.as_secs_f64(),
                burst: Some(limit),
                per_core: false,
                overrides: Overrides::new(),
            }));
        }
        let &(count, _) = WINDOW_TABLES.iter().find(|(c, _)| c.name() == table)?;
        Some(KeyedSpec::Window(
            count,
            WindowSpec {
                limit,
                window,
                per_core: false,
                overrides: Overrides::new(),
            },
        ))
    }

    /// The tables [`per_window`](Self::per_window) knows, windows first.
    pub fn per_window_tables() -> impl Iterator<Item = &'static str> {
        let windows = WINDOW_TABLES.iter().map(|(count, _)| count.name());
        windows.chain(["token_bucket"])
    }

    /// Whether a refused request is counted too (a fixed window's).
    pub fn counts_refused(&self) -> bool {
        matches!(self, KeyedSpec::Window(count, _) if count.counts_refused())
    }

    pub(super) fn per_core(&self) -> bool {
        match self {
            KeyedSpec::TokenBucket(s) => s.per_core,
            KeyedSpec::LeakyBucket(s) => s.per_core,
            KeyedSpec::Strict(s) => s.per_core,
            KeyedSpec::Window(_, s) => s.per_core,
            KeyedSpec::Concurrency(s) => s.per_core,
        }
    }
}

impl PolicyConfig {
    /// The policy's per-key limiter, unless it is adaptive.
    pub fn keyed(&self) -> Option<&KeyedSpec> {
        match &self.limiter {
            Limiter::Keyed(spec) => Some(spec),
            Limiter::Adaptive(_) => None,
        }
    }

    /// The policy's concurrency limiter, if that is what it has.
    pub fn concurrency(&self) -> Option<&ConcurrencySpec> {
        match &self.limiter {
            Limiter::Keyed(KeyedSpec::Concurrency(spec)) => Some(spec),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::Monitor => "monitor",
        })
    }
}

fn yes() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_yes(value: &bool) -> bool {
    *value
}
