//! Changing policies over the API: reads with their entity tags, conditional writes and
//! deletes, each made durable before it takes effect.

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
        if config.scope == weir::policy::Scope::Redis && self.redis.is_none() {
            return Err(ApiError::invalid(format!(
                "policy `{name}`: `scope` is `redis`, but this node's config has no `[redis]` naming a Redis"
            )));
        }
        refuse_rule_policy(name)?;
        if let Some(log) = self.policy_log() {
            return self.put_cluster_policy(log, config, if_match).await;
        }
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
        // A policy an older version let take a name now reserved can still be deleted; an RLS
        // rule's cannot (its YAML would bring it back).
        if name.starts_with(crate::reserved::RLS_PREFIX) {
            refuse_rule_policy(name)?;
        }
        if let Some(log) = self.policy_log() {
            return self.delete_cluster_policy(log, name, if_match).await;
        }
        let mut overlay = self.overlay.lock().await;
        let deleted = self.policy(name)?;
        self.check_if_match(name, if_match)?;
        let next = overlay.with_delete(name);
        self.persist(&next).await?;
        self.remove_policy(name);
        *overlay = next;
        Ok(deleted)
    }

    pub(super) async fn persist(&self, overlay: &Overlay) -> Result<(), ApiError> {
        let dir = self.data_dir.clone();
        let overlay = overlay.clone();
        tokio::task::spawn_blocking(move || durable::store(&dir, &overlay))
            .await
            .map_err(|e| ApiError::internal(format!("writing the data dir: {e}")))?
            .map_err(|e| ApiError::internal(e.to_string()))
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
