//! The HTTP API's JSON bodies: what `POST /v1/acquire`, `/v1/release`, `/v1/renew` and
//! `/v1/busy` read and answer.
//!
//! The server parses requests into these and writes its answers from them; a client builds and
//! reads the same types, so the two cannot drift apart. Answers borrow their strings (a
//! server writes them without copying); a client reads them owned (`Admission<'static>`).
//! `docs/configuration.md` ("HTTP API") documents each endpoint.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// `POST /v1/acquire`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The policy's name.
    pub policy: String,
    /// The bucket key: at most 256 bytes of UTF-8 (the schema says 64 characters, which always
    /// fit).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 64))]
    pub key: String,
    /// The kind (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The cost (absent: 1), at most the policy's `max_cost` (or the server's).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// The longest the caller waits, in ms (absent: the policy's `max_wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
}

/// The `200` answer to an acquisition.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission<'a> {
    /// Always `true`.
    pub admitted: bool,
    /// How long it waited, in ms.
    pub waited_ms: u64,
    /// Which tier admitted it: `node`, or in cluster mode `owner` (another node decided a
    /// cluster-scoped rate), `shared`, `fail_open`, `local_share`.
    pub tier: Cow<'a, str>,
    /// The lease to release (concurrency policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Cow<'a, str>>,
    /// The lease's time to live, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Admitted only because the policy monitors (`mode = "monitor"`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub would_throttle: bool,
}

/// The `429` answer to an acquisition.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal<'a> {
    /// Always `false`.
    pub admitted: bool,
    /// When asking again could succeed, in ms; `null` when only a release makes room.
    pub retry_after_ms: Option<u64>,
    /// Why, in a sentence.
    pub reason: Cow<'a, str>,
}

/// `POST /v1/release`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The lease an admission returned: 32 hexadecimal digits.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-fA-F]{32}$"))]
    pub lease: String,
}

/// The answer to a release.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// Always `true` (an unknown lease is a `404`).
    pub released: bool,
}

/// `POST /v1/renew`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The lease an admission returned: 32 hexadecimal digits.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-fA-F]{32}$"))]
    pub lease: String,
    /// The new time to live, in ms (absent, and at most: the policy's `lease_ttl`).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// The answer to a renewal.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// The time the lease now has left, in ms.
    pub expires_in_ms: u64,
}

/// `POST /v1/busy`: the backend behind a policy says it is overloaded.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusyBody {
    /// The adaptive policy.
    pub policy: String,
    /// Accepted for the API's shape; a busy signal applies to the whole policy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

/// The answer to a busy signal.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tightened {
    /// Whether a limit was tightened (false within the cooldown, or with nothing to limit).
    pub tightened: bool,
}

/// `GET /v1/cluster`: the same shape alone and in a cluster.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// `"single node"`, or `"cluster"` (joined by gossip).
    pub mode: String,
    /// The live members, this node included.
    pub members: Vec<ClusterMember>,
    /// The ring the members form.
    pub ring: RingSummary,
    /// What this node's shared tier did (all 0 on a single node).
    pub counters: ClusterCounters,
    /// Shared units this node, as the owner of their buckets, has lent out now, by the node
    /// holding them (itself included; a plain lease is one unit).
    #[serde(default)]
    pub lent: std::collections::BTreeMap<String, u64>,
    /// The members whose config version (see [`ClusterMember::config_version`]) is not this
    /// node's: they run other policies, or have not yet applied a change the cluster made.
    #[serde(default)]
    pub config_differs: Vec<String>,
    /// What differs, policy by policy, between this node and each member in
    /// `config_differs` (asked of each, a second to answer; empty when none differs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_drift: Vec<PolicyDrift>,
    /// The cluster's policy log as this node sees it (cluster mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_log: Option<PolicyLogView>,
    /// Policies in force that this node cannot run (a `scope = "redis"` policy on a node
    /// without `[redis]`): their requests are refused here, by name, never decided per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cannot_run: Vec<String>,
}

/// The cluster's policy log (Raft) as one member sees it, in [`ClusterView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyLogView {
    /// The leader's gRPC address, if one is known.
    pub leader: Option<String>,
    /// Whether this node leads.
    pub is_leader: bool,
    /// The Raft term.
    pub term: u64,
    /// The index of the last change this node has applied.
    pub applied_index: u64,
    /// How many members vote.
    pub voters: usize,
    /// Changes made through this node: committed, refused for want of a majority (nothing
    /// written: they will not apply), and of unknown outcome (written by the leader, not
    /// confirmed by a majority in time: they apply if a majority takes them later).
    pub committed_here: u64,
    /// See [`committed_here`](Self::committed_here).
    pub refused_here: u64,
    /// See [`committed_here`](Self::committed_here).
    #[serde(default)]
    pub outcome_unknown_here: u64,
    /// The voters by node id, each with its state as this member sees it.
    #[serde(default)]
    pub voter_states: Vec<PolicyLogVoter>,
}

/// `DELETE /v1/cluster/members/{id}`: a member gone for good forgotten as a voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberForgotten {
    /// The member forgotten.
    pub forgotten: String,
    /// The voters left, by node id.
    pub voters: Vec<String>,
}

/// A voter of the policy log in [`PolicyLogView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyLogVoter {
    /// Its node id (its address in the log if this member never saw it).
    pub id: String,
    /// `alive` (gossip sees it), `suspect` (unseen for less than `forget_after`) or `gone`
    /// (unseen for longer: the leader forgets it, unless the live voters would then lose their
    /// majority).
    pub state: String,
    /// How long it has gone unseen, if it is not alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen_for_ms: Option<u64>,
}

/// One policy that differs between this node and another member ([`ClusterView`]).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyDrift {
    /// The other member's node id.
    pub member: String,
    /// The policy.
    pub policy: String,
    /// How it differs: `missing there` (this node runs it, the member does not), `missing
    /// here`, or the settings that differ with both values (`token_bucket: {"rate":10,…}
    /// here, {"rate":20,…} there`).
    pub how: String,
}

/// A member in [`ClusterView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// Its node id.
    pub id: String,
    /// Its gRPC address (as the policy log last knew it, for a member not seen alive).
    pub grpc: String,
    /// `alive`; `leaving` (alive, handing its buckets over before it stops); `suspect` (a
    /// voter of the policy log that gossip no longer sees: paused, cut off or stopped, for less
    /// than `forget_after`); `gone` (unseen for longer: the leader forgets it unless the live
    /// voters would then lose their majority). Members that left gracefully are not listed.
    pub state: String,
    /// How long it has gone unseen, for a member not alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen_for_ms: Option<u64>,
    /// Whether it votes in the policy log (counts in the majority a change needs).
    #[serde(default)]
    pub votes: bool,
    /// The cluster protocol version it speaks (0: not known, for a member not seen alive).
    pub protocol: u32,
    /// Whether it may own buckets.
    pub owner: bool,
    /// The version of the policies it runs: a digest of every policy's config, the same on
    /// members that run the same policies. `None` until it has advertised one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_version: Option<String>,
    /// The Weir release it runs (`0.1.0`), as it advertises it: a rolling upgrade shows here
    /// member by member. `None` until it has advertised one, or for a member not seen alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
}

/// The ring in [`ClusterView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingSummary {
    /// Members on the ring.
    pub members: usize,
    /// Virtual nodes per member.
    pub vnodes: u32,
    /// How long this node has seen the same ring, with no pause of its own, in milliseconds:
    /// the shortest time it has owned any of its buckets, which a `closed` policy's owner must
    /// reach (a loan's TTL and the quorum's margin) before it grants. 0 on a single node.
    #[serde(default)]
    pub unchanged_for_ms: u64,
    /// Every live member has answered this node's census of the ring: each runs it and has
    /// handed over what it moved here, so the buckets this node took on are decided with what
    /// their previous owners spent. True on a single node.
    #[serde(default)]
    pub handed_over: bool,
}

/// This node's shared-tier counters in [`ClusterView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCounters {
    /// Admissions from the shared tier (a lease from the owner, or a unit lent to this node).
    pub shared: u64,
    /// Admissions because the owner could not be asked (`on_unavailable = "open"`).
    pub fail_open: u64,
    /// Admissions within the local share (`on_unavailable = "local_share"`).
    pub local_share: u64,
    /// Times an owner could not be asked.
    pub unavailable: u64,
    /// Leases handed over to a bucket's new owner.
    pub handed_off: u64,
    /// Grants returned because the ring moved their bucket on the way.
    pub raced: u64,
    /// Buckets this node holds leases of as their owner.
    pub buckets_owned: u64,
    /// Requests of cluster-scoped rate policies sent to their bucket's owner and decided there.
    #[serde(default)]
    pub forwarded: u64,
    /// Requests of cluster-scoped rate policies decided here because their owner could not
    /// decide them (unreachable, or its ring or policies differed for a moment).
    #[serde(default)]
    pub forward_failed: u64,
    /// Requests of cluster-scoped rate policies this node decided for other nodes.
    #[serde(default)]
    pub decided_for_others: u64,
    /// Shared admissions on units lent to this node, made with no call to the owner (counted in
    /// `shared` too).
    #[serde(default)]
    pub from_loan: u64,
    /// Requests refused because the bucket's new owner was in its learning period.
    #[serde(default)]
    pub learning: u64,
    /// Lent units this node gave back to their owners.
    #[serde(default)]
    pub given_back: u64,
    /// Units lent to this node now, over every bucket.
    #[serde(default)]
    pub borrowed: u64,
    /// As an owner: requests refused while other nodes held loans of the bucket (an upper bound
    /// on the refusals lending caused; some of those units were in use).
    #[serde(default)]
    pub refused_while_lent: u64,
    /// Cluster-scoped rate buckets this node handed to their new owner when the ring moved
    /// them away (a join, or this node leaving).
    #[serde(default)]
    pub rate_buckets_handed_over: u64,
    /// Cluster-scoped rate buckets another node handed to this one, taken on.
    #[serde(default)]
    pub rate_buckets_taken_on: u64,
    /// Decisions on cluster-scoped rate buckets this node owned for less than the policy's
    /// `learning_period`, each bucket held to what it refilled since.
    #[serde(default)]
    pub rate_learning: u64,
    /// Requests of cluster-scoped rate policies this node admitted within the share of the
    /// bucket its owner assigned it.
    #[serde(default)]
    pub assigned_admitted: u64,
    /// Requests it refused within such a share.
    #[serde(default)]
    pub assigned_refused: u64,
    /// Reports of its demand sent to buckets' owners.
    #[serde(default)]
    pub assignment_reports: u64,
    /// Of them, those no owner answered.
    #[serde(default)]
    pub assignment_reports_failed: u64,
    /// Assignments this node holds now.
    #[serde(default)]
    pub assignments_held: u64,
    /// Shares this node lends now, as an owner, over every bucket (a bucket's rate is 1000
    /// shares).
    #[serde(default)]
    pub shares_lent: u64,
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_reads_back_as_written() {
        let written = Admission {
            admitted: true,
            waited_ms: 3,
            tier: "node".into(),
            lease: Some("l-1".into()),
            lease_ttl_ms: Some(30_000),
            would_throttle: false,
        };
        let json = serde_json::to_string(&written).unwrap();
        assert_eq!(
            json,
            r#"{"admitted":true,"waited_ms":3,"tier":"node","lease":"l-1","lease_ttl_ms":30000}"#
        );
        let read: Admission<'static> = serde_json::from_str(&json).unwrap();
        assert_eq!(read, written);
    }

    #[test]
    fn a_refusal_without_a_retry_time_says_null() {
        let json = serde_json::to_string(&Refusal {
            admitted: false,
            retry_after_ms: None,
            reason: "full".into(),
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"admitted":false,"retry_after_ms":null,"reason":"full"}"#
        );
    }

    #[test]
    fn an_acquire_body_refuses_unknown_fields_and_defaults_the_rest() {
        let body: AcquireBody = serde_json::from_str(r#"{"policy":"p","key":"k"}"#).unwrap();
        assert_eq!(body.kind, "");
        assert_eq!(body.cost, None);
        let error = serde_json::from_str::<AcquireBody>(r#"{"policy":"p","key":"k","kee":1}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `kee`"), "{error}");
    }
}
