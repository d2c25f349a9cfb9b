//! Changing policies over the API: reads with their entity tags, conditional writes and
//! deletes, each made durable before it takes effect.

use std::collections::{BTreeMap, BTreeSet};

use weir::policy::PolicyConfig;

use super::App;
use crate::durable::{self, Overlay};
use crate::error::ApiError;
use crate::etag::etag_of;
use crate::reserved::reserved_name;

/// A policy and its entity tag.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedPolicy {
    /// The policy.
    pub config: PolicyConfig,
    /// Changes whenever the policy does.
    pub etag: String,
}

impl App {
    /// One policy with its tag.
    pub fn policy(&self, name: &str) -> Result<TaggedPolicy, ApiError> {
        let config = self
            .policies
            .get(name)
            .ok_or_else(|| ApiError::unknown_policy(name))?
            .config();
        Ok(TaggedPolicy {
            etag: etag_of(&config),
            config,
        })
    }

    /// Every policy with its tag, in name order.
    pub fn all_policies(&self) -> Vec<TaggedPolicy> {
        self.policies
            .policies()
            .iter()
            .map(|p| {
                let config = p.config();
                TaggedPolicy {
                    etag: etag_of(&config),
                    config,
                }
            })
            .collect()
    }

    fn check_if_match(&self, name: &str, if_match: Option<&str>) -> Result<(), ApiError> {
        let Some(expected) = if_match else {
            return Ok(());
        };
        let current = self.policies.get(name).map(|p| etag_of(&p.config()));
        match (expected.trim(), current) {
            ("*", Some(_)) => Ok(()),
            (tag, Some(current)) if tag == current => Ok(()),
            (_, current) => Err(ApiError::precondition_failed(format!(
                "If-Match {expected} does not match policy `{name}` (its tag is {})",
                current.as_deref().unwrap_or("absent: no such policy")
            ))),
        }
    }

    /// Creates or replaces a policy: validated, written to the data dir, then applied. Returns
    /// whether it was created, and its new tag.
    pub async fn put_policy(
        &self,
        name: &str,
        mut config: PolicyConfig,
        if_match: Option<&str>,
    ) -> Result<(bool, TaggedPolicy), ApiError> {
        if config.name.is_empty() {
            config.name = name.to_owned();
        } else if config.name != name {
            return Err(ApiError::invalid(format!(
                "the body names policy `{}` but the URL names `{name}`",
                config.name
            )));
        }
        if let Err(e) = config.validate() {
            return Err(ApiError::invalid(e.to_string()));
        }
        refuse_rule_policy(name)?;
        let mut overlay = self.overlay.lock().await;
        self.check_if_match(name, if_match)?;
        let next = overlay.with_upsert(config.clone());
        self.persist(&next).await?;
        let created = self
            .policies
            .upsert(config.clone())
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        *overlay = next;
        Ok((
            created,
            TaggedPolicy {
                etag: etag_of(&config),
                config,
            },
        ))
    }

    /// Deletes a policy: written to the data dir, then applied, its leases released. Returns
    /// the policy as it was, with its tag.
    pub async fn delete_policy(
        &self,
        name: &str,
        if_match: Option<&str>,
    ) -> Result<TaggedPolicy, ApiError> {
        let mut overlay = self.overlay.lock().await;
        let deleted = self.policy(name)?;
        // A policy an older version let take a name now reserved can still be deleted; an RLS
        // rule's cannot (its YAML would bring it back).
        if name.starts_with(crate::reserved::RLS_PREFIX) {
            refuse_rule_policy(name)?;
        }
        self.check_if_match(name, if_match)?;
        let next = overlay.with_delete(name);
        self.persist(&next).await?;
        self.remove_policy(name);
        *overlay = next;
        Ok(deleted)
    }

    /// Re-applies the config file's policies, `file` as just read: the data dir's overlay is
    /// laid over them as at start, and only the difference is applied — a changed policy is
    /// reshaped keeping its buckets' state (as a `PUT` does), a policy gone from the result is
    /// removed, a new one starts, and the others are not touched (their waiters, leases and
    /// buckets go on). The RLS rules' policies are their YAML's and stay as they are.
    ///
    /// The whole result is checked first; if any of it is not valid, nothing changes.
    pub async fn reload_policies(
        &self,
        file: Vec<PolicyConfig>,
    ) -> Result<Reloaded, weir::policy::PolicySetError> {
        // Serialised with the API's changes: each sees the other's result whole.
        let overlay = self.overlay.lock().await;
        let current: BTreeMap<String, PolicyConfig> = self
            .policies
            .policies()
            .iter()
            .map(|p| {
                let config = p.config();
                (config.name.clone(), config)
            })
            .collect();
        let mut wanted = overlay.apply(file);
        wanted.extend(
            current
                .values()
                .filter(|c| c.name.starts_with(crate::reserved::RLS_PREFIX))
                .cloned(),
        );
        // Built and dropped: the same checks as at start, over the whole set at once.
        weir::policy::PolicySet::new(wanted.clone(), weir::SystemClock::new())?;
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
        for name in current.keys().filter(|name| !kept.contains(*name)) {
            self.remove_policy(name);
            reloaded.removed.push(name.clone());
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
        self.policies.policies().iter().any(|policy| {
            !policy.name().starts_with(crate::reserved::RLS_PREFIX) && !kept.contains(policy.name())
        })
    }

    async fn persist(&self, overlay: &Overlay) -> Result<(), ApiError> {
        let dir = self.data_dir.clone();
        let overlay = overlay.clone();
        tokio::task::spawn_blocking(move || durable::store(&dir, &overlay))
            .await
            .map_err(|e| ApiError::internal(format!("writing the data dir: {e}")))?
            .map_err(|e| ApiError::internal(e.to_string()))
    }
}

/// What a reload of the config file changed, by policy name.
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

/// Refuses a change over the API to a reserved name (see [`reserved_name`]).
fn refuse_rule_policy(name: &str) -> Result<(), ApiError> {
    match reserved_name(name) {
        Some(why) => Err(ApiError::conflict(format!(
            "policy `{name}` cannot be changed over the API: {why}"
        ))),
        None => Ok(()),
    }
}
