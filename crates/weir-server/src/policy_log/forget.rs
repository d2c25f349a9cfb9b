//! Voters gone for good: forgotten by the leader once unseen for `forget_after`, or at once by
//! an operator (`DELETE /v1/cluster/members/{id}`, `weir cluster forget`).
//!
//! Gossip cannot tell a member that stopped for good from one that is paused or cut off, so a
//! member that vanishes stays a voter and counts in the majority. Lose one member of three for
//! good, add a fourth, lose a second: two healthy members of four voters, and every change is
//! refused with no way out but starting an empty process under the dead one's id. So every
//! member notes when it last saw each member alive ([`Sightings`]); the leader removes a voter
//! unseen for `forget_after` (one change at a time, as it adds them), and an operator may
//! remove one at once. Neither removes a member gossip sees alive, nor one whose removal would
//! leave the live voters without a majority of the voters that remain. A member forgotten that
//! comes back is a live member like any other: the leader makes it a voter again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};
use weir_api::http::PolicyLogVoter;
use weir_cluster::membership::NodeInfo;

use super::network::call;
use super::{COMMIT_WITHIN, FORWARD_WITHIN, PolicyLog, id_of};

/// When each member was last seen alive, as this member watched gossip.
#[derive(Debug, Default)]
pub struct Sightings {
    inner: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// When this member began watching: a voter never seen since is unseen from then.
    since: Option<Instant>,
    /// By log id: the member's node id and when it was last alive.
    last: HashMap<u64, (String, Instant)>,
}

impl Sightings {
    /// Notes the members `live` as alive at `now`.
    pub fn saw(&self, live: &[NodeInfo], now: Instant) {
        let mut seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        seen.since.get_or_insert(now);
        for member in live {
            seen.last
                .insert(id_of(&member.id), (member.id.clone(), now));
        }
    }

    /// How long the member with log id `id` has gone unseen at `now` (since this member began
    /// watching, if it never saw it).
    pub fn unseen_for(&self, id: u64, now: Instant) -> Duration {
        let seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let last = seen.last.get(&id).map(|(_, at)| *at).or(seen.since);
        last.map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    /// The node id of the member with log id `id`, if it was ever seen.
    pub fn name_of(&self, id: u64) -> Option<String> {
        let seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        seen.last.get(&id).map(|(name, _)| name.clone())
    }
}

impl PolicyLog {
    /// Sets how long a voter may go unseen before the leader forgets it (`None`: never).
    pub fn forget_unseen_after(&self, after: Option<Duration>) {
        let ms = after.map_or(0, |after| (after.as_millis() as u64).max(1));
        self.forget_after_ms.store(ms, Ordering::Relaxed);
    }

    fn forget_after(&self) -> Option<Duration> {
        match self.forget_after_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// As the leader, with nothing else to change: forgets the voter unseen longest, once it
    /// has been unseen for `forget_after` (module docs).
    pub(super) async fn forget_unseen(&self, live: &[NodeInfo]) {
        let Some(after) = self.forget_after() else {
            return;
        };
        let voters = self.voter_ids();
        let live: BTreeSet<u64> = live.iter().map(|member| id_of(&member.id)).collect();
        let now = Instant::now();
        let unseen_for = |id| self.sightings.unseen_for(id, now);
        let Some(id) = voter_to_forget(&voters, &live, unseen_for, after) else {
            return;
        };
        let member = self.name_of_voter(id);
        let unseen_s = unseen_for(id).as_secs();
        match self.remove_voter(&voters, id).await {
            Ok(()) => tracing::warn!(
                %member,
                unseen_s,
                "forgot a voter of the policy log unseen for longer than `forget_after`: it no longer counts in the majority (back, it is made a voter again)"
            ),
            Err(error) => {
                tracing::warn!(%member, %error, "could not forget a voter unseen for longer than `forget_after`")
            }
        }
    }

    /// Forgets voter `node` now (an operator's command), through the leader wherever it is;
    /// the voters left, by node id.
    pub async fn forget(&self, node: &str) -> Result<Vec<String>, ForgetRefusal> {
        match self.leader() {
            Some(leader) if leader == self.address => self.forget_here(node).await,
            Some(leader) => call(&self.peers, &leader, FORWARD_WITHIN, &node, |c, r| {
                Box::pin(c.forget(r))
            })
            .await
            .unwrap_or_else(|error| Err(ForgetRefusal::NoLeader(error.to_string()))),
            None => Err(ForgetRefusal::NoLeader("no leader elected".to_owned())),
        }
    }

    /// [`forget`](Self::forget), on the leader.
    pub async fn forget_here(&self, node: &str) -> Result<Vec<String>, ForgetRefusal> {
        if !self.raft().metrics().borrow().state.is_leader() {
            return Err(ForgetRefusal::NoLeader(
                "the member asked does not lead the policy log (the leader moved)".to_owned(),
            ));
        }
        let voters = self.voter_ids();
        let id = id_of(node);
        if !voters.contains(&id) {
            let names: Vec<String> = voters.iter().map(|id| self.name_of_voter(*id)).collect();
            return Err(ForgetRefusal::NotAVoter(node.to_owned(), names.join(", ")));
        }
        let live = self.live_ids();
        if live.contains(&id) {
            return Err(ForgetRefusal::Alive(node.to_owned()));
        }
        if !keeps_majority(&voters, &live, id) {
            return Err(ForgetRefusal::WouldLoseMajority(node.to_owned()));
        }
        self.remove_voter(&voters, id)
            .await
            .map_err(ForgetRefusal::NoLeader)?;
        tracing::warn!(
            member = node,
            "forgot a voter of the policy log at an operator's command"
        );
        Ok(self
            .voter_ids()
            .into_iter()
            .map(|id| self.name_of_voter(id))
            .collect())
    }

    /// Removes voter `id` of `voters`, committed by the remaining majority.
    async fn remove_voter(&self, voters: &BTreeSet<u64>, id: u64) -> Result<(), String> {
        let mut next = voters.clone();
        next.remove(&id);
        let raft = self.raft();
        let changed = raft.change_membership(ChangeMembers::ReplaceAllVoters(next), false);
        match tokio::time::timeout(COMMIT_WITHIN, changed).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!(
                "not committed within {} ms",
                COMMIT_WITHIN.as_millis()
            )),
        }
    }

    /// The voters' log ids.
    pub(super) fn voter_ids(&self) -> BTreeSet<u64> {
        self.raft()
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// The log ids of the members gossip sees alive.
    fn live_ids(&self) -> BTreeSet<u64> {
        self.live.get().map_or_else(BTreeSet::new, |live| {
            live.borrow()
                .iter()
                .map(|member| id_of(&member.id))
                .collect()
        })
    }

    /// A voter's node id as last seen, else its address in the log.
    fn name_of_voter(&self, id: u64) -> String {
        self.sightings.name_of(id).unwrap_or_else(|| {
            self.raft()
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&id)
                .map_or_else(|| id.to_string(), |node| node.addr.clone())
        })
    }

    /// The address the log knows voter `name` by (its gRPC address), if it is a voter.
    pub fn voter_address(&self, name: &str) -> Option<String> {
        let membership = self.raft().metrics().borrow().membership_config.clone();
        membership
            .membership()
            .get_node(&id_of(name))
            .map(|node| node.addr.clone())
    }

    /// Every voter with its state as this member sees it: `alive` (gossip sees it),
    /// `suspect` (unseen, for less than `forget_after`), `gone` (unseen for longer: the leader
    /// forgets it unless the live voters would lose their majority).
    pub fn voter_states(&self) -> Vec<PolicyLogVoter> {
        let live = self.live_ids();
        let now = Instant::now();
        let after = self.forget_after();
        self.voter_ids()
            .into_iter()
            .map(|id| {
                let unseen = self.sightings.unseen_for(id, now);
                let state = match (live.contains(&id), after) {
                    (true, _) => "alive",
                    (false, Some(after)) if unseen >= after => "gone",
                    (false, _) => "suspect",
                };
                PolicyLogVoter {
                    id: self.name_of_voter(id),
                    state: state.to_owned(),
                    unseen_for_ms: (!live.contains(&id)).then_some(unseen.as_millis() as u64),
                }
            })
            .collect()
    }
}

/// Why a voter was not forgotten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ForgetRefusal {
    /// Gossip sees it alive: it is not gone.
    #[error(
        "member `{0}` is alive (gossip sees it): only a member gone for good is forgotten; stop it first, or let it leave with SIGTERM"
    )]
    Alive(String),
    /// Not a voter of the policy log.
    #[error("member `{0}` is not a voter of the cluster's policy log (its voters: {1})")]
    NotAVoter(String, String),
    /// Removing it would leave the live voters short of a majority.
    #[error(
        "forgetting member `{0}` would leave the live voters without a majority of the voters that remain"
    )]
    WouldLoseMajority(String),
    /// No leader could make the change.
    #[error("the policy log's voters could not be changed: {0}")]
    NoLeader(String),
}

/// The voter the leader forgets now, if any: of the voters not `live`, the one unseen longest,
/// if that is at least `forget_after` and the live voters keep a majority without it.
pub fn voter_to_forget(
    voters: &BTreeSet<u64>,
    live: &BTreeSet<u64>,
    unseen_for: impl Fn(u64) -> Duration,
    forget_after: Duration,
) -> Option<u64> {
    let (_, id) = voters
        .iter()
        .filter(|id| !live.contains(id))
        .map(|&id| (unseen_for(id), id))
        .filter(|(unseen, _)| *unseen >= forget_after)
        .max()?;
    keeps_majority(voters, live, id).then_some(id)
}

/// Whether the live voters are a majority of `voters` without `id`.
pub fn keeps_majority(voters: &BTreeSet<u64>, live: &BTreeSet<u64>, id: u64) -> bool {
    let remaining = voters.iter().filter(|v| **v != id).count();
    let live_remaining = voters
        .iter()
        .filter(|v| **v != id && live.contains(v))
        .count();
    remaining > 0 && live_remaining * 2 > remaining
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_voter_unseen_long_enough_is_forgotten_the_longest_first() {
        let unseen = |id| {
            Duration::from_secs(match id {
                3 => 700,
                4 => 900,
                _ => 0,
            })
        };
        let ten_minutes = Duration::from_secs(600);
        // Five voters, two gone: the one unseen longer goes first.
        assert_eq!(
            voter_to_forget(
                &set(&[1, 2, 3, 4, 5]),
                &set(&[1, 2, 5]),
                unseen,
                ten_minutes
            ),
            Some(4)
        );
        // Not long enough yet.
        assert_eq!(
            voter_to_forget(
                &set(&[1, 2, 3]),
                &set(&[1, 2]),
                unseen,
                Duration::from_secs(800)
            ),
            None
        );
        // Everyone alive.
        assert_eq!(
            voter_to_forget(&set(&[1, 2, 3]), &set(&[1, 2, 3]), unseen, ten_minutes),
            None
        );
    }

    #[test]
    fn a_voter_is_not_forgotten_when_the_live_would_not_be_a_majority() {
        let long = |_| Duration::from_secs(3600);
        // Four voters, one live (a leader could not be here, but the rule holds alone).
        assert!(!keeps_majority(&set(&[1, 2, 3, 4]), &set(&[1]), 4));
        assert_eq!(
            voter_to_forget(&set(&[1, 2, 3, 4]), &set(&[1]), long, Duration::ZERO),
            None
        );
        // Three voters, two live: forgetting the third leaves two of two.
        assert!(keeps_majority(&set(&[1, 2, 3]), &set(&[1, 2]), 3));
        // The last voter is never forgotten.
        assert!(!keeps_majority(&set(&[1]), &set(&[]), 1));
    }

    #[test]
    fn a_member_never_seen_is_unseen_from_when_watching_began() {
        let sightings = Sightings::default();
        let t0 = Instant::now();
        let alive = NodeInfo {
            id: "n1".to_owned(),
            grpc: "http://127.0.0.1:1".to_owned(),
            protocol: 1,
            newest: 1,
            owner: true,
        };
        sightings.saw(std::slice::from_ref(&alive), t0);
        let later = t0 + Duration::from_secs(30);
        assert_eq!(
            sightings.unseen_for(id_of("n1"), later),
            Duration::from_secs(30)
        );
        assert_eq!(
            sightings.unseen_for(id_of("n9"), later),
            Duration::from_secs(30)
        );
        sightings.saw(std::slice::from_ref(&alive), later);
        assert_eq!(sightings.unseen_for(id_of("n1"), later), Duration::ZERO);
        assert_eq!(sightings.name_of(id_of("n1")).as_deref(), Some("n1"));
        assert_eq!(sightings.name_of(id_of("n9")), None);
    }
}
