//! Who votes in the policy log: gossip's live members, as its leader sees them.
//!
//! The log is started, with this member alone in it, by the member whose node id is the least
//! of the live members it sees — once it has joined (at once for a member started without
//! seeds) and has listened for a second — unless a live member already has a log (so a member
//! restarted on an empty data dir joins the running log rather than start a second one).
//!
//! From then on the leader, every half second, makes one change at a time: a live member that
//! is not a voter is added (as a learner first, caught up, then a voter); a voter that is
//! stepping down (leaving gracefully) is removed if more than three would remain (a
//! scale-down); a voter whose address changed is updated. A member that stops without a word
//! stays a voter — gossip cannot tell it from a paused or cut-off one — so it still counts in
//! the majority: a cluster of three keeps taking changes with one member down, not two —
//! until it has been unseen for `forget_after`, or an operator forgets it ([`super::forget`]).
//! Each of those is one change too, made when nothing else was to be.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::BasicNode;
use openraft::ChangeMembers;
use tokio::sync::watch;
use weir_cluster::membership::NodeInfo;

use super::change::Change;
use super::identity;
use super::network::call;
use super::{PolicyLog, id_of};
use crate::durable::Overlay;

/// How long the first member listens for a running log before it starts one.
const LISTEN_FIRST: Duration = Duration::from_secs(1);
/// How often the leader looks at the members.
const EVERY: Duration = Duration::from_millis(500);
/// The fewest voters a graceful leave leaves. A cluster of three stopped member by member and
/// started again then elects a leader once any two are back; a smaller count would leave the
/// last member to stop as the only voter, and the log without a leader until that one
/// returns. Keeping three changes nothing the majority needs: two of three either way.
const KEPT_VOTERS: usize = 3;
/// How long a new member has to catch up as a learner before it is made a voter.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(5);

impl PolicyLog {
    /// Follows gossip's `members` (those speaking a version `speaks` understands) until the
    /// process ends: starts the log if this member is the one to (module docs; `seeded`: it was
    /// started with seeds), laying `seed` (its own overlay) in as the cluster's; and while it
    /// leads, keeps the voters in step with the members.
    pub async fn follow_members(
        self: Arc<Self>,
        members: watch::Receiver<Vec<NodeInfo>>,
        speaks: weir_cluster::protocol::Speaks,
        seeded: bool,
        seed: Overlay,
    ) {
        let since = Instant::now();
        let _ = self.live.set(members.clone());
        let mut ticks = tokio::time::interval(EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let live: Vec<NodeInfo> = members
                .borrow()
                .iter()
                .filter(|member| speaks.understands(member.protocol))
                .cloned()
                .collect();
            self.sightings.saw(&live, Instant::now());
            if !self.started().await {
                let joined = !seeded || live.len() > 1;
                let least = live.iter().map(|m| m.id.as_str()).min() == Some(&self.node_id);
                if joined
                    && least
                    && since.elapsed() >= LISTEN_FIRST
                    && !self.another_has_started(&live).await
                {
                    self.start_log(&seed).await;
                }
                continue;
            }
            if self.raft().metrics().borrow().state.is_leader() {
                self.keep_voters(&live).await;
            }
        }
    }

    async fn another_has_started(&self, live: &[NodeInfo]) -> bool {
        for member in live.iter().filter(|m| m.grpc != self.address) {
            let started: Result<bool, _> = call(
                &self.peers,
                &member.grpc,
                Duration::from_secs(1),
                &(),
                |c, r| Box::pin(c.started(r)),
            )
            .await;
            if started.unwrap_or(false) {
                return true;
            }
        }
        false
    }

    async fn start_log(&self, seed: &Overlay) {
        let (id, node) = self.node();
        if let Err(error) = self.raft().initialize(BTreeMap::from([(id, node)])).await {
            tracing::warn!(%error, "could not start the cluster's policy log");
            return;
        }
        // A new log: a new identity, which every member that joins it takes from its leader.
        if let Err(error) = self.keep_identity(identity::mint()) {
            tracing::warn!(%error, "could not keep the policy log's identity");
        }
        tracing::info!("started the cluster's policy log");
        let led = self
            .raft()
            .wait(Some(Duration::from_secs(5)))
            .current_leader(id, "the first member leads")
            .await;
        if led.is_ok() && *seed != Overlay::default() {
            // What this node changed over the API while it ran alone becomes the cluster's.
            if let Err(error) = self
                .propose_here(Change::Seed {
                    overlay: seed.clone(),
                })
                .await
            {
                tracing::warn!(%error, "could not seed the policy log with this node's changes");
            }
        }
    }

    /// One change of voters at most, toward the live members (module docs).
    async fn keep_voters(&self, live: &[NodeInfo]) {
        let metrics = self.raft().metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        if membership.get_joint_config().len() > 1 {
            return;
        }
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        for member in live {
            let id = id_of(&member.id);
            let node = BasicNode::new(member.grpc.clone());
            // `member.owner`: a member that owns buckets, not one leaving (it stepped down).
            let (change, what) = match (member.owner, voters.contains(&id)) {
                (true, false) => {
                    let learned = tokio::time::timeout(
                        CATCH_UP_WITHIN,
                        self.raft().add_learner(id, node, true),
                    )
                    .await;
                    if !matches!(learned, Ok(Ok(_))) {
                        tracing::warn!(member = %member.id, "a new member did not catch up with the policy log in time; trying again");
                        return;
                    }
                    let mut next = voters.clone();
                    next.insert(id);
                    (
                        ChangeMembers::ReplaceAllVoters(next),
                        "a new member votes in the policy log",
                    )
                }
                (true, true) if membership.get_node(&id) != Some(&node) => (
                    ChangeMembers::SetNodes(BTreeMap::from([(id, node)])),
                    "a voter of the policy log is reached at a new address",
                ),
                (false, true) if voters.len() > KEPT_VOTERS => {
                    let mut next = voters.clone();
                    next.remove(&id);
                    (
                        ChangeMembers::ReplaceAllVoters(next),
                        "a leaving member no longer votes in the policy log",
                    )
                }
                _ => continue,
            };
            match self.raft().change_membership(change, false).await {
                Ok(_) => {
                    tracing::info!(member = %member.id, address = %member.grpc, "{what}")
                }
                Err(error) => {
                    tracing::warn!(%error, member = %member.id, "could not change the policy log's voters")
                }
            }
            return;
        }
        self.forget_unseen(live).await;
    }
}
