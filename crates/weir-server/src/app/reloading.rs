//! Reloads: the running policies brought to what a source read again wants — the config file's
//! `[[policy]]` tables, or another source's (Envoy's rate limit rules) — the difference only.
//!
//! Each source owns its policies: the config file (with the data dir's overlay) the ones it
//! names, the rules the `rls:` ones. A reload of one checks what it wants together with the
//! others' running policies, as a start would, and changes nothing if any of it is not valid;
//! then it reshapes what changed (buckets kept, as a `PUT` does), starts what is new, and
//! removes what is gone. What did not change is not touched: its waiters, leases and buckets
//! go on. Reloads and API changes are serialised by the overlay's lock.

use std::collections::{BTreeMap, BTreeSet};

use weir::policy::{PolicyConfig, PolicySet, PolicySetError};

use super::PolicyAdmin;
use crate::reserved::is_rule_policy;

/// What a reload changed, by policy name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Policies that started.
    pub created: Vec<String>,
    /// Policies reshaped, their buckets' state kept.
    pub changed: Vec<String>,
    /// Policies removed.
    pub removed: Vec<String>,
    /// Policies that could not be applied, each with why (the running one kept).
    pub failed: Vec<String>,
}

impl Reloaded {
    /// Whether the reload changed nothing.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.changed.is_empty()
            && self.removed.is_empty()
            && self.failed.is_empty()
    }
}

impl PolicyAdmin {
    /// Re-applies the config file's policies, `file` as just read: the data dir's overlay is
    /// laid over them as at start, and only the difference is applied (module docs). The RLS
    /// rules' policies are their YAML's and stay as they are.
    pub async fn reload_policies(
        &self,
        file: Vec<PolicyConfig>,
    ) -> Result<Reloaded, PolicySetError> {
        let overlay = self.overlay.lock().await;
        *self
            .file_policies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = file.clone();
        let wanted = overlay.apply(file);
        let reloaded = self.converge(wanted, |name| !is_rule_policy(name), || {})?;
        let shadowed = self.shadowed();
        if !shadowed.is_empty() {
            tracing::warn!(
                ?shadowed,
                "the config file's policies named were replaced or deleted over the API: the file's versions do not apply until reverted (`weir config revert NAME`, `DELETE /v1/policies/NAME/override`)"
            );
        }
        Ok(reloaded)
    }

    /// Whether a config file with no policies at all would remove a running policy: one the
    /// file defined (what the API made or changed stays, as the RLS rules' do).
    pub async fn an_empty_file_would_remove_policies(&self) -> bool {
        let kept: BTreeSet<String> = self
            .overlay
            .lock()
            .await
            .apply(Vec::new())
            .into_iter()
            .map(|config| config.name)
            .collect();
        self.policies
            .policies()
            .iter()
            .any(|policy| !is_rule_policy(policy.name()) && !kept.contains(policy.name()))
    }

    /// Brings the policies of a source other than the config file (the RLS rules, which
    /// `owned` picks by name) to `wanted`, serialised with every other change: checked with
    /// the others' running policies first, nothing changed if any is not valid (module docs);
    /// `swap` runs once the new and changed ones are in place and before the ones gone are
    /// removed.
    pub async fn converge_source(
        &self,
        wanted: Vec<PolicyConfig>,
        owned: impl Fn(&str) -> bool,
        swap: impl FnOnce(),
    ) -> Result<Reloaded, PolicySetError> {
        let _serialised = self.overlay.lock().await;
        self.converge(wanted, owned, swap)
    }

    /// Brings the running policies `owned` picks to `wanted` (module docs); `swap` runs once
    /// the new and changed ones are in place and before the ones gone are removed.
    pub(super) fn converge(
        &self,
        wanted: Vec<PolicyConfig>,
        owned: impl Fn(&str) -> bool,
        swap: impl FnOnce(),
    ) -> Result<Reloaded, PolicySetError> {
        self.check_converge(&wanted, &owned)?;
        let current = self.running();
        let mut reloaded = Reloaded::default();
        let mut kept = BTreeSet::new();
        for config in wanted {
            kept.insert(config.name.clone());
            let name = config.name.clone();
            match current.get(&name) {
                Some(running) if *running == config => continue,
                Some(_) => reloaded.changed.push(name),
                None => reloaded.created.push(name),
            }
            // Checked above with the rest; a failure here would be a policy that passed the
            // set's checks but not its own: reported by name, and the reload counted failed.
            if let Err(error) = self.policies.upsert(config) {
                reloaded.failed.push(error.to_string());
            }
        }
        swap();
        // Kept buckets that waited for a policy that just came are taken on before it
        // decides much.
        if let Some(kept) = &self.kept {
            kept.restore_waiting(&self.policies);
        }
        // So are buckets a member handed over before the policy came (a node joining while
        // its policy log catches up).
        self.decider.take_on_awaiting();
        let gone = current
            .keys()
            .filter(|name| owned(name) && !kept.contains(*name));
        for name in gone {
            self.remove_policy(name);
            reloaded.removed.push(name.clone());
        }
        Ok(reloaded)
    }

    /// The running policies, by name.
    fn running(&self) -> BTreeMap<String, PolicyConfig> {
        self.policies
            .policies()
            .iter()
            .map(|p| {
                let config = p.config();
                (config.name.clone(), config)
            })
            .collect()
    }

    /// Whether [`converge`](Self::converge) would take `wanted`: the same checks as at start,
    /// over the whole set at once (built and dropped).
    pub(super) fn check_converge(
        &self,
        wanted: &[PolicyConfig],
        owned: impl Fn(&str) -> bool,
    ) -> Result<(), PolicySetError> {
        let current = self.running();
        let others = current.into_values().filter(|c| !owned(&c.name));
        PolicySet::new(
            wanted.iter().cloned().chain(others).collect(),
            weir::SystemClock::new(),
        )
        .map(drop)
    }
}
