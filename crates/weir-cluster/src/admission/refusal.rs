//! Why two-tier admission refused, and what it does when the owner cannot be asked or will not
//! grant yet: the policy's `on_unavailable` (open, closed, local share) and the fence.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir::Clock;

use super::{
    ClusterAdmission, Grant, Holding, OnUnavailable, Shape, Tier, Transport, TransportError,
    TwoTier, ceil_div,
};

/// Why a request was refused: the two-tier refusal reasons a 429 carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bucket `{bucket}` {reason}")]
pub struct ClusterRefusal {
    /// The bucket.
    pub bucket: String,
    /// Why, typed; its text is the sentence a 429 carries.
    pub reason: RefusalReason,
    /// When the request could succeed, if that is known (the owner is settling into the
    /// bucket and said when it will grant).
    pub retry_after: Option<Duration>,
}

/// Why the two tiers refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// The limits were reached: the node tier's (if it has one) and the shared pool's.
    Full {
        /// The per-node limit (0: no node tier).
        node_limit: u64,
        /// The shared limit (0: no shared pool).
        shared_limit: u64,
    },
    /// The shared limit could not be checked, and the policy refuses then (`closed`).
    Unchecked {
        /// The shared limit.
        shared_limit: u64,
        /// What the owner answered, if it answered (it is settling into the bucket, or does
        /// not hear from a majority).
        owner_said: Option<String>,
    },
    /// The shared limit could not be checked, and this node's share of it (`local_share`) is
    /// in use.
    ShareInUse {
        /// The shared limit.
        shared_limit: u64,
        /// This node's share of it.
        share: u64,
    },
}

impl RefusalReason {
    /// Whether the limits were reached (rather than the shared one could not be checked).
    pub fn is_full(&self) -> bool {
        matches!(self, RefusalReason::Full { .. })
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RefusalReason::Full {
                node_limit: n,
                shared_limit: m,
            } => match (n > 0, m > 0) {
                (true, true) => {
                    write!(
                        f,
                        "reached its per-node limit of {n} and its shared limit of {m}"
                    )
                }
                (true, false) => write!(f, "reached its per-node limit of {n}"),
                (false, _) => write!(f, "reached its shared limit of {m}"),
            },
            RefusalReason::Unchecked {
                shared_limit,
                ref owner_said,
            } => {
                write!(f, "could not check its shared limit of {shared_limit}")?;
                match owner_said {
                    Some(said) => write!(f, ": {said}"),
                    None => Ok(()),
                }
            }
            RefusalReason::ShareInUse {
                shared_limit,
                share,
            } => write!(
                f,
                "could not check its shared limit of {shared_limit}, and this node's share of it ({share}) is in use"
            ),
        }
    }
}

impl<C: Clock + Clone, T: Transport> TwoTier<C, T> {
    pub(super) fn refusal(&self, bucket: &str, reason: RefusalReason) -> ClusterRefusal {
        ClusterRefusal {
            bucket: bucket.to_owned(),
            reason,
            retry_after: None,
        }
    }

    pub(super) fn full(&self) -> RefusalReason {
        RefusalReason::Full {
            node_limit: self.config.node_limit,
            shared_limit: self.config.shared_limit,
        }
    }

    /// An owner's answer other than a grant: full, fenced out, or the owner could not be
    /// asked (the policy's `on_unavailable` decides).
    pub(super) fn not_granted(
        &self,
        bucket: &str,
        answer: Result<Grant, TransportError>,
        members: usize,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        match answer {
            Ok(Grant::Full) => Err(self.refusal(bucket, self.full())),
            Err(error @ TransportError::Settling { wait, .. }) => {
                self.fenced_out(bucket, &error, Some(wait))
            }
            Err(error @ TransportError::NoMajority { .. }) => self.fenced_out(bucket, &error, None),
            Ok(Grant::Granted { .. } | Grant::Renewed { .. } | Grant::TooManyBuckets) | Err(_) => {
                self.unavailable(bucket, members)
            }
        }
    }

    /// A request the owner would not grant yet (it is settling into the bucket — its tenure, or
    /// an unfenced policy's learning period — or does not hear from a majority): refused,
    /// saying why and, if known, when to come back.
    pub(super) fn fenced_out(
        &self,
        bucket: &str,
        error: &TransportError,
        wait: Option<Duration>,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        match self.fenced() {
            true => self.counters.fenced.fetch_add(1, Ordering::Relaxed),
            false => self.counters.learning.fetch_add(1, Ordering::Relaxed),
        };
        Err(ClusterRefusal {
            retry_after: wait,
            ..self.refusal(
                bucket,
                RefusalReason::Unchecked {
                    shared_limit: self.config.shared_limit,
                    owner_said: Some(error.to_string()),
                },
            )
        })
    }

    /// The owner could not be asked: the policy's `on_unavailable` decides.
    pub(super) fn unavailable(
        &self,
        bucket: &str,
        members: usize,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        let m = self.config.shared_limit;
        match self.config.on_unavailable {
            OnUnavailable::Open => {
                self.counters.fail_open.fetch_add(1, Ordering::Relaxed);
                Ok(ClusterAdmission {
                    tier: Tier::FailOpen,
                    hold: Holding::Nothing,
                })
            }
            OnUnavailable::Closed => Err(self.refusal(
                bucket,
                RefusalReason::Unchecked {
                    shared_limit: m,
                    owner_said: None,
                },
            )),
            OnUnavailable::LocalShare => {
                let share = ceil_div(m, members as u64);
                let shape = Shape::Concurrency { limit: share };
                // The share follows the ring's size; reshaping walks the keys, so only on change.
                if self.local_share.shape() != shape {
                    self.local_share.reshape(shape);
                }
                match self.local_share.try_acquire(bucket, 1) {
                    Ok(grant) => {
                        self.counters.local_share.fetch_add(1, Ordering::Relaxed);
                        Ok(ClusterAdmission {
                            tier: Tier::LocalShare,
                            hold: Holding::Permit(grant.taken),
                        })
                    }
                    Err(_) => Err(self.refusal(
                        bucket,
                        RefusalReason::ShareInUse {
                            shared_limit: m,
                            share,
                        },
                    )),
                }
            }
        }
    }
}
