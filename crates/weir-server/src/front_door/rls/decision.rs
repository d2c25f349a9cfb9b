//! Answering `ShouldRateLimit`: every descriptor decided by its rule's policy, never waiting.
//!
//! Each descriptor of a request is looked up in the tree ([`crate::front_door::rls::rules`]); a rule counts
//! through its Weir policy (a `fixed_window` or a `token_bucket` keyed by the descriptor's
//! values), so its decisions show in `/v1/policies`, `/v1/throttles`, `weir top` and the policy
//! metrics like any other policy's. Beside them, each rule keeps the reference server's own
//! counters (total hits, over limit, near limit, within limit, shadow mode), computed the same
//! way, for dashboards built on them.
//!
//! A request is checked whole before anything is counted: a bad descriptor anywhere makes the
//! request an error and counts nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use weir::limiter::Quota;
use weir::policy::{Policy, PolicySet, Request};
use weir::{Clock, SystemClock};

use super::answer::{
    Answer, Code, CurrentLimit, Descriptor, MAX_DESCRIPTOR_BYTES, RequestError, Status,
    whole_seconds,
};
use super::config::{Limit, RulesConfig, Unit};
use super::counts::{Counts, RuleCounts};
use super::rules::{self, Lookup, Matched, Tree};
use super::sent::{Overrides, Sent, shares_window};
use super::settings::RlsSettings;

/// A rule with what counts for it.
#[derive(Debug)]
pub(super) struct Bound<C: Clock + Clone> {
    /// The policy counting its hits; `None` for an unlimited rule or a limit of 0.
    pub(super) policy: Option<Arc<Policy<C>>>,
    /// Shared with the service the rules reload into while the rule stays.
    counts: Arc<RuleCounts>,
}

/// Envoy's rate limit service over Weir policies; see the module docs.
#[derive(Debug)]
pub struct Rls<C: Clock + Clone = SystemClock> {
    pub(super) tree: Tree,
    pub(super) bound: Vec<Bound<C>>,
    /// Shared with the service the rules reload into while the domain stays.
    pub(super) overrides: HashMap<String, Overrides<C>>,
    pub(super) settings: RlsSettings,
    pub(super) clock: C,
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
    /// An unlimited rule (its index, for the limits it replaces).
    Unlimited(usize),
    /// A rule with a rate.
    Rule(Matched),
    /// A limit sent with the request.
    Override {
        per_unit: u32,
        unit: Unit,
        key: String,
        /// The matched rule whose counter it shares (its window, of the same unit).
        shared: Option<usize>,
    },
}

impl Plan {
    /// The limit sent, for a plan of one.
    fn sent(&self, hits: u64) -> Option<Sent<'_>> {
        match self {
            Plan::Override {
                per_unit,
                unit,
                key,
                shared,
            } => Some(Sent {
                per_unit: *per_unit,
                unit: *unit,
                key,
                hits,
                shared: *shared,
            }),
            _ => None,
        }
    }
}

impl<C: Clock + Clone> Rls<C> {
    /// The service for `config`'s rules, counting through `policies` (which must hold
    /// `policies_of(config)`), reading `clock`.
    pub fn new(
        config: &RulesConfig,
        settings: RlsSettings,
        policies: &PolicySet<C>,
        clock: C,
    ) -> Self {
        Rls::succeeding(None, config, settings, policies, clock)
    }

    /// The service for `config`'s rules as they reload over this one's: each rule that stays
    /// (by domain and path) keeps its counters, each domain that stays its counters of sent
    /// limits. `policies` must hold `policies_of(config)`.
    pub fn reloaded(&self, config: &RulesConfig, policies: &PolicySet<C>) -> Self {
        Rls::succeeding(
            Some(self),
            config,
            self.settings.clone(),
            policies,
            self.clock.clone(),
        )
    }

    /// The settings it answers with.
    pub fn settings(&self) -> &RlsSettings {
        &self.settings
    }

    fn succeeding(
        before: Option<&Rls<C>>,
        config: &RulesConfig,
        settings: RlsSettings,
        policies: &PolicySet<C>,
        clock: C,
    ) -> Self {
        let tree = Tree::new(config);
        let counts_before: HashMap<(&str, &str), &Arc<RuleCounts>> = before
            .map(|before| {
                before
                    .tree
                    .rules()
                    .iter()
                    .zip(&before.bound)
                    .map(|(rule, bound)| {
                        ((rule.domain.as_str(), rule.path.as_str()), &bound.counts)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let bound = tree
            .rules()
            .iter()
            .map(|rule| Bound {
                policy: policies.get(&rule.policy_name()),
                counts: counts_before
                    .get(&(rule.domain.as_str(), rule.path.as_str()))
                    .map_or_else(Default::default, |counts| Arc::clone(counts)),
            })
            .collect();
        let overrides = config
            .domains
            .iter()
            .map(|d| {
                let kept = before.and_then(|before| before.overrides.get(&d.domain));
                let counts = kept.map_or_else(Default::default, |kept| Arc::clone(&kept.counts));
                let overrides = Overrides::bound(&d.domain, policies, counts);
                (d.domain.clone(), overrides)
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
            .map(|(rule, bound)| (rule.domain.as_str(), rule.path.as_str(), &*bound.counts))
    }

    /// The counters of limits sent with requests, per domain.
    pub fn override_counts(&self) -> impl Iterator<Item = (&str, &Counts)> {
        self.overrides
            .iter()
            .map(|(domain, o)| (domain.as_str(), &*o.counts))
    }

    /// How many rules are loaded.
    pub fn rule_count(&self) -> usize {
        self.bound.len()
    }

    /// Decides `descriptors` in `domain`, each for its own hits or else `hits_addend` (0 = 1),
    /// every rule on its own policy here, with no node around it: what the reference server's
    /// test cases run against. A node answers through `LiveRules`, which has every rule's
    /// bucket decided wherever it lives ([`Rls::prepare`], `Decider::decide` per rule, then
    /// [`Rls::finish`]).
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
                // An unlimited rule's `replaces` drops the named limits too, as in the
                // reference server.
                Plan::Rule(Matched { rule, .. }) | Plan::Unlimited(rule) => {
                    Some(self.tree.rules()[*rule].limit.replaces())
                }
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

    /// The decisions of `prepared`: (step, policy, key, hits) for every descriptor counted by
    /// a policy — its rule's, or for a limit sent with it the counter its hits count in — for
    /// the caller to decide wherever each bucket lives.
    pub fn rule_decisions<'a>(
        &'a self,
        prepared: &'a Prepared,
    ) -> impl Iterator<Item = (usize, &'a Policy<C>, &'a str, u64)> + 'a {
        prepared
            .steps
            .iter()
            .enumerate()
            .filter_map(|(step, (plan, hits))| match plan {
                Plan::Rule(matched) => {
                    let policy = self.bound[matched.rule].policy.as_deref()?;
                    Some((step, policy, matched.key.as_str(), *hits))
                }
                Plan::Override { .. } => {
                    let sent = plan.sent(*hits)?;
                    let policy = self.sent_counter(&prepared.domain, &sent)?;
                    Some((step, policy, sent.key, *hits))
                }
                _ => None,
            })
    }

    /// Counts `prepared`: the steps in `decided` (by step, in order) as they were decided
    /// wherever their buckets live, every other one here; then the answer.
    pub fn finish(&self, prepared: Prepared, decided: Vec<(usize, Counted)>) -> Answer {
        let mut decided = decided.into_iter().peekable();
        let all_quota = self.settings.quota_mode;
        let mut statuses = Vec::with_capacity(prepared.steps.len());
        // The reference server's rule: over if a descriptor not in quota mode is over, or if
        // every descriptor in quota mode is. An unlimited rule's takes no part.
        let (mut over, mut in_quota, mut quota_over) = (false, 0, 0);
        for (step, (plan, hits)) in prepared.steps.into_iter().enumerate() {
            let (mut status, quota_mode) = match plan {
                Plan::Free => (Status::unlimited(0), all_quota),
                Plan::Unlimited(_) => {
                    statuses.push(Status::unlimited(u32::MAX));
                    continue;
                }
                Plan::Rule(matched) => {
                    let counted = match decided.next_if(|(at, _)| *at == step) {
                        Some((_, counted)) => counted,
                        None => self.count_here(&matched, hits),
                    };
                    let quota_mode = all_quota || self.tree.rules()[matched.rule].quota_mode;
                    (self.account(&matched, hits, counted), quota_mode)
                }
                Plan::Override { .. } => {
                    let counted = decided
                        .next_if(|(at, _)| *at == step)
                        .map(|(_, counted)| counted.quota);
                    let sent = plan.sent(hits).expect("a sent limit's plan");
                    let counter = self.sent_counter(&prepared.domain, &sent);
                    let status = self.overrides.get(&prepared.domain).map_or_else(
                        || Status::unlimited(0),
                        |overrides| overrides.status(sent, counted, counter, &self.settings),
                    );
                    (status, all_quota)
                }
            };
            let is_over = status.code == Code::OverLimit;
            if quota_mode {
                in_quota += 1;
                quota_over += usize::from(is_over);
            } else {
                over |= is_over;
            }
            status.quota_mode = quota_mode;
            statuses.push(status);
        }
        let overall = if over || (in_quota > 0 && quota_over == in_quota) {
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
        // No rule has an empty key, nor matches no entries: such a descriptor is OK with no
        // limit, as the reference server answers it (it checks neither).
        if descriptor.entries.is_empty() || descriptor.entries.iter().any(|(k, _)| k.is_empty()) {
            return Ok((Plan::Free, descriptor.hits.unwrap_or(request_hits)));
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
        if !known {
            return Ok((Plan::Free, hits));
        }
        if let Some((per_unit, unit)) = descriptor.limit {
            let unit = unit.ok_or(RequestError::OverrideUnit { index })?;
            let (key, shared) = match self.tree.find(domain, descriptor.entries.iter().copied()) {
                Lookup::Rule(matched) => {
                    let shared = self.shares_counter(matched.rule, unit);
                    (matched.key, shared.then_some(matched.rule))
                }
                _ => (rules::counter_key(descriptor.entries.iter().copied()), None),
            };
            return Ok((
                Plan::Override {
                    per_unit,
                    unit,
                    key,
                    shared,
                },
                hits,
            ));
        }
        let plan = match self.tree.find(domain, descriptor.entries.iter().copied()) {
            Lookup::UnknownDomain | Lookup::NoRule => Plan::Free,
            Lookup::Rule(matched) => match &self.tree.rules()[matched.rule].limit {
                Limit::Unlimited { .. } => Plan::Unlimited(matched.rule),
                // More hits than the limit are counted and over it, as the reference server
                // counts them (a fixed window counts them; a bucket refuses them whole).
                Limit::Rate { .. } => Plan::Rule(matched),
            },
        };
        Ok((plan, hits))
    }

    /// Whether a limit of `unit` sent for rule `rule`'s descriptors counts in its window.
    fn shares_counter(&self, rule: usize, unit: Unit) -> bool {
        shares_window(&self.tree.rules()[rule].limit, unit) && self.bound[rule].policy.is_some()
    }

    /// The policy whose window counts `sent`'s hits in `domain`: its rule's, or the domain's
    /// counter of its unit.
    fn sent_counter(&self, domain: &str, sent: &Sent<'_>) -> Option<&Policy<C>> {
        match sent.shared {
            Some(rule) => self.bound[rule].policy.as_deref(),
            None => self.overrides.get(domain)?.counter(sent.unit),
        }
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
        // A fixed window counts refused hits itself; other limiters do not take them, so they
        // are counted as landing on top of what they hold.
        let after = if over && !algorithm.counts_refused() {
            used.saturating_add(hits)
        } else {
            used
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
            quota_mode: false,
        }
    }

    /// How long until the current window of `unit` ends.
    fn window_left(&self, unit: Unit) -> Duration {
        let window = unit.window().as_nanos() as u64;
        let unix = self.clock.now().wrapping_add(self.clock.unix_offset());
        Duration::from_nanos(window - unix % window)
    }
}

/// The RateLimit header fields for the status that matters most: the last over-limit one not
/// in quota mode, or else the one with the fewest hits left (the first of equals). None if no
/// limit decided.
fn header_fields(statuses: &[Status]) -> Vec<(&'static str, String)> {
    let limited = statuses.iter().filter(|s| s.current_limit.is_some());
    let chosen = limited
        .clone()
        .rfind(|s| s.code == Code::OverLimit && !s.quota_mode)
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
