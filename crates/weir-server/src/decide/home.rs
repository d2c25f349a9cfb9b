//! Where a policy's buckets live: the one place that reads `scope` and `[redis]
//! every_policy` together.
//!
//! Chosen from the policy's config at each decision rather than stored beside it: a policy is
//! reconfigured live (its config swapped whole), and a home kept apart would be a second
//! record to keep in step with it. Reading it is two loads of the config already read.

use weir::policy::{Policy, Scope};
use weir::{Clock, SystemClock};

use super::Decider;
use crate::error::{ApiError, ErrorKind};

/// Where a policy's buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// This node's own buckets (a node-scoped policy, a concurrency policy, or any policy on a
    /// node without cluster mode).
    Here,
    /// Each bucket on its owner on the ring (`scope = "cluster"` in cluster mode); a share of
    /// it on this node when the owner assigned one.
    Owner,
    /// Redis (`scope = "redis"`, or every rate policy with `[redis] every_policy`).
    Redis,
    /// `scope = "redis"` on a node whose config has no `[redis]`: it cannot be decided here.
    RedisMissing,
}

impl Home {
    /// Where `policy`'s buckets live on a node with (or without) a cluster and a Redis.
    pub fn of<C: Clock + Clone>(policy: &Policy<C>, in_cluster: bool, redis: Option<bool>) -> Home {
        policy.with_config(|config| {
            let rates = config.concurrency().is_none();
            match (config.scope, redis) {
                (_, Some(true)) if rates => Home::Redis,
                (Scope::Redis, Some(_)) if rates => Home::Redis,
                (Scope::Redis, None) if rates => Home::RedisMissing,
                (Scope::Cluster, _) if in_cluster => Home::Owner,
                _ => Home::Here,
            }
        })
    }
}

impl Decider {
    /// Where `policy`'s buckets live on this node.
    pub fn home_of(&self, policy: &Policy<SystemClock>) -> Home {
        let redis = self
            .redis
            .as_ref()
            .map(|redis| redis.settings().every_policy);
        Home::of(policy, self.cluster.is_some(), redis)
    }
}

/// Why a `scope = "redis"` policy cannot be decided on a node without `[redis]`.
pub(super) fn redis_missing(policy: &str) -> ApiError {
    // Committed by the cluster through a member that has a Redis: decided here per node, it
    // would admit the policy's limit on every member.
    ApiError::new(
        ErrorKind::NotReady,
        format!(
            "policy `{policy}` keeps its buckets in Redis (`scope = \"redis\"`), and this node's config has no `[redis]`: it cannot decide it; send the request to a member with one, or give this node the cluster's `[redis]`"
        ),
    )
}
