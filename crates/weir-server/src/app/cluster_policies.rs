//! In a cluster, a policy change made over the API (HTTP `PUT`/`DELETE`, `weir config`, the
//! page) is proposed to the cluster's policy log and acknowledged once committed — by a
//! majority, on disk — and applied on this node; every member applies the log's overlay over
//! its own config file as it commits, the difference only, as a reload does. The node also
//! keeps its own copy of the overlay in the data dir, so that it restarts with what the
//! cluster had even before it hears from a leader.

use std::sync::Arc;

use weir::policy::PolicyConfig;

use super::PolicyAdmin;
use super::policy_admin::TaggedPolicy;
use crate::durable::Overlay;
use crate::error::{ApiError, ErrorKind};
use crate::etag::etag_of;
use crate::policy_log::PolicyLog;
use crate::policy_log::change::{Change, Expect, Outcome};
use crate::reserved::is_rule_policy;

impl PolicyAdmin {
    /// The cluster's policy log, in cluster mode.
    pub(super) fn policy_log(&self) -> Option<&Arc<PolicyLog>> {
        self.cluster.as_ref().map(|cluster| cluster.policy_log())
    }

    /// What a conditional write on `name` expects, with this node's config file's policy.
    fn expect(&self, name: &str, if_match: Option<&str>) -> Expect {
        let base = self
            .file_policies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|policy| policy.name == name)
            .cloned();
        Expect {
            if_match: if_match.map(str::to_owned),
            base,
        }
    }

    /// Follows the policy log until it ends, applying each overlay it commits.
    pub async fn follow_cluster_policies(self: Arc<Self>) {
        let Some(log) = self.policy_log() else {
            return;
        };
        let mut applied = log.applied();
        loop {
            let (index, overlay) = {
                let now = applied.borrow_and_update();
                (now.index, Arc::clone(&now.overlay))
            };
            // Index 0: the log has applied nothing yet; the data dir's copy stands meanwhile.
            if index > 0 {
                self.apply_cluster_overlay(&overlay).await;
            }
            if applied.changed().await.is_err() {
                return;
            }
        }
    }

    /// Lays `overlay`, as the log committed it, over the config file: the difference only.
    async fn apply_cluster_overlay(&self, overlay: &Overlay) {
        let mut current = self.overlay.lock().await;
        if *current == *overlay {
            return;
        }
        let file = self
            .file_policies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match self.converge(overlay.apply(file), |name| !is_rule_policy(name), || {}) {
            Ok(applied) if !applied.is_empty() => tracing::info!(
                created = ?applied.created,
                changed = ?applied.changed,
                removed = ?applied.removed,
                "applied the cluster's policy changes"
            ),
            Ok(_) => {}
            Err(error) => tracing::error!(
                %error,
                "the cluster's policies do not fit this node's (its config file or rules differ): this node keeps running the ones it has; `/v1/cluster` shows it as differing"
            ),
        }
        *current = overlay.clone();
        if let Err(error) = self.persist(overlay).await {
            tracing::warn!(%error, "could not keep a copy of the cluster's policy changes in the data dir");
        }
    }

    /// Refuses a policy some live member could not run: one whose buckets live in Redis, while
    /// a member has no `[redis]` (it would decide it per node, or refuse it).
    async fn check_every_member_runs(&self, change: &Change) -> Result<(), ApiError> {
        let Change::Put { config, .. } = change else {
            return Ok(());
        };
        if config.scope != weir::policy::Scope::Redis {
            return Ok(());
        }
        let Some(cluster) = self.cluster.as_ref() else {
            return Ok(());
        };
        let lacking = cluster.members_lacking("redis").await;
        if lacking.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(format!(
            "policy `{}`: `scope` is `redis`, but the member(s) {} have no `[redis]` naming a Redis; a policy the cluster commits runs on every member, so every member's config needs the cluster's `[redis]` first",
            config.name,
            lacking.join(", ")
        )))
    }

    /// Checks that the running policies with `change` made would still be a valid set here,
    /// as a change on one node is checked: so a mistake is refused before it is proposed.
    async fn check_change(&self, change: &Change) -> Result<(), ApiError> {
        let overlay = self.overlay.lock().await.clone();
        let mut next = overlay;
        crate::policy_log::change::apply(&mut next, change.clone());
        let file = self
            .file_policies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        self.check_converge(&next.apply(file), |name| !is_rule_policy(name))
            .map_err(|error| ApiError::invalid(error.to_string()))
    }

    /// Commits `change` through the policy log and applies it here.
    async fn commit(&self, log: &PolicyLog, change: Change) -> Result<Outcome, ApiError> {
        self.check_change(&change).await?;
        self.check_every_member_runs(&change).await?;
        let change_said = change.clone();
        let committed = log.propose(change).await.map_err(|refusal| match refusal {
            crate::policy_log::Refusal::Stopped => ApiError::shutting_down(),
            refusal @ (crate::policy_log::Refusal::LogStopped { .. }
            | crate::policy_log::Refusal::NotAppliedHere { .. }) => {
                ApiError::new(ErrorKind::NotReady, refusal.to_string())
            }
            refusal @ crate::policy_log::Refusal::OutcomeUnknown { .. } => ApiError::new(
                ErrorKind::OutcomeUnknown,
                format!("{refusal} {}", fate_of(&change_said)),
            ),
            refusal => ApiError::new(ErrorKind::NoQuorum, refusal.to_string()),
        })?;
        let overlay = Arc::clone(&log.applied().borrow().overlay);
        self.apply_cluster_overlay(&overlay).await;
        Ok(committed.outcome)
    }

    /// `PUT` in a cluster: committed, then answered as on one node.
    pub(super) async fn put_cluster_policy(
        &self,
        log: &PolicyLog,
        config: PolicyConfig,
        if_match: Option<&str>,
    ) -> Result<(bool, TaggedPolicy), ApiError> {
        let expect = self.expect(&config.name, if_match);
        let name = config.name.clone();
        let change = Change::Put {
            config: config.clone(),
            expect,
        };
        match self.commit(log, change).await? {
            Outcome::Written { created } => Ok((
                created,
                TaggedPolicy {
                    etag: etag_of(&config),
                    config,
                },
            )),
            outcome => Err(refused(&name, if_match, outcome)),
        }
    }

    /// A revert in a cluster: committed once every live member can apply it.
    pub(super) async fn revert_cluster_policy(
        &self,
        log: &PolicyLog,
        name: &str,
    ) -> Result<(), ApiError> {
        if let Some(cluster) = self.cluster.as_ref() {
            let lacking = cluster.members_lacking("revert").await;
            if !lacking.is_empty() {
                return Err(ApiError::conflict(format!(
                    "the member(s) {} run a Weir without revert: upgrade them first (a change they cannot apply would stop their policy log)",
                    lacking.join(", ")
                )));
            }
        }
        let change = Change::Revert {
            name: name.to_owned(),
        };
        match self.commit(log, change).await? {
            Outcome::Reverted => Ok(()),
            Outcome::NotFound => Err(super::policy_admin::nothing_to_revert(name)),
            outcome => Err(refused(name, None, outcome)),
        }
    }

    /// `DELETE` in a cluster: committed, then answered as on one node.
    pub(super) async fn delete_cluster_policy(
        &self,
        log: &PolicyLog,
        name: &str,
        if_match: Option<&str>,
    ) -> Result<TaggedPolicy, ApiError> {
        let change = Change::Delete {
            name: name.to_owned(),
            expect: self.expect(name, if_match),
        };
        match self.commit(log, change).await? {
            Outcome::Deleted { previous } => Ok(TaggedPolicy {
                etag: etag_of(&previous),
                config: previous,
            }),
            outcome => Err(refused(name, if_match, outcome)),
        }
    }
}

/// The error of a change the log refused when it applied it.
/// How a caller learns whether a change of unknown outcome applied.
fn fate_of(change: &Change) -> String {
    match change {
        Change::Put { config, .. } => format!(
            "(`GET /v1/policies/{}`: its ETag is {} if it did).",
            config.name,
            etag_of(config)
        ),
        Change::Delete { name, .. } => {
            format!("(`GET /v1/policies/{name}`: 404 `unknown_policy` if it did).")
        }
        Change::Revert { name } => format!(
            "(`GET /v1/policies/{name}`: its `Weir-Policy-Source` is `file`, or 404 if the file has none, if it did)."
        ),
        _ => String::new(),
    }
}

fn refused(name: &str, if_match: Option<&str>, outcome: Outcome) -> ApiError {
    match outcome {
        Outcome::PreconditionFailed { current } => ApiError::precondition_failed(format!(
            "If-Match {} does not match policy `{name}` (its tag is {}): another change was committed first",
            if_match.unwrap_or("(none)"),
            current.as_deref().unwrap_or("absent: no such policy")
        )),
        Outcome::NotFound => ApiError::unknown_policy(name),
        outcome => ApiError::internal(format!(
            "the policy log answered a change of `{name}` with {outcome:?}"
        )),
    }
}
