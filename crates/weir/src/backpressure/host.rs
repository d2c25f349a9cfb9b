//! The host-level RPC limiter: one token bucket per RPC type.
//!
//! A client that calls a shared server through many RPC types gives each type its own budget:
//! `qps = per-core value × cores` (at least one core), with `burst = qps`, from a default and
//! per-type overrides (`-1` = the default, `0` or below = no limit for that type). A global switch
//! turns it off. [`HostLimiter::reset_all`] applies a changed config while calls flow; each
//! type's bucket keeps its fill. The hot path is lock-free: an atomic load of the bucket table,
//! one hash lookup, one compare-and-swap.
//!
//! The limit applies before every attempt, retries included: call
//! [`acquire`](HostLimiter::acquire) right before each attempt. Waits are recorded per RPC type
//! when they are longer than zero.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use super::waits::WaitsByRpc;
use crate::clock::Clock;
use crate::error::{ConfigError, Refused};
use crate::limiter::{TokenBucket, TokenBucketConfig};

/// The host-level limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLimitsConfig {
    /// The global switch (default on).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Requests per second per core for every RPC type without an override (default 100).
    #[serde(default = "default_qps")]
    pub default_qps: f64,
    /// Per RPC type: `-1` = the default, `0` or below = no limit, `> 0` = that many per core.
    #[serde(default)]
    pub overrides: BTreeMap<String, f64>,
}

fn yes() -> bool {
    true
}
fn default_qps() -> f64 {
    100.0
}

impl Default for HostLimitsConfig {
    fn default() -> Self {
        HostLimitsConfig {
            enabled: true,
            default_qps: default_qps(),
            overrides: BTreeMap::new(),
        }
    }
}

impl HostLimitsConfig {
    /// The bucket for `rpc` on `cores` cores; `None`: no limit.
    fn bucket_config(&self, rpc: &str, cores: usize) -> Option<TokenBucketConfig> {
        let per_core = match self.overrides.get(rpc) {
            Some(&-1.0) => self.default_qps,
            Some(&v) => v,
            None => self.default_qps,
        };
        if per_core.is_nan() || per_core <= 0.0 {
            return None;
        }
        let qps = per_core * cores.max(1) as f64;
        Some(TokenBucketConfig {
            rate: qps,
            burst: (qps.ceil() as u64).max(1),
        })
    }

    /// Checks every rate as it is on `cores` cores (each must make a token bucket that can be
    /// represented: a bucket that cannot be made would leave its RPC type unlimited); the error
    /// names the field.
    pub fn validate_on(&self, cores: usize) -> Result<(), ConfigError> {
        self.validate()?;
        let rpcs = std::iter::once("").chain(self.overrides.keys().map(String::as_str));
        for rpc in rpcs {
            if let Some(bucket) = self.bucket_config(rpc, cores) {
                let field = if rpc.is_empty() {
                    "default_qps"
                } else {
                    "overrides"
                };
                bucket.validate().map_err(|e| e.for_field(field))?;
            }
        }
        Ok(())
    }

    /// Checks every rate; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default_qps > 0.0 {
            crate::error::check_rate("default_qps", self.default_qps)?;
        }
        for &v in self.overrides.values() {
            if v > 0.0 {
                crate::error::check_rate("overrides", v)?;
            } else if v.is_nan() {
                return Err(ConfigError::NotPositive {
                    field: "overrides",
                    value: v,
                });
            }
        }
        Ok(())
    }
}

type Buckets<C> = HashMap<String, Option<Arc<TokenBucket<C>>>>;

/// One token bucket per RPC type; see the [module docs](self).
pub struct HostLimiter<C: Clock + Clone = crate::clock::SystemClock> {
    config: Mutex<HostLimitsConfig>,
    enabled: AtomicBool,
    buckets: ArcSwap<Buckets<C>>,
    cores: usize,
    clock: C,
    waits: WaitsByRpc,
}

impl<C: Clock + Clone> std::fmt::Debug for HostLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLimiter")
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .field("rpcs", &self.buckets.load().len())
            .finish()
    }
}

impl<C: Clock + Clone> HostLimiter<C> {
    /// A limiter for `cores` cores. `rpcs` are created up front (others on first use).
    pub fn new(
        config: HostLimitsConfig,
        rpcs: &[&str],
        cores: usize,
        clock: C,
    ) -> Result<Self, ConfigError> {
        config.validate_on(cores)?;
        let limiter = HostLimiter {
            enabled: AtomicBool::new(config.enabled),
            config: Mutex::new(config),
            buckets: ArcSwap::from_pointee(HashMap::new()),
            cores,
            clock,
            waits: WaitsByRpc::default(),
        };
        for rpc in rpcs {
            limiter.bucket(rpc);
        }
        Ok(limiter)
    }

    fn bucket(&self, rpc: &str) -> Option<Arc<TokenBucket<C>>> {
        if let Some(bucket) = self.buckets.load().get(rpc) {
            return bucket.clone();
        }
        let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        let mut buckets = HashMap::clone(&self.buckets.load());
        let bucket = buckets
            .entry(rpc.to_owned())
            .or_insert_with(|| {
                config
                    .bucket_config(rpc, self.cores)
                    .and_then(|c| TokenBucket::with_clock(c, self.clock.clone()).ok())
                    .map(Arc::new)
            })
            .clone();
        self.buckets.store(Arc::new(buckets));
        bucket
    }

    /// Takes a token for a call of `rpc` now, or says when one will be there.
    #[inline]
    pub fn try_acquire(&self, rpc: &str) -> Result<(), Refused> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Known types decide through the table's reference: no refcount traffic per call.
        if let Some(known) = self.buckets.load().get(rpc) {
            return known
                .as_ref()
                .map_or(Ok(()), |bucket| bucket.try_acquire(1));
        }
        match self.bucket(rpc) {
            Some(bucket) => bucket.try_acquire(1),
            None => Ok(()),
        }
    }

    /// Waits for a token for a call of `rpc`; returns how long it waited.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, rpc: &str) -> Duration {
        if !self.enabled.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let Some(bucket) = self.bucket(rpc) else {
            return Duration::ZERO;
        };
        let waited = bucket.acquire(1).await.waited();
        self.waits.record(rpc, waited);
        waited
    }

    /// Applies a changed config: the switch, and each type's rate (its bucket keeps its fill).
    /// A rejected config leaves everything as it was.
    pub fn reset_all(&self, config: HostLimitsConfig) -> Result<(), ConfigError> {
        config.validate_on(self.cores)?;
        let mut current = self.config.lock().unwrap_or_else(|p| p.into_inner());
        let buckets: Buckets<C> = self
            .buckets
            .load()
            .iter()
            .map(|(rpc, existing)| {
                let bucket = config
                    .bucket_config(rpc, self.cores)
                    .and_then(|c| match existing {
                        Some(bucket) => bucket.reconfigure(c).ok().map(|()| Arc::clone(bucket)),
                        None => TokenBucket::with_clock(c, self.clock.clone())
                            .ok()
                            .map(Arc::new),
                    });
                (rpc.clone(), bucket)
            })
            .collect();
        self.buckets.store(Arc::new(buckets));
        self.enabled.store(config.enabled, Ordering::Relaxed);
        *current = config;
        Ok(())
    }

    /// The limit for `rpc` in requests per second (`None`: no limit).
    pub fn limit(&self, rpc: &str) -> Option<f64> {
        self.bucket(rpc).map(|b| b.config().rate)
    }

    /// Waits recorded per RPC type.
    pub fn waits(&self) -> BTreeMap<String, (Duration, Vec<u64>)> {
        self.waits.snapshot()
    }
}

/// 21 meta-service RPC types for examples, as many as a real meta service has. Five names are
/// that service's load-related ones (`PREPARE_ROWSET`, `COMMIT_ROWSET`, `UPDATE_TMP_ROWSET`,
/// `UPDATE_PACKED_FILE_INFO`, `UPDATE_DELETE_BITMAP`); the other names are illustrative.
pub const EXAMPLE_META_SERVICE_RPCS: [&str; 21] = [
    "GET_TABLET_META",
    "GET_ROWSET",
    "PREPARE_ROWSET",
    "COMMIT_ROWSET",
    "UPDATE_TMP_ROWSET",
    "COMMIT_TXN",
    "ABORT_TXN",
    "PRECOMMIT_TXN",
    "PREPARE_TABLET_JOB",
    "START_TABLET_JOB",
    "FINISH_TABLET_JOB",
    "GET_DELETE_BITMAP",
    "UPDATE_DELETE_BITMAP",
    "GET_DELETE_BITMAP_UPDATE_LOCK",
    "REMOVE_DELETE_BITMAP_UPDATE_LOCK",
    "GET_INSTANCE",
    "GET_SCHEMA_DICT",
    "UPDATE_PACKED_FILE_INFO",
    "GET_TABLET_STATS",
    "UPDATE_TABLET_SCHEMA",
    "LIST_SNAPSHOT",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn limiter(config: HostLimitsConfig) -> (HostLimiter<ManualClock>, ManualClock) {
        let clock = ManualClock::new(0);
        let limiter =
            HostLimiter::new(config, &EXAMPLE_META_SERVICE_RPCS, 4, clock.clone()).unwrap();
        (limiter, clock)
    }

    /// A rate whose bucket could not be made used to leave its RPC type unlimited.
    #[test]
    fn a_rate_that_cannot_be_represented_on_these_cores_is_refused() {
        let config = |default_qps: f64, overrides: &[(&str, f64)]| HostLimitsConfig {
            enabled: true,
            default_qps,
            overrides: overrides
                .iter()
                .map(|&(rpc, qps)| (rpc.to_owned(), qps))
                .collect(),
        };
        let build = |c| HostLimiter::new(c, &EXAMPLE_META_SERVICE_RPCS, 4, ManualClock::new(0));
        let Err(tiny) = build(config(1e-12, &[])) else {
            panic!("a rate of 1e-12 per core is refused")
        };
        assert_eq!(tiny.field(), "default_qps");
        let Err(fast) = build(config(10.0, &[("COMMIT_TXN", 3e8)])) else {
            panic!("3e8 per core × 4 cores is above 10⁹ per second")
        };
        assert!(
            matches!(
                fast,
                ConfigError::TooFast {
                    field: "overrides",
                    ..
                }
            ),
            "{fast}"
        );
        let (limiter, _clock) = limiter(config(2.0, &[]));
        assert!(
            limiter
                .reset_all(config(2.0, &[("COMMIT_TXN", 1e-15)]))
                .is_err()
        );
        let admitted = (0..100)
            .filter(|_| limiter.try_acquire("COMMIT_TXN").is_ok())
            .count();
        assert_eq!(
            admitted, 8,
            "the rejected config left the running one in place"
        );
    }

    #[test]
    fn each_type_has_its_own_budget_per_core_with_overrides() {
        let (limiter, _clock) = limiter(HostLimitsConfig {
            enabled: true,
            default_qps: 2.0,
            overrides: [
                ("COMMIT_TXN".to_owned(), 1.0),
                ("GET_INSTANCE".to_owned(), 0.0),
                ("GET_ROWSET".to_owned(), -1.0),
            ]
            .into(),
        });
        let admitted = |rpc: &str| {
            (0..100)
                .filter(|_| limiter.try_acquire(rpc).is_ok())
                .count()
        };
        assert_eq!(
            admitted("PREPARE_ROWSET"),
            8,
            "2 per core × 4 cores, burst = qps"
        );
        assert_eq!(admitted("GET_ROWSET"), 8, "-1: the default");
        assert_eq!(admitted("COMMIT_TXN"), 4);
        assert_eq!(admitted("GET_INSTANCE"), 100, "0: no limit");
        assert_eq!(
            admitted("SOMETHING_NEW"),
            8,
            "unknown types get the default"
        );
        assert_eq!(limiter.limit("GET_INSTANCE"), None);
    }

    #[test]
    fn the_switch_and_reset_all_apply_live_keeping_fills() {
        let (limiter, clock) = limiter(HostLimitsConfig {
            default_qps: 1.0,
            ..Default::default()
        });
        for _ in 0..4 {
            limiter.try_acquire("PREPARE_ROWSET").unwrap();
        }
        assert!(limiter.try_acquire("PREPARE_ROWSET").is_err());
        limiter
            .reset_all(HostLimitsConfig {
                default_qps: 10.0,
                ..Default::default()
            })
            .unwrap();
        assert!(
            limiter.try_acquire("PREPARE_ROWSET").is_err(),
            "still empty"
        );
        clock.advance(Duration::from_millis(25));
        assert!(limiter.try_acquire("PREPARE_ROWSET").is_ok(), "40/s now");
        limiter
            .reset_all(HostLimitsConfig {
                enabled: false,
                ..Default::default()
            })
            .unwrap();
        assert!((0..1000).all(|_| limiter.try_acquire("PREPARE_ROWSET").is_ok()));
        assert!(
            limiter
                .reset_all(HostLimitsConfig {
                    default_qps: f64::INFINITY,
                    ..Default::default()
                })
                .is_err()
        );
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn waits_are_recorded_per_type_only_when_nonzero() {
        let limiter = HostLimiter::new(
            HostLimitsConfig {
                default_qps: 10.0,
                ..Default::default()
            },
            &[],
            1,
            crate::TokioClock::new(),
        )
        .unwrap();
        for _ in 0..10 {
            assert_eq!(limiter.acquire("COMMIT_TXN").await, Duration::ZERO);
        }
        assert_eq!(
            limiter.acquire("COMMIT_TXN").await,
            Duration::from_millis(100)
        );
        let waits = limiter.waits();
        assert_eq!(waits.len(), 1);
        assert_eq!(waits["COMMIT_TXN"].0, Duration::from_millis(100));
        assert_eq!(waits["COMMIT_TXN"].1.iter().sum::<u64>(), 1);
    }
}
