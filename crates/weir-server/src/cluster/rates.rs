//! Cluster-scoped rate limits in cluster mode: whose bucket a key is, a request forwarded to its
//! owner, what the owner's side counts, and the handover of buckets when the ring moves them.

use std::time::Instant;

use super::{
    ClusterMode, Duration, Histogram, Ordering, RateDecision, Ring, SystemClock, bucket_of,
};
use weir::Clock;

use super::awaiting::Kept;
use weir_cluster::rates::{Handover, RateAsk, Report, ReportAnswer};
use weir_cluster::transport::TransportExt;

/// How long a bucket the ring just gave this node is held while the previous owner's handover
/// may be on the way: until every member has answered this node's census (each has handed
/// over what the ring moved here), or this long after it took the bucket, whichever is first.
/// Meanwhile the bucket allows the share of its capacity its tenure is of this, so a decision
/// made before the handover arrives cannot admit the burst the previous owner already did.
pub const HANDOVER_HOLD: Duration = Duration::from_secs(1);

impl ClusterMode {
    /// The owner of a cluster-scoped rate bucket when it is another node; `None` when this
    /// node decides it (it owns it, or the ring is empty).
    pub fn rate_owner(&self, policy: &str, key: &str) -> Option<String> {
        self.ring
            .owner_of(&bucket_of(policy, key))
            .filter(|owner| *owner != self.node_id)
    }

    /// Whether this node owns a cluster-scoped rate bucket (and so decides it for others).
    pub fn owns_rate(&self, policy: &str, key: &str) -> bool {
        self.ring.is_owner(&bucket_of(policy, key), &self.node_id)
    }

    /// Asks `owner` to decide `request`. `Err`: decide here, the owner could not (unreachable,
    /// or not the owner or without the policy by its own ring and config); it is counted.
    pub async fn forward(&self, owner: &str, request: RateAsk) -> Result<RateDecision, String> {
        let started = std::time::Instant::now();
        let decided = self.transport.decide(owner, request).await;
        self.rates
            .forward_latency
            .observe(started.elapsed().as_secs_f64());
        match decided {
            Ok(RateDecision::NotOwner) => {
                Err(format!("`{owner}` does not own the bucket by its ring"))
            }
            Ok(RateDecision::UnknownPolicy) => {
                Err(format!("`{owner}` has no such cluster-scoped policy"))
            }
            Ok(decision) => {
                self.rates.forwarded.fetch_add(1, Ordering::Relaxed);
                Ok(decision)
            }
            Err(error) => Err(error.to_string()),
        }
        .inspect_err(|_| {
            self.rates.forward_failed.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Sends a data plane's `report` to `owner`, the bucket's owner: its answer, or why it
    /// could not be asked.
    pub async fn report_to(&self, owner: &str, report: Report) -> Result<ReportAnswer, String> {
        let mut answers = self.transport.report(owner, vec![report]).await;
        match answers.pop() {
            Some(answer) => answer.map_err(|error| error.to_string()),
            None => Err(format!("`{owner}` did not answer the report")),
        }
    }

    /// The latency histogram of forwarded decisions, for `/metrics`.
    pub fn forward_latency(&self) -> Histogram {
        self.rates.forward_latency.clone()
    }

    /// Counts a decision made here for another node.
    pub fn decided_for_other(&self) {
        self.rates
            .decided_for_others
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps a rate bucket handed over before its policy runs here until it does (see
    /// `awaiting.rs`); `false` if it was dropped, as many waiting already as may.
    pub fn await_policy(&self, handover: Handover) -> bool {
        self.awaiting_policy.keep(handover, Instant::now()) == Kept::Waiting
    }

    /// The rate buckets that waited for a policy `runs` says this node now runs.
    pub fn handovers_for(&self, runs: impl Fn(&str) -> bool) -> Vec<Handover> {
        self.awaiting_policy.take_for(runs, Instant::now())
    }

    /// How many rate buckets wait for their policy.
    pub fn handovers_awaiting_policy(&self) -> usize {
        self.awaiting_policy.len()
    }

    /// Counts a cluster-scoped rate bucket another node handed over, taken on here, and notes
    /// it: asks for it are decided here until the ring names this node (see `leaving.rs`).
    pub fn took_on_rate_bucket(&self, policy: &str, key: &str) {
        self.note_handed(policy, key);
        self.rates.taken_on.fetch_add(1, Ordering::Relaxed);
    }

    /// For a cluster-scoped rate bucket this node owns: how long it has owned it, if the ring
    /// gave it to this node less than [`HANDOVER_HOLD`] ago and some member has not yet
    /// answered this node's census (its handover of the bucket may still be on the way).
    /// `None` otherwise — one atomic load, unless a ring change is in progress.
    pub fn awaiting_handover(&self, policy: &str, key: &str) -> Option<Duration> {
        if !self.handovers_pending.load(Ordering::Acquire) {
            return None;
        }
        self.rate_tenure(policy, key)
            .filter(|held_for| *held_for < HANDOVER_HOLD)
    }

    /// Counts a decision on a rate bucket held to its owner's tenure.
    pub fn held_while_learning(&self) {
        self.rates.learning.fetch_add(1, Ordering::Relaxed);
    }

    /// How long this node has owned a cluster-scoped rate bucket without a gap or a pause;
    /// `None` if it does not own it.
    pub fn rate_tenure(&self, policy: &str, key: &str) -> Option<Duration> {
        self.owner
            .held_for(&bucket_of(policy, key), SystemClock::new().now())
    }

    /// Hands the cluster-scoped rate buckets the ring moves away from this node to their new
    /// owners (see [`weir_cluster::transport::hand_over`]), and counts them.
    pub(super) async fn hand_over_rates(&self, before: &Ring, after: &Ring) {
        let Some(rates) = self.rate_owner.get() else {
            return;
        };
        let taken = weir_cluster::transport::hand_over(
            &**rates,
            &self.transport,
            &self.node_id,
            before,
            after,
        )
        .await;
        self.rates
            .handed_over
            .fetch_add(taken as u64, Ordering::Relaxed);
        if taken > 0 {
            tracing::info!(
                buckets = taken,
                "rate buckets handed over to their new owners"
            );
        }
    }
}
