//! The named policies of a service, and admission by all that apply.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::{Admission, Policy, PolicyConfig, PolicyError, Rejection, Request};
use crate::clock::Clock;

/// The admissions of every policy that applied to a request. Dropping it finishes the request
/// everywhere (and releases every permit).
#[derive(Debug)]
#[must_use = "dropping the admissions finishes the request and releases its permits"]
pub struct Admissions<C: Clock + Clone = crate::clock::SystemClock> {
    taken: Vec<(Arc<Policy<C>>, Admission<C>)>,
}

impl<C: Clock + Clone> Admissions<C> {
    /// The policies that admitted the request, with their admissions, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Admission<C>)> {
        self.taken.iter().map(|(p, a)| (p.name(), a))
    }

    /// The longest any policy made the request wait.
    pub fn waited(&self) -> std::time::Duration {
        self.taken
            .iter()
            .map(|(_, a)| a.waited())
            .max()
            .unwrap_or_default()
    }

    /// Gives back everything the request took (it was refused elsewhere).
    pub fn rollback(self, request: &Request<'_>) {
        for (policy, admission) in self.taken {
            policy.rollback(request, admission);
        }
    }

    /// Adds `policy`'s decision: kept if the policy applied; a refusal gives back everything
    /// taken so far and is returned.
    fn and(
        mut self,
        policy: &Arc<Policy<C>>,
        decided: Result<Admission<C>, Rejection>,
        request: &Request<'_>,
    ) -> Result<Self, Rejection> {
        match decided {
            Ok(admission) if admission.applied() => {
                self.taken.push((Arc::clone(policy), admission));
                Ok(self)
            }
            Ok(_) => Ok(self),
            Err(rejection) => {
                self.rollback(request);
                Err(rejection)
            }
        }
    }
}

/// Why a set of policies was refused: every problem of every policy, duplicate names included.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySetError {
    /// The problems, each naming its policy and field.
    pub problems: Vec<PolicyError>,
}

impl std::fmt::Display for PolicySetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} problem(s) with the policies", self.problems.len())?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicySetError {}

/// A service's named policies. Reads take no lock; changes are swapped in whole.
pub struct PolicySet<C: Clock + Clone = crate::clock::SystemClock> {
    policies: ArcSwap<BTreeMap<String, Arc<Policy<C>>>>,
    clock: C,
    cores: usize,
    changing: Mutex<()>,
}

impl<C: Clock + Clone> std::fmt::Debug for PolicySet<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.policies.load().keys()).finish()
    }
}

impl<C: Clock + Clone> PolicySet<C> {
    /// A set of `configs`. Every config is checked, and all problems are reported at once
    /// (duplicate names too); nothing is built unless all are valid.
    pub fn new(configs: Vec<PolicyConfig>, clock: C) -> Result<Self, PolicySetError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PolicySet::with_cores(configs, clock, cores)
    }

    /// Like [`new`](Self::new), with `per_core` counting `cores` cores.
    pub fn with_cores(
        configs: Vec<PolicyConfig>,
        clock: C,
        cores: usize,
    ) -> Result<Self, PolicySetError> {
        let mut problems: Vec<PolicyError> = configs.iter().flat_map(|c| c.problems()).collect();
        let mut seen = BTreeMap::new();
        for config in &configs {
            if seen.insert(config.name.clone(), ()).is_some() {
                problems.push(PolicyError {
                    policy: config.name.clone(),
                    field: "name".to_owned(),
                    problem: "is used by more than one policy".to_owned(),
                });
            }
        }
        if !problems.is_empty() {
            return Err(PolicySetError { problems });
        }
        let mut policies = BTreeMap::new();
        for config in configs {
            let name = config.name.clone();
            let policy = Policy::with_cores(config, clock.clone(), cores)
                .map_err(|e| PolicySetError { problems: vec![e] })?;
            policies.insert(name, Arc::new(policy));
        }
        Ok(PolicySet {
            policies: ArcSwap::from_pointee(policies),
            clock,
            cores,
            changing: Mutex::new(()),
        })
    }

    /// The policy named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Policy<C>>> {
        self.policies.load().get(name).cloned()
    }

    /// Every policy, in name order.
    pub fn policies(&self) -> Vec<Arc<Policy<C>>> {
        self.policies.load().values().cloned().collect()
    }

    /// Creates the policy, or reconfigures it in place (keeping its buckets' state) if it
    /// exists. Returns true if it was created. A rejected config changes nothing.
    pub fn upsert(&self, config: PolicyConfig) -> Result<bool, PolicyError> {
        let _serialized = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = self.get(&config.name) {
            existing.reconfigure(config)?;
            return Ok(false);
        }
        let name = config.name.clone();
        let policy = Arc::new(Policy::with_cores(config, self.clock.clone(), self.cores)?);
        let mut policies = BTreeMap::clone(&self.policies.load());
        policies.insert(name, policy);
        self.policies.store(Arc::new(policies));
        Ok(true)
    }

    /// Removes a policy. Requests it admitted finish normally. Returns false if there was none.
    pub fn remove(&self, name: &str) -> bool {
        let _serialized = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let mut policies = BTreeMap::clone(&self.policies.load());
        let removed = policies.remove(name).is_some();
        if removed {
            self.policies.store(Arc::new(policies));
        }
        removed
    }

    /// Admits `request` by every policy that applies to its kind, without waiting. If one
    /// refuses, what the others took is given back and the refusal returned.
    pub fn try_acquire(&self, request: &Request<'_>) -> Result<Admissions<C>, Rejection> {
        let mut admissions = Admissions { taken: Vec::new() };
        for policy in self.policies.load().values() {
            admissions = admissions.and(policy, policy.try_acquire(request), request)?;
        }
        Ok(admissions)
    }

    /// Like [`try_acquire`](Self::try_acquire), but each policy waits as it is configured to.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, request: &Request<'_>) -> Result<Admissions<C>, Rejection> {
        let mut admissions = Admissions { taken: Vec::new() };
        let policies = self.policies.load_full();
        for policy in policies.values() {
            admissions = admissions.and(policy, policy.acquire(request).await, request)?;
        }
        Ok(admissions)
    }
}
