//! This node's part in the owners' census (see [`weir_cluster::census`]): asking the members
//! what they hold for the buckets it just took on, answering the others, and telling a crash
//! from a clean stop across a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use weir::{Clock, SystemClock};
use weir_cluster::census::{Answer, CensusAnswers};
use weir_cluster::transport::TransportExt;

use super::ClusterMode;

/// How often an owner asks the members that have not answered its census yet.
const ASK_EVERY: Duration = Duration::from_millis(200);

/// How long an owner waits for one member's answer before asking again at the next round.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// How long a joining node's ring, with another member in it, must have held unchanged for the
/// node to count as joined though some live member has not answered its census on it (a
/// paused or cut-off member must not keep every restarted node out of service).
pub(super) const AGREE_WITHIN: Duration = Duration::from_secs(3);

/// Left in the data dir by a clean stop, and taken at the next start: a node that starts
/// without it after a run of its own crashed, and the leases its clients still hold are known
/// to nobody.
const STOPPED_CLEANLY: &str = "stopped-cleanly";

/// How a node's previous run in its data dir ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PreviousRun {
    /// There was none: this is its first run, and nothing it granted or held predates it.
    None,
    /// It stopped cleanly: it handed over, and its clients' leases ended with it.
    Clean,
    /// It crashed: its clients may still hold what it granted, known to nobody.
    Crashed,
}

/// A census answerer over a node's cluster state.
pub(super) struct Answers(pub(super) Arc<ClusterMode>);

impl CensusAnswers for Answers {
    fn answer(&self, owner: &str, fingerprint: u64) -> Option<Answer> {
        let node = &self.0;
        let (generation, ring) = node.ring.load_versioned();
        // Ready once this node runs the asker's ring and its handoff for it has run.
        if ring.fingerprint() != fingerprint || *node.followed.borrow() < generation {
            return None;
        }
        let held = node
            .coordinators()
            .iter()
            .flat_map(|coordinator| coordinator.held_for(owner, &ring))
            .collect();
        Some(Answer {
            fingerprint,
            quiet: node.owner.quiet(SystemClock::new().now()),
            held,
        })
    }
}

impl ClusterMode {
    /// Asks, every [`ASK_EVERY`], each live member that has not answered this node's census
    /// of its ring yet, all at once; counts the answers. Runs until the process ends.
    pub(super) async fn take_census(self: Arc<Self>) {
        let clock = SystemClock::new();
        let mut ticks = tokio::time::interval(ASK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.note_handovers();
            self.note_joined();
            let missing = self.owner.unanswered();
            if missing.is_empty() {
                continue;
            }
            let fingerprint = self.owner.fingerprint();
            let (transport, me) = (self.transport.inner(), self.node_id.as_str());
            let asks = missing.iter().map(|member| async move {
                let asked = transport.census(member, me, fingerprint);
                match tokio::time::timeout(ANSWER_WITHIN, asked).await {
                    Ok(Ok(Some(answer))) => Some((member, answer)),
                    _ => None,
                }
            });
            for (member, answer) in futures_util::future::join_all(asks)
                .await
                .into_iter()
                .flatten()
            {
                self.owner.counted(member, &answer, clock.now());
            }
            self.note_handovers();
            self.note_joined();
        }
    }

    /// Notes that this node has joined once it runs the cluster's ring: one with another
    /// member in it, that every live member has answered this node's census on — so the
    /// members run the same ring, and none is missing from it — or that has held unchanged
    /// for [`AGREE_WITHIN`].
    ///
    /// A node started without seeds that was in a cluster before waits for the others to find
    /// it for [`CATCH_UP_WITHIN`](super::policies::CATCH_UP_WITHIN) at most, then serves
    /// alone: its old members may be gone for good.
    fn note_joined(&self) {
        if *self.joined.borrow() {
            return;
        }
        if self.ring.load().members().len() < 2 {
            if self.seeds.is_empty() && self.started.elapsed() >= super::policies::CATCH_UP_WITHIN {
                tracing::warn!(
                    "serving alone: none of the members this node had before has found it within {} s",
                    super::policies::CATCH_UP_WITHIN.as_secs()
                );
                self.joined.send_replace(true);
            }
            return;
        }
        let held = self.owner.ring_unchanged_for(SystemClock::new().now());
        if self.owner.handed_over() || held >= AGREE_WITHIN {
            self.joined.send_replace(true);
        }
    }

    /// Notes whether a handover may still be on the way — some member has not answered this
    /// node's census of its ring, and the ring is younger than [`super::HANDOVER_HOLD`] (past
    /// that, no bucket is held for one) — for
    /// [`awaiting_handover`](Self::awaiting_handover) to read without a lock.
    pub(super) fn note_handovers(&self) {
        let young = self.owner.ring_unchanged_for(SystemClock::new().now()) < super::HANDOVER_HOLD;
        self.handovers_pending
            .store(young && !self.owner.handed_over(), Ordering::Release);
    }

    /// At the start, before the policy log opens its file: how this node's previous run in
    /// `data_dir` ended — none (the log's file is not there), a clean stop (the mark is there)
    /// or a crash. The mark is taken, so that the next crash shows.
    pub(super) fn previous_run(data_dir: &std::path::Path) -> PreviousRun {
        let mark = data_dir.join(STOPPED_CLEANLY);
        let ran_before = data_dir.join(crate::policy_log::store::FILE).exists();
        let clean = std::fs::remove_file(&mark).is_ok();
        match (ran_before, clean) {
            (false, _) => PreviousRun::None,
            (true, true) => PreviousRun::Clean,
            (true, false) => PreviousRun::Crashed,
        }
    }

    /// At a clean stop: leaves the mark [`previous_run`](Self::previous_run) looks for.
    pub(super) fn mark_stopped_cleanly(&self) {
        let mark = self.data_dir.join(STOPPED_CLEANLY);
        if let Err(e) = std::fs::write(&mark, b"") {
            tracing::warn!(path = %mark.display(), "could not mark a clean stop: {e}; the next start counts as after a crash");
        }
    }
}
