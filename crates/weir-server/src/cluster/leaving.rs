//! A graceful leave, handing over first and draining after: on the stop signal this node steps
//! down as an owner while it still serves, so its buckets move to their next owners — with what
//! they had spent — before it stops answering.
//!
//! Stepping down is advertised in gossip (a member that is no owner); every member's ring, this
//! node's first, drops it, and the ring change hands this node's cluster-scoped rate buckets
//! and shared leases over as any ring change does. Until the others' rings follow, asks still
//! reach this node: it passes them on to the bucket's next owner, which takes them because the
//! bucket was just handed to it. Only then does the node drain its connections and go. Without
//! this, the others found the bucket's owner gone during the drain and each decided the
//! bucket alone, admitting up to once per node what the cluster should admit once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ClusterMode;
use weir_cluster::rates::bucket_of;

/// How long a bucket handed to this node is decided here though its ring does not name it the
/// owner yet: the time for gossip to carry the giver's step-down to every ring.
const HANDED_HOLDS: Duration = Duration::from_secs(10);

/// Buckets handed to this node, and when (see [`HANDED_HOLDS`]).
#[derive(Debug, Default)]
pub(super) struct Handed(HashMap<String, Instant>);

impl Handed {
    fn note(&mut self, bucket: String, now: Instant) {
        // Few at a time (a ring change's worth): forgotten as they lapse.
        self.0
            .retain(|_, at| now.duration_since(*at) < HANDED_HOLDS);
        self.0.insert(bucket, now);
    }

    fn holds(&self, bucket: &str, now: Instant) -> bool {
        self.0
            .get(bucket)
            .is_some_and(|at| now.duration_since(*at) < HANDED_HOLDS)
    }
}

impl ClusterMode {
    /// Steps down as an owner (module docs) and waits, at most `within`, until this node's
    /// ring no longer names it and the buckets that ring change moved have been handed over;
    /// then `settle` more, for the others' rings to follow.
    pub async fn step_down(&self, within: Duration, settle: Duration) {
        match self.gossip.lock().await.as_ref() {
            Some(gossip) => gossip.step_down().await,
            None => return,
        }
        let mut followed = self.followed.subscribe();
        let stepped_down = async {
            loop {
                let (generation, ring) = self.ring.load_versioned();
                let owner = ring.members().contains(&self.node_id);
                if !owner && *followed.borrow_and_update() >= generation {
                    return;
                }
                if followed.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(within, stepped_down).await.is_err() {
            tracing::warn!(
                "stepping down: the ring still names this node after {within:?}; leaving anyway"
            );
        }
        tokio::time::sleep(settle).await;
    }

    /// Notes that `key`'s bucket of `policy` was handed to this node.
    pub(super) fn note_handed(&self, policy: &str, key: &str) {
        self.handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(bucket_of(policy, key), Instant::now());
    }

    /// Whether `key`'s bucket of `policy` was handed to this node within the last
    /// [`HANDED_HOLDS`]: decided here though the ring does not name this node yet.
    pub fn was_handed(&self, policy: &str, key: &str) -> bool {
        self.handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holds(&bucket_of(policy, key), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_bucket_holds_for_a_while_and_then_lapses() {
        let start = Instant::now();
        let mut handed = Handed::default();
        handed.note("b".into(), start);
        assert!(handed.holds("b", start + Duration::from_secs(9)));
        assert!(!handed.holds("b", start + HANDED_HOLDS));
        assert!(!handed.holds("other", start));
        // Noting another forgets what has lapsed.
        handed.note("c".into(), start + HANDED_HOLDS);
        assert_eq!(handed.0.len(), 1);
    }
}
