//! Where a decision was made, as the counters tell it apart (`weir_decisions_total{decided}`).
//!
//! Every decision is counted once, on the node that made it, in its policy's own series:
//! `here` (this node's own bucket, for a request it was asked), `owner` (this node as a
//! bucket's owner, for a request another node forwarded), `assigned` (this node within the
//! share of a bucket its owner assigned it), `redis` (the Redis the policy's buckets live in),
//! `envoy_assigned` (Envoy, within the share assigned to it over RLQS, as its reports say).
//! Summed over the members, a policy's series add up to what its clients were answered. The
//! core keeps the places apart by index ([`weir::policy::stats::PLACES`]); their names are
//! the server's.

use weir::policy::stats::PLACES;

/// Where a decision was made, besides this node's own bucket for its own request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// This node as the bucket's owner, for a request another node forwarded.
    Owner,
    /// This node, within the share of the bucket its owner assigned it.
    Assigned,
    /// The Redis the policy's buckets live in.
    Redis,
    /// Envoy, within the share assigned to it over RLQS.
    EnvoyAssigned,
}

impl Place {
    /// Every place, in index order.
    pub const ALL: [Place; PLACES] = [
        Place::Owner,
        Place::Assigned,
        Place::Redis,
        Place::EnvoyAssigned,
    ];

    /// Its index in the core's counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its `decided` label.
    pub fn name(self) -> &'static str {
        match self {
            Place::Owner => "owner",
            Place::Assigned => "assigned",
            Place::Redis => "redis",
            Place::EnvoyAssigned => "envoy_assigned",
        }
    }
}

/// The `decided` label of decisions made by this node's own bucket for its own requests.
pub const HERE: &str = "here";
