//! Each limiter's table as a policy configures it: `token_bucket`, `leaky_bucket`, `strict`,
//! the windows' (`WindowSpec`), `concurrency` with its shared pool, and per-kind overrides.
//! `config.rs` puts one of them in a policy.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a node does when the owner of a shared concurrency pool cannot be asked.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// Per-kind overrides of a limiter's main number (its rate, `refill_amount`, `qps`, `limit` or
/// `node_limit`), each of that number's own type: a rate for the rate limiters, a whole count
/// for the ones that count units.
pub type Overrides<T = f64> = BTreeMap<String, Override<T>>;

/// How one kind is limited under a policy. Written as a number: `-1` the policy's default,
/// `0` unlimited, anything else that value (checked with the policy: above 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Override<T = f64> {
    /// The policy's default buckets (`-1`).
    Default,
    /// No limit: admitted, counted, never throttled (`0`).
    Unlimited,
    /// Buckets of its own, with this value in place of the limiter's.
    Value(T),
}

/// A limiter's main number as an override gives it: a rate (`f64`) or a whole count (`u64`).
pub trait LimitValue: Copy {
    /// The written number as this value, or what is wrong with it.
    fn from_number(number: f64) -> Result<Self, String>;

    /// The value as a number (a rate).
    fn to_number(self) -> f64;
}

impl LimitValue for f64 {
    /// Any number: a rate's range is checked with the policy.
    fn from_number(number: f64) -> Result<f64, String> {
        Ok(number)
    }

    fn to_number(self) -> f64 {
        self
    }
}

impl LimitValue for u64 {
    fn to_number(self) -> f64 {
        self as f64
    }

    fn from_number(number: f64) -> Result<u64, String> {
        if number.fract() != 0.0 || !(0.0..=u64::MAX as f64).contains(&number) {
            return Err(format!(
                "must be -1 (default), 0 (unlimited) or a whole number above 0, got {number}"
            ));
        }
        Ok(number as u64)
    }
}

impl<T: LimitValue> Override<T> {
    /// The override as written.
    pub fn number(self) -> f64 {
        match self {
            Override::Default => -1.0,
            Override::Unlimited => 0.0,
            Override::Value(value) => value.to_number(),
        }
    }

    /// The override with its value as a rate, for what every limiter does alike.
    pub fn as_f64(self) -> Override<f64> {
        match self {
            Override::Default => Override::Default,
            Override::Unlimited => Override::Unlimited,
            Override::Value(value) => Override::Value(value.to_number()),
        }
    }

    /// The override a number stands for.
    pub fn from_number(number: f64) -> Result<Self, String> {
        if number == -1.0 {
            Ok(Override::Default)
        } else if number == 0.0 {
            Ok(Override::Unlimited)
        } else {
            T::from_number(number).map(Override::Value)
        }
    }
}

impl<T: LimitValue> Serialize for Override<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.number())
    }
}

impl<'de, T: LimitValue> Deserialize<'de> for Override<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = f64::deserialize(deserializer)?;
        Override::from_number(number).map_err(serde::de::Error::custom)
    }
}

/// `token_bucket = { rate, burst?, per_core?, overrides? }`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketSpec {
    /// Tokens per second.
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    pub overrides: Overrides,
}

/// `leaky_bucket = { initial?, refill_interval, refill_amount, max, fair?, per_core?, overrides? }`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakyBucketSpec {
    /// Tokens a new bucket starts with (default 0).
    #[serde(default)]
    pub initial: u64,
    /// Over this interval, `refill_amount` tokens are added.
    #[serde(with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    pub refill_interval: Duration,
    /// Tokens added per interval.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub refill_amount: u64,
    /// The most tokens a bucket holds.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max: u64,
    /// Serve waiters strictly in arrival order (default true).
    #[serde(default = "yes")]
    pub fair: bool,
    /// Multiply `refill_amount`, `max` and `initial` by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind `refill_amount`s (`max` and `initial` scale with them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    pub overrides: Overrides<u64>,
}

/// `strict = { qps, per_core?, overrides? }`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrictSpec {
    /// Requests per second, exactly spaced.
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub qps: f64,
    /// Multiply qps by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind qps.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    pub overrides: Overrides,
}

/// A window limiter's table, e.g. `fixed_window = { limit, window, per_core?, overrides? }`: at
/// most `limit` hits per window, windows aligned to the Unix epoch, counted as the table's
/// [`Count`](crate::limiter::Count) counts (a fixed window counts refused hits too, as the
/// reference Envoy rate limit server does). A window never queues: the policy must say
/// `on_exhausted = "reject"`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    /// Hits per window.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub limit: u64,
    /// A window's length (at least 1 ms).
    #[serde(with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    pub window: Duration,
    /// Multiply `limit` by the number of cores.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_core: bool,
    /// Per-kind limits.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    pub overrides: Overrides<u64>,
}

/// `concurrency = { node_limit, lease_ttl?, shared_limit?, on_unavailable?, max_loan?,
/// learning_period?, per_core?, overrides? }`.
///
/// The core enforces `node_limit`, and a lease lives `lease_ttl` on a node as in a cluster. The
/// rest configures the shared pool, the cluster-wide tier the cluster layer adds on top; the
/// core only reads and checks it ([`SharedPoolSpec`]). The wire form is one flat table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawConcurrencySpec", into = "RawConcurrencySpec")]
pub struct ConcurrencySpec {
    /// In-flight requests per key on this node. 0: no node tier (everything goes to the shared
    /// pool, where there is one).
    pub node_limit: u64,
    /// How long a lease lives unless renewed or released (default 30 s).
    pub lease_ttl: Duration,
    /// The shared pool across the cluster (cluster mode).
    pub shared: SharedPoolSpec,
    /// Multiply `node_limit` by the number of cores.
    pub per_core: bool,
    /// Per-kind `node_limit`s.
    pub overrides: Overrides<u64>,
}

/// A concurrency policy's shared pool: in-flight requests per key across the cluster beyond
/// the node tiers, counted by each bucket's owner. Read by the cluster layer alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPoolSpec {
    /// In-flight requests per key across the cluster, beyond the node tiers (default 0: none).
    pub shared_limit: u64,
    /// What to do when the shared pool cannot be asked (default `open`).
    pub on_unavailable: OnUnavailable,
    /// The most shared units a bucket's owner lends one node at once, for its requests to take
    /// with no call to the owner (default 16; 1: every shared admission asks the owner).
    pub max_loan: u64,
    /// `open` and `local_share` policies: how long a bucket's new owner waits, before it
    /// grants, for the leases other nodes hold to be handed over to it (default 0 s: it grants
    /// at once; at most `lease_ttl`; `closed` policies always wait a full `lease_ttl`).
    pub learning_period: Duration,
}

impl Default for SharedPoolSpec {
    /// No shared pool.
    fn default() -> Self {
        SharedPoolSpec {
            shared_limit: 0,
            on_unavailable: OnUnavailable::default(),
            max_loan: DEFAULT_MAX_LOAN,
            learning_period: Duration::ZERO,
        }
    }
}

/// The wire form of a [`ConcurrencySpec`]: one flat table.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConcurrencySpec {
    node_limit: u64,
    #[serde(default)]
    shared_limit: u64,
    #[serde(default = "default_lease_ttl", with = "crate::duration::serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    lease_ttl: Duration,
    #[serde(default)]
    on_unavailable: OnUnavailable,
    #[serde(
        default = "default_max_loan",
        skip_serializing_if = "is_default_max_loan"
    )]
    max_loan: u64,
    #[serde(
        default,
        with = "crate::duration::serde",
        skip_serializing_if = "Duration::is_zero"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::Duration))]
    learning_period: Duration,
    #[serde(default, skip_serializing_if = "is_false")]
    per_core: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    overrides: Overrides<u64>,
}

#[cfg(feature = "openapi")]
crate::openapi::schema_as!(ConcurrencySpec, RawConcurrencySpec);

impl From<RawConcurrencySpec> for ConcurrencySpec {
    fn from(raw: RawConcurrencySpec) -> Self {
        ConcurrencySpec {
            node_limit: raw.node_limit,
            lease_ttl: raw.lease_ttl,
            shared: SharedPoolSpec {
                shared_limit: raw.shared_limit,
                on_unavailable: raw.on_unavailable,
                max_loan: raw.max_loan,
                learning_period: raw.learning_period,
            },
            per_core: raw.per_core,
            overrides: raw.overrides,
        }
    }
}

impl From<ConcurrencySpec> for RawConcurrencySpec {
    fn from(spec: ConcurrencySpec) -> Self {
        RawConcurrencySpec {
            node_limit: spec.node_limit,
            shared_limit: spec.shared.shared_limit,
            lease_ttl: spec.lease_ttl,
            on_unavailable: spec.shared.on_unavailable,
            max_loan: spec.shared.max_loan,
            learning_period: spec.shared.learning_period,
            per_core: spec.per_core,
            overrides: spec.overrides,
        }
    }
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

fn yes() -> bool {
    true
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(30)
}

/// The default `max_loan`: enough for a node's requests to take shared units without a call
/// in steady state, small enough that what lies idle on a node is little of a pool.
pub const DEFAULT_MAX_LOAN: u64 = 16;

fn default_max_loan() -> u64 {
    DEFAULT_MAX_LOAN
}

fn is_default_max_loan(max_loan: &u64) -> bool {
    *max_loan == DEFAULT_MAX_LOAN
}
