//! Answering `ShouldRateLimit`: every descriptor decided by its rule's policy, never waiting.
//!
//! Each descriptor of a request is looked up in the tree ([`super::rules`]); a rule counts
//! through its Weir policy (a `fixed_window` or a `token_bucket` keyed by the descriptor's
//! values), so its decisions show in `/v1/policies`, `/v1/throttles`, `weir top` and the policy
//! metrics like any other policy's. Beside them, each rule keeps the reference server's own
//! counters (total hits, over limit, near limit, within limit, shadow mode), computed the same
//! way, for dashboards built on them.
//!
//! A request is checked whole before anything is counted: a bad descriptor anywhere makes the
//! request an error and counts nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::limiter::Quota;
use weir::policy::{FixedWindowSpec, Scope, TokenBucketSpec};
use weir::policy::{
    KeyedSpec, Limiter, Mode, OnExhausted, Policy, PolicyConfig, PolicySet, Request,
};
use weir::{Clock, FixedWindowConfig, SystemClock};

use super::config::{Algorithm, Limit, RulesConfig, Unit};
use super::rules::{Lookup, Matched, Tree};

/// The longest counter key accepted (all of a descriptor's entries together), in bytes.
pub const MAX_DESCRIPTOR_BYTES: usize = 4096;
/// The most metric names a `detailed_metric` or `value_to_metric` rule keeps apart; hits of
/// further names count under the rule's path.
pub const MAX_METRIC_NAMES: usize = 1000;

/// How the service answers, from the config file's `[rls]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsSettings {
    /// Keys each rule tracks at once (its policy's `max_keys`).
    pub max_keys: usize,
    /// A hit that takes a key past this share of its limit counts as "near limit".
    pub near_limit_ratio: f64,
    /// Answer the RateLimit header fields (`RateLimit-Limit`, `-Remaining`, `-Reset`) for
    /// Envoy to add to the client's response.
    pub response_headers: bool,
    /// The most descriptors one call may carry.
    pub max_descriptors: usize,
}

impl Default for RlsSettings {
    fn default() -> Self {
        RlsSettings {
            max_keys: 100_000,
            near_limit_ratio: 0.8,
            response_headers: false,
            max_descriptors: 64,
        }
    }
}

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Its entries, in order.
    pub entries: Vec<(&'a str, &'a str)>,
    /// A limit sent instead of the configured one: hits per unit.
    pub limit: Option<(u32, Option<Unit>)>,
    /// Its own hits, overriding the request's (0: only look).
    pub hits: Option<u64>,
}

/// What a descriptor is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within its limit (or not limited).
    Ok,
    /// Over its limit.
    OverLimit,
}

/// The limit a descriptor was decided by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// Hits per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's limit's name, if it has one.
    pub name: Option<String>,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// OK or over.
    pub code: Code,
    /// The limit that decided, if one did.
    pub current_limit: Option<CurrentLimit>,
    /// Hits left before the key is over (`u32::MAX` for an unlimited rule).
    pub limit_remaining: u32,
    /// Whole seconds until the key is whole again, rounded up, if a limit decided.
    pub reset_after: Option<Duration>,
}

impl Status {
    fn unlimited(remaining: u32) -> Status {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: remaining,
            reset_after: None,
        }
    }
}

/// The answer to a whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Over if any descriptor is.
    pub overall: Code,
    /// One status per descriptor, in order.
    pub statuses: Vec<Status>,
    /// Header fields for the client's response, when `response_headers` is on.
    pub headers: Vec<(&'static str, String)>,
}

/// Why a request cannot be answered: it is malformed. Each names the descriptor and entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No domain.
    #[error("`domain` must not be empty")]
    NoDomain,
    /// No descriptors.
    #[error("`descriptors` must not be empty")]
    NoDescriptors,
    /// A descriptor without entries.
    #[error("descriptor {index} has no entries")]
    NoEntries {
        /// The descriptor's index.
        index: usize,
    },
    /// An entry without a key.
    #[error("descriptor {index}, entry {entry}: `key` must not be empty")]
    EmptyKey {
        /// The descriptor's index.
        index: usize,
        /// The entry's index.
        entry: usize,
    },
    /// A descriptor too long to be a key.
    #[error("descriptor {index} is {bytes} bytes long; the most is {MAX_DESCRIPTOR_BYTES}")]
    TooLong {
        /// The descriptor's index.
        index: usize,
        /// Its length.
        bytes: usize,
    },
    /// More hits than the limit can ever hold.
    #[error(
        "descriptor {index} adds {hits} hits, more than its limit of {limit} per {unit} can ever admit"
    )]
    HitsAboveLimit {
        /// The descriptor's index.
        index: usize,
        /// The hits asked for.
        hits: u64,
        /// The limit.
        limit: u32,
        /// The limit's unit.
        unit: &'static str,
    },
    /// More hits than any window can count.
    #[error(
        "descriptor {index} adds {hits} hits; one call may add at most 4294967295 (2^32 - 1), the most a window counts"
    )]
    HitsTooMany {
        /// The descriptor's index.
        index: usize,
        /// The hits asked for.
        hits: u64,
    },
    /// More descriptors than one call may carry.
    #[error("the call carries {count} descriptors; the most is {max} (`[rls] max_descriptors`)")]
    TooManyDescriptors {
        /// Descriptors in the call.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// A limit override with no unit.
    #[error("descriptor {index}: the `limit` override needs a unit (SECOND to YEAR)")]
    OverrideUnit {
        /// The descriptor's index.
        index: usize,
    },
}

/// The reference server's counters of one rule (or of one metric name of it).
#[derive(Debug, Default)]
pub struct Counts {
    /// Hits asked for.
    pub total_hits: AtomicU64,
    /// Hits past the limit.
    pub over_limit: AtomicU64,
    /// Hits between the near-limit mark and the limit.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Hits past the limit that shadow mode let through.
    pub shadow_mode: AtomicU64,
}

impl Counts {
    /// A snapshot: total, over, near, within, shadow.
    pub fn read(&self) -> [u64; 5] {
        [
            self.total_hits.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed),
            self.near_limit.load(Ordering::Relaxed),
            self.within_limit.load(Ordering::Relaxed),
            self.shadow_mode.load(Ordering::Relaxed),
        ]
    }

    /// Counts `hits` that took the key from `before` to `after` against `limit` (the
    /// reference server's arithmetic, partial crossings split).
    fn record(&self, hits: u64, after: u64, limit: u64, near: u64, shadow: bool) {
        let before = after.saturating_sub(hits);
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        if after > limit {
            let over = if before >= limit { hits } else { after - limit };
            self.over_limit.fetch_add(over, Ordering::Relaxed);
            if before < limit {
                self.near_limit
                    .fetch_add(limit - before.max(near), Ordering::Relaxed);
            }
            if shadow {
                self.shadow_mode.fetch_add(over, Ordering::Relaxed);
            }
        } else {
            self.within_limit.fetch_add(hits, Ordering::Relaxed);
            if after > near {
                self.near_limit
                    .fetch_add(after - before.max(near), Ordering::Relaxed);
            }
        }
    }
}

/// A rule's counters: under its path, and under the names its metrics ask for.
#[derive(Debug, Default)]
pub struct RuleCounts {
    /// Under the rule's path.
    pub rule: Counts,
    /// Under request-dependent names (`detailed_metric`, `value_to_metric`), at most
    /// [`MAX_METRIC_NAMES`].
    pub named: Mutex<HashMap<String, Arc<Counts>>>,
}

impl RuleCounts {
    fn of(&self, metric: &str) -> Option<Arc<Counts>> {
        let mut named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(counts) = named.get(metric) {
            return Some(Arc::clone(counts));
        }
        if named.len() >= MAX_METRIC_NAMES {
            return None;
        }
        let counts = Arc::new(Counts::default());
        named.insert(metric.to_owned(), Arc::clone(&counts));
        Some(counts)
    }
}

/// A rule with what counts for it.
#[derive(Debug)]
struct Bound<C: Clock + Clone> {
    /// The policy counting its hits; `None` for an unlimited rule or a limit of 0.
    policy: Option<Arc<Policy<C>>>,
    counts: RuleCounts,
}

/// Per domain: a hit counter per unit for the descriptors that bring their own limit.
struct Overrides<C: Clock> {
    /// Indexed by [`Unit`] in declaration order.
    by_unit: [OnceLock<KeyedLimiter<C>>; 7],
    counts: Counts,
}

impl<C: Clock> std::fmt::Debug for Overrides<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides").finish_non_exhaustive()
    }
}

/// Envoy's rate limit service over Weir policies; see the [module docs](self).
#[derive(Debug)]
pub struct Rls<C: Clock + Clone = SystemClock> {
    tree: Tree,
    bound: Vec<Bound<C>>,
    overrides: HashMap<String, Overrides<C>>,
    settings: RlsSettings,
    clock: C,
}

/// The policy that counts for a rule with a rate, or `None` (unlimited, or a limit of 0).
/// In cluster mode (`scope` cluster) each of its buckets is decided by its owner on the ring.
pub fn policy_of(
    rule: &super::rules::Rule,
    settings: &RlsSettings,
    scope: Scope,
) -> Option<PolicyConfig> {
    let Limit::Rate {
        requests_per_unit,
        unit,
        algorithm,
        ..
    } = &rule.limit
    else {
        return None;
    };
    if *requests_per_unit == 0 {
        return None;
    }
    let spec = match algorithm {
        Algorithm::FixedWindow => KeyedSpec::FixedWindow(FixedWindowSpec {
            limit: u64::from(*requests_per_unit),
            window: unit.window(),
            per_core: false,
            overrides: Default::default(),
        }),
        Algorithm::TokenBucket => KeyedSpec::TokenBucket(TokenBucketSpec {
            rate: f64::from(*requests_per_unit) / unit.window().as_secs_f64(),
            burst: Some(u64::from(*requests_per_unit)),
            per_core: false,
            overrides: Default::default(),
        }),
    };
    Some(PolicyConfig {
        name: rule.policy_name(),
        kinds: Vec::new(),
        mode: if rule.shadow_mode {
            Mode::Monitor
        } else {
            Mode::Enforce
        },
        on_exhausted: OnExhausted::Reject,
        max_wait: Duration::ZERO,
        max_keys: settings.max_keys,
        // Keys past the cap with none idle are counted in the sketch: never looser than a
        // bucket of their own, and one client filling the map does not lock out the rest.
        overflow: Overflow::Sketch,
        max_cost: None,
        scope,
        learning_period: Duration::ZERO,
        limiter: Limiter::Keyed(spec),
    })
}

/// The policies `config`'s rules count through, at `scope`.
pub fn policies_of(
    config: &RulesConfig,
    settings: &RlsSettings,
    scope: Scope,
) -> Vec<PolicyConfig> {
    Tree::new(config)
        .rules()
        .iter()
        .filter_map(|rule| policy_of(rule, settings, scope))
        .collect()
}

/// A request checked and matched, nothing counted yet ([`Rls::prepare`]).
#[derive(Debug)]
pub struct Prepared {
    domain: String,
    /// One per descriptor: what limits it, and its hits.
    steps: Vec<(Plan, u64)>,
}

/// How one rule decision went, wherever it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// Over the limit (in shadow mode too: the answer is OK, the counters say so).
    pub over: bool,
    /// What the key has spent and left just after (`None`: not known).
    pub quota: Option<Quota>,
}

/// What was found for one descriptor, before anything is counted.
#[derive(Debug)]
enum Plan {
    /// Nothing limits it.
    Free,
    /// An unlimited rule.
    Unlimited,
    /// A rule with a rate.
    Rule(Matched),
    /// A limit sent with the request.
    Override {
        per_unit: u32,
        unit: Unit,
        key: String,
    },
}

impl<C: Clock + Clone> Rls<C> {
    /// The service for `config`'s rules, counting through `policies` (which must hold
    /// [`policies_of`]`(config)`), reading `clock`.
    pub fn new(
        config: &RulesConfig,
        settings: RlsSettings,
        policies: &PolicySet<C>,
        clock: C,
    ) -> Self {
        let tree = Tree::new(config);
        let bound = tree
            .rules()
            .iter()
            .map(|rule| Bound {
                policy: policies.get(&rule.policy_name()),
                counts: RuleCounts::default(),
            })
            .collect();
        let overrides = config
            .domains
            .iter()
            .map(|d| {
                (
                    d.domain.clone(),
                    Overrides {
                        by_unit: Default::default(),
                        counts: Counts::default(),
                    },
                )
            })
            .collect();
        Rls {
            tree,
            bound,
            overrides,
            settings,
            clock,
        }
    }

    /// The rules, with their counters, for metrics: (domain, rule path, counters).
    pub fn counts(&self) -> impl Iterator<Item = (&str, &str, &RuleCounts)> {
        self.tree
            .rules()
            .iter()
            .zip(&self.bound)
            .map(|(rule, bound)| (rule.domain.as_str(), rule.path.as_str(), &bound.counts))
    }

    /// The counters of limits sent with requests, per domain.
    pub fn override_counts(&self) -> impl Iterator<Item = (&str, &Counts)> {
        self.overrides
            .iter()
            .map(|(domain, o)| (domain.as_str(), &o.counts))
    }

    /// How many rules are loaded.
    pub fn rule_count(&self) -> usize {
        self.bound.len()
    }

    /// Decides `descriptors` in `domain`, each for its own hits or else `hits_addend` (0 = 1),
    /// every rule on this node. (In cluster mode the front door asks [`Rls::prepare`], has the
    /// owners of other nodes' buckets decide, and [`Rls::finish`] counts the rest here.)
    pub fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Result<Answer, RequestError> {
        let prepared = self.prepare(domain, descriptors, hits_addend)?;
        Ok(self.finish(prepared, Vec::new()))
    }

    /// Checks a whole request and finds each descriptor's rule (applying `replaces`), counting
    /// nothing: a bad request is refused before anything is counted.
    pub fn prepare(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Result<Prepared, RequestError> {
        if domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        // Checked before any descriptor is looked at: one call cannot make the node walk (or
        // create keys for) an unbounded list.
        if descriptors.len() > self.settings.max_descriptors {
            return Err(RequestError::TooManyDescriptors {
                count: descriptors.len(),
                max: self.settings.max_descriptors,
            });
        }
        let request_hits = u64::from(hits_addend.max(1));
        let known = self.tree.has_domain(domain);
        let mut plans = Vec::with_capacity(descriptors.len());
        for (index, descriptor) in descriptors.iter().enumerate() {
            plans.push(self.plan(domain, known, index, descriptor, request_hits)?);
        }
        let replaced: BTreeSet<&str> = plans
            .iter()
            .filter_map(|(plan, _)| match plan {
                Plan::Rule(m) => Some(self.tree.rules()[m.rule].limit.replaces()),
                _ => None,
            })
            .flatten()
            .map(String::as_str)
            .collect();
        let steps = plans
            .into_iter()
            .map(|(plan, hits)| match plan {
                Plan::Rule(matched)
                    if self.tree.rules()[matched.rule]
                        .limit
                        .name()
                        .is_some_and(|n| replaced.contains(n)) =>
                {
                    (Plan::Free, hits)
                }
                other => (other, hits),
            })
            .collect();
        Ok(Prepared {
            domain: domain.to_owned(),
            steps,
        })
    }

    /// The rule decisions of `prepared` that a bucket's owner could make: (step, policy, key,
    /// hits) for every descriptor counted by a rule's policy.
    pub fn rule_decisions(&self, prepared: &Prepared) -> Vec<(usize, String, String, u64)> {
        prepared
            .steps
            .iter()
            .enumerate()
            .filter_map(|(step, (plan, hits))| match plan {
                Plan::Rule(matched) if self.bound[matched.rule].policy.is_some() => Some((
                    step,
                    self.tree.rules()[matched.rule].policy_name(),
                    matched.key.clone(),
                    *hits,
                )),
                _ => None,
            })
            .collect()
    }

    /// Counts `prepared`: the steps in `decided_elsewhere` (by step) as their owners decided
    /// them, every other one here; then the answer.
    pub fn finish(&self, prepared: Prepared, decided_elsewhere: Vec<(usize, Counted)>) -> Answer {
        let mut elsewhere: HashMap<usize, Counted> = decided_elsewhere.into_iter().collect();
        let statuses: Vec<Status> = prepared
            .steps
            .into_iter()
            .enumerate()
            .map(|(step, (plan, hits))| match plan {
                Plan::Free => Status::unlimited(0),
                Plan::Unlimited => Status::unlimited(u32::MAX),
                Plan::Rule(matched) => {
                    let counted = elsewhere
                        .remove(&step)
                        .unwrap_or_else(|| self.count_here(&matched, hits));
                    self.account(&matched, hits, counted)
                }
                Plan::Override {
                    per_unit,
                    unit,
                    key,
                } => self.count_override(&prepared.domain, per_unit, unit, &key, hits),
            })
            .collect();
        let overall = if statuses.iter().any(|s| s.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let headers = if self.settings.response_headers {
            header_fields(&statuses)
        } else {
            Vec::new()
        };
        Answer {
            overall,
            statuses,
            headers,
        }
    }

    fn plan(
        &self,
        domain: &str,
        known: bool,
        index: usize,
        descriptor: &Descriptor<'_>,
        request_hits: u64,
    ) -> Result<(Plan, u64), RequestError> {
        if descriptor.entries.is_empty() {
            return Err(RequestError::NoEntries { index });
        }
        if let Some(entry) = descriptor.entries.iter().position(|(k, _)| k.is_empty()) {
            return Err(RequestError::EmptyKey { index, entry });
        }
        let bytes: usize = descriptor
            .entries
            .iter()
            .map(|(k, v)| k.len() + v.len() + 3)
            .sum();
        if bytes > MAX_DESCRIPTOR_BYTES {
            return Err(RequestError::TooLong { index, bytes });
        }
        // A window counts at most 2³² − 1 hits: more in one call is refused below whatever
        // the limit (and the counters, which sum hits, cannot wrap).
        let hits = descriptor.hits.unwrap_or(request_hits);
        if hits > u64::from(u32::MAX) {
            return Err(RequestError::HitsTooMany { index, hits });
        }
        let too_many = |limit: u32, unit: Unit| {
            (limit > 0 && hits > u64::from(limit)).then_some(RequestError::HitsAboveLimit {
                index,
                hits,
                limit,
                unit: unit.name(),
            })
        };
        if !known {
            return Ok((Plan::Free, hits));
        }
        if let Some((per_unit, unit)) = descriptor.limit {
            let unit = unit.ok_or(RequestError::OverrideUnit { index })?;
            if let Some(error) = too_many(per_unit, unit) {
                return Err(error);
            }
            let key = match self.tree.find(domain, descriptor.entries.iter().copied()) {
                Lookup::Rule(matched) => matched.key,
                _ => super::rules::counter_key(descriptor.entries.iter().copied()),
            };
            return Ok((
                Plan::Override {
                    per_unit,
                    unit,
                    key,
                },
                hits,
            ));
        }
        let plan = match self.tree.find(domain, descriptor.entries.iter().copied()) {
            Lookup::UnknownDomain | Lookup::NoRule => Plan::Free,
            Lookup::Rule(matched) => match &self.tree.rules()[matched.rule].limit {
                Limit::Unlimited { .. } => Plan::Unlimited,
                Limit::Rate {
                    requests_per_unit,
                    unit,
                    ..
                } => {
                    if let Some(error) = too_many(*requests_per_unit, *unit) {
                        return Err(error);
                    }
                    Plan::Rule(matched)
                }
            },
        };
        Ok((plan, hits))
    }

    /// Decides `hits` for a matched rule with a rate on this node's own policy.
    fn count_here(&self, matched: &Matched, hits: u64) -> Counted {
        let rule = &self.tree.rules()[matched.rule];
        let Limit::Rate {
            requests_per_unit,
            unit,
            ..
        } = &rule.limit
        else {
            return Counted {
                over: false,
                quota: None,
            };
        };
        match &self.bound[matched.rule].policy {
            Some(policy) => {
                let (decided, quota) =
                    policy.try_acquire_with_quota(&Request::new(&matched.key).cost(hits));
                Counted {
                    over: match &decided {
                        Ok(admission) => admission.would_throttle(),
                        Err(_) => true,
                    },
                    quota,
                }
            }
            // A limit of 0: every hit is over, none is counted.
            None => Counted {
                over: hits > 0,
                quota: Some(Quota {
                    used: hits,
                    remaining: u64::from(*requests_per_unit),
                    reset_after: self.window_left(*unit),
                }),
            },
        }
    }

    /// The status of a rule's descriptor as decided (here or by its owner), and the rule's
    /// counters.
    fn account(&self, matched: &Matched, hits: u64, counted: Counted) -> Status {
        let rule = &self.tree.rules()[matched.rule];
        let bound = &self.bound[matched.rule];
        let Limit::Rate {
            requests_per_unit,
            unit,
            name,
            algorithm,
            ..
        } = &rule.limit
        else {
            return Status::unlimited(u32::MAX);
        };
        let limit = u64::from(*requests_per_unit);
        let current_limit = Some(CurrentLimit {
            requests_per_unit: *requests_per_unit,
            unit: *unit,
            name: name.clone(),
        });
        let over = counted.over;
        let Quota {
            used,
            remaining,
            reset_after,
        } = counted.quota.unwrap_or(Quota {
            used: 0,
            remaining: limit,
            reset_after: unit.window(),
        });
        let near = (limit as f64 * self.settings.near_limit_ratio).floor() as u64;
        // A window counts refused hits itself; a bucket does not take them, so they are
        // counted as landing on top of what it holds.
        let after = match algorithm {
            Algorithm::TokenBucket if over => used.saturating_add(hits),
            _ => used,
        };
        // Under the name the rule asks for instead of its path, as the reference server names
        // its stats: one series per hit, never two (a name equal to the path is the path).
        let named = matched
            .metric
            .as_deref()
            .filter(|name| *name != rule.path)
            .and_then(|name| bound.counts.of(name));
        match named {
            Some(counts) => counts.record(hits, after, limit, near, rule.shadow_mode),
            None => bound
                .counts
                .rule
                .record(hits, after, limit, near, rule.shadow_mode),
        }
        let code = if over && !rule.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Status {
            code,
            current_limit,
            limit_remaining: if over {
                0
            } else {
                u32::try_from(remaining).unwrap_or(u32::MAX)
            },
            reset_after: Some(whole_seconds(reset_after)),
        }
    }

    /// Counts `hits` against a limit sent with the request.
    fn count_override(
        &self,
        domain: &str,
        per_unit: u32,
        unit: Unit,
        key: &str,
        hits: u64,
    ) -> Status {
        let Some(overrides) = self.overrides.get(domain) else {
            return Status::unlimited(0);
        };
        let counter = overrides.by_unit[unit as usize].get_or_init(|| {
            let shape = Shape::try_from(FixedWindowConfig {
                limit: u64::from(u32::MAX),
                window: unit.window(),
            })
            .expect("a whole unit is a valid window");
            KeyedLimiter::new(
                shape,
                self.settings.max_keys,
                Overflow::Shared,
                self.clock.clone(),
            )
        });
        // The counter never refuses (its limit is the most a window counts); the override's
        // limit is compared here.
        // The quota read with the decision: past the key cap it is the shared overflow cell's.
        let (_counted, quota) = counter.try_acquire_with_quota(key, hits);
        let quota = quota.unwrap_or(Quota {
            used: hits,
            remaining: 0,
            reset_after: unit.window(),
        });
        let limit = u64::from(per_unit);
        let over = quota.used > limit || (limit == 0 && hits > 0);
        let near = (limit as f64 * self.settings.near_limit_ratio).floor() as u64;
        overrides
            .counts
            .record(hits, quota.used, limit, near, false);
        Status {
            code: if over { Code::OverLimit } else { Code::Ok },
            current_limit: Some(CurrentLimit {
                requests_per_unit: per_unit,
                unit,
                name: None,
            }),
            limit_remaining: u32::try_from(limit.saturating_sub(quota.used)).unwrap_or(u32::MAX),
            reset_after: Some(whole_seconds(quota.reset_after)),
        }
    }

    /// How long until the current window of `unit` ends.
    fn window_left(&self, unit: Unit) -> Duration {
        let window = unit.window().as_nanos() as u64;
        let unix = self.clock.now().wrapping_add(self.clock.unix_offset());
        Duration::from_nanos(window - unix % window)
    }
}

/// `duration` rounded up to whole seconds, as the reference server answers (a window's end is
/// never reported early).
fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds)
}

/// The RateLimit header fields for the status that matters most: the last over-limit one, or
/// else the one with the fewest hits left (the first of equals). None if no limit decided.
fn header_fields(statuses: &[Status]) -> Vec<(&'static str, String)> {
    let limited = statuses.iter().filter(|s| s.current_limit.is_some());
    let chosen = limited
        .clone()
        .rfind(|s| s.code == Code::OverLimit)
        .or_else(|| limited.min_by_key(|s| s.limit_remaining));
    let Some(status) = chosen else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    vec![
        ("RateLimit-Limit", limit.to_string()),
        ("RateLimit-Remaining", status.limit_remaining.to_string()),
        (
            "RateLimit-Reset",
            status.reset_after.unwrap_or_default().as_secs().to_string(),
        ),
    ]
}
