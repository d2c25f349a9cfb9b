//! The policies in force and every change to them: reads with their entity tags, conditional
//! writes and deletes over the API, each made durable before it takes effect; reloads
//! (`reloading.rs`), the cluster's policy log (`cluster_policies.rs`) and adaptive policies'
//! busy signals go through the same [`PolicyAdmin`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tokio::sync::Mutex as AsyncMutex;
use weir::SystemClock;
use weir::policy::{PolicyConfig, PolicySet, Scope};

use super::KeptBuckets;
use crate::cluster::ClusterMode;
use crate::decide::Decider;
use crate::durable::{self, Overlay};
use crate::error::ApiError;
use crate::etag::etag_of;
use crate::leases::Leases;
use crate::reserved::reserved_name;

/// A policy and its entity tag.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedPolicy {
    /// The policy.
    pub config: PolicyConfig,
    /// Changes whenever the policy does.
    pub etag: String,
}

/// Where a policy in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicySource {
    /// The config file, as written there.
    File,
    /// The RLS rules (`rls:…`).
    Rls,
    /// A change made over the API, for a name the config file does not define.
    Api,
    /// A change made over the API in place of the config file's policy of that name (which a
    /// revert brings back).
    ApiOverFile,
}

impl PolicySource {
    /// `file`, `rls` or `api`.
    pub fn name(self) -> &'static str {
        match self {
            PolicySource::File => "file",
            PolicySource::Rls => "rls",
            PolicySource::Api | PolicySource::ApiOverFile => "api",
        }
    }

    /// Whether it stands in place of the config file's policy of its name.
    pub fn overrides_file(self) -> bool {
        self == PolicySource::ApiOverFile
    }
}

/// The policies in force, the overlay of API changes laid over the config file's, and what
/// goes with a policy's life (its leases, its last busy signal).
pub struct PolicyAdmin {
    pub(super) policies: Arc<PolicySet<SystemClock>>,
    data_dir: PathBuf,
    /// The overlay in force; the lock also serialises every change (API, reload, the log).
    pub(super) overlay: AsyncMutex<Overlay>,
    /// The config file's policies as last read: what the overlay is laid over.
    pub(super) file_policies: Mutex<Vec<PolicyConfig>>,
    leases: Arc<Leases>,
    /// When each adaptive policy last took a busy signal.
    last_busy: Mutex<HashMap<String, SystemTime>>,
    pub(super) cluster: Option<Arc<ClusterMode>>,
    pub(super) kept: Option<Arc<KeptBuckets>>,
    /// Takes on the buckets handed over before their policy started here.
    pub(super) decider: Arc<Decider>,
    /// Whether this node has a `[redis]` for `scope = "redis"` policies.
    has_redis: bool,
}

impl std::fmt::Debug for PolicyAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyAdmin")
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

/// What a [`PolicyAdmin`] is made of.
pub(super) struct PolicyAdminParts {
    pub policies: Arc<PolicySet<SystemClock>>,
    pub data_dir: PathBuf,
    pub overlay: Overlay,
    pub file_policies: Vec<PolicyConfig>,
    pub leases: Arc<Leases>,
    pub cluster: Option<Arc<ClusterMode>>,
    pub kept: Option<Arc<KeptBuckets>>,
    pub decider: Arc<Decider>,
    pub has_redis: bool,
}

impl PolicyAdmin {
    pub(super) fn new(parts: PolicyAdminParts) -> Self {
        PolicyAdmin {
            policies: parts.policies,
            data_dir: parts.data_dir,
            overlay: AsyncMutex::new(parts.overlay),
            file_policies: Mutex::new(parts.file_policies),
            leases: parts.leases,
            last_busy: Mutex::default(),
            cluster: parts.cluster,
            kept: parts.kept,
            decider: parts.decider,
            has_redis: parts.has_redis,
        }
    }

    /// The policies in force.
    pub fn set(&self) -> &Arc<PolicySet<SystemClock>> {
        &self.policies
    }

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

    /// Where `config`, a policy in force, comes from: the config file when it is the file's
    /// policy as written there, else the API (in place of the file's, if it has one).
    pub fn source_of(&self, config: &PolicyConfig) -> PolicySource {
        if crate::reserved::is_rule_policy(&config.name) {
            return PolicySource::Rls;
        }
        let file = self
            .file_policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match file.iter().find(|p| p.name == config.name) {
            Some(written) if written == config => PolicySource::File,
            Some(_) => PolicySource::ApiOverFile,
            None => PolicySource::Api,
        }
    }

    /// The config file's policies that a change made over the API replaced or deleted: not
    /// in force as the file writes them.
    pub fn shadowed(&self) -> Vec<String> {
        self.file_policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|p| {
                self.policies
                    .get(&p.name)
                    .is_none_or(|running| running.config() != **p)
            })
            .map(|p| p.name.clone())
            .collect()
    }

    /// How many policies in force come from each source (`file`, `api`, `rls`), and how many
    /// of the file's are shadowed ([`shadowed`](Self::shadowed)): for `/metrics`.
    pub fn source_counts(&self) -> (Vec<(&'static str, u64)>, u64) {
        let mut counts = [("file", 0), ("api", 0), ("rls", 0)];
        for policy in self.policies.policies() {
            let source = self.source_of(&policy.config()).name();
            if let Some(count) = counts.iter_mut().find(|(name, _)| *name == source) {
                count.1 += 1;
            }
        }
        (counts.to_vec(), self.shadowed().len() as u64)
    }

    /// Drops the changes made over the API to policy `name` (in a cluster, through the policy
    /// log): the config file's version applies again, or none if the file has none. The
    /// policy now in force, if any. 404 when no change made over the API holds the name.
    pub async fn revert_policy(&self, name: &str) -> Result<Option<TaggedPolicy>, ApiError> {
        refuse_rule_policy(name)?;
        if let Some(log) = self.policy_log() {
            self.revert_cluster_policy(log, name).await?;
            return Ok(self.policy(name).ok());
        }
        let mut overlay = self.overlay.lock().await;
        if !overlay.touches(name) {
            return Err(nothing_to_revert(name));
        }
        let next = overlay.without(name);
        self.persist(&next).await?;
        let file = self
            .file_policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|p| p.name == name)
            .cloned();
        match file {
            Some(config) => {
                self.policies
                    .upsert(config)
                    .map_err(|e| ApiError::invalid(e.to_string()))?;
            }
            None => self.remove_policy(name),
        }
        *overlay = next;
        Ok(self.policy(name).ok())
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
        if config.scope == Scope::Redis && !self.has_redis {
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

    /// A downstream reported "busy" for an adaptive policy; true if limits were tightened.
    pub fn busy(&self, policy: &str) -> Result<bool, ApiError> {
        let found = self
            .policies
            .get(policy)
            .ok_or_else(|| ApiError::unknown_policy(policy))?;
        let tightened = found.busy().ok_or_else(|| {
            ApiError::conflict(format!(
                "policy `{policy}` is not adaptive: only an `adaptive` policy takes busy signals"
            ))
        })?;
        self.last_busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.to_owned(), SystemTime::now());
        Ok(tightened)
    }

    /// When each adaptive policy last took a busy signal.
    pub(super) fn last_busy(&self) -> HashMap<String, SystemTime> {
        self.last_busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Removes a policy with all it held: its leases are released (a lease belongs to its
    /// policy's life, so one made again under the name starts with nothing in flight) and its
    /// last busy signal is forgotten.
    pub(super) fn remove_policy(&self, policy: &str) {
        self.policies.remove(policy);
        let released = self.leases.release_policy(policy);
        if released > 0 {
            tracing::info!(policy, released, "policy removed: its leases are released");
        }
        self.last_busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
    }

    /// The version of the policies this node runs: a hash of them all, by name and entity tag
    /// (`weir_config_info{hash}`), the same on every node that runs the same policies.
    pub fn config_version(&self) -> String {
        crate::etag::version_of(&self.policies)
    }

    /// Each policy in force with its entity tag and config (JSON), for members whose config
    /// versions differ to name what differs.
    pub fn policy_versions(&self) -> Vec<crate::proto::PolicyVersion> {
        self.policies
            .policies()
            .iter()
            .map(|policy| {
                let config = policy.config();
                crate::proto::PolicyVersion {
                    name: config.name.clone(),
                    etag: etag_of(&config),
                    config_json: serde_json::to_string(&config).unwrap_or_default(),
                }
            })
            .collect()
    }

    /// The policies in force this node cannot run: a `scope = "redis"` policy (the cluster
    /// committed it) on a node without `[redis]`.
    pub fn cannot_run(&self) -> Vec<String> {
        if self.has_redis {
            return Vec::new();
        }
        self.policies
            .policies()
            .into_iter()
            .filter(|policy| policy.with_config(|c| c.scope == Scope::Redis))
            .map(|policy| policy.name().to_owned())
            .collect()
    }

    /// What this node can run that not every member may: `revert` (it applies
    /// `Change::Revert`), and `redis` with a `[redis]` store.
    pub(super) fn abilities(&self) -> &'static str {
        if self.has_redis {
            "revert,redis"
        } else {
            "revert"
        }
    }
}

/// The error of a revert with nothing to revert.
pub(super) fn nothing_to_revert(name: &str) -> ApiError {
    ApiError::new(
        crate::error::ErrorKind::UnknownPolicy,
        format!(
            "policy `{name}` has no change made over the API to revert: it runs as the config file (or the RLS rules) define it, or not at all"
        ),
    )
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
