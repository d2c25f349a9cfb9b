//! Whether this node hears from a majority of the cluster: the fence against a partition.
//!
//! In a partition each side sees the other as departed, and the ring of each side hands the
//! other side's buckets to someone on its own. [`Tenure`](crate::tenure) keeps a new owner from
//! granting before the old owner's leases have expired — but the old owner, on the other side,
//! still grants and renews. So an owner grants and renews a fenced (`closed`) lease only while
//! it has *heard recently* from a strict majority of the cluster's members, itself included; at
//! most one side of a partition can.
//!
//! *Heard recently* is measured on this node's clock: a member counts while its gossip
//! heartbeat has gone up within the last `window`. That bounds how long a cut-off owner goes on
//! granting — `window` after the last word it had from the others — independently of when
//! anyone's failure detector concludes; a node taking over one of its buckets waits
//! `lease_ttl + margin()` (see [`Quorum::margin`]), so that every lease the cut-off owner
//! granted or renewed has expired by then.
//!
//! The cluster's members are those gossip knows, live or departed (departed ones are
//! remembered for an hour): a member that left still counts, or two halves of a cluster could
//! each call themselves a majority of what they see. A node started with seeds to join
//! assumes at least one other member before it has heard any.
//!
//! Pure logic: time comes in as an argument.

use std::collections::HashMap;
use std::sync::Mutex;

use std::time::Duration;

use weir::Nanos;

/// How long a member counts after its heartbeat last went up, by default (3 s: gossip beats
/// every 200 ms, so a live member is heard a dozen times in it).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3);

/// Added to the window in [`Quorum::margin`]: the time gossip may take to arrive.
const DELIVERY_SLACK: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Heard {
    beat: u128,
    at: Nanos,
}

#[derive(Debug, Default)]
struct State {
    /// Other members: their highest beat seen and when it last went up.
    others: HashMap<String, Heard>,
}

/// What this node has heard from the cluster's members; see the [module docs](self).
#[derive(Debug)]
pub struct Quorum {
    node_id: String,
    /// The window in ns.
    window_ns: u64,
    window: Duration,
    /// The fewest members to assume (2 for a node that joins through seeds).
    least_known: usize,
    state: Mutex<State>,
}

/// The majority check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Majority {
    /// Members heard within the window, this node included.
    pub heard: usize,
    /// Members known.
    pub known: usize,
}

impl Majority {
    /// Whether `heard` is a strict majority of `known`.
    pub fn holds(self) -> bool {
        self.heard * 2 > self.known
    }
}

impl Quorum {
    /// The quorum of node `node_id`, counting a member for `window` ns after its heartbeat went
    /// up; `joins` when it was started with seeds to join through.
    pub fn new(node_id: &str, window: Duration, joins: bool) -> Self {
        Quorum {
            node_id: node_id.to_owned(),
            window_ns: weir::clock::duration_to_nanos(window),
            window,
            least_known: if joins { 2 } else { 1 },
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records every member gossip knows at `now`, each with its *beat*: anything that goes up
    /// while the member lives (gossip's generation and heartbeat, in that order). This node's own
    /// entry is ignored: it always hears itself. A member whose beat went up since the last look
    /// was heard at `now`; a member seen for the first time was heard at `now` too; a member
    /// gossip no longer knows (deleted after its grace period) is forgotten.
    pub fn observe<'a>(&self, members: impl IntoIterator<Item = (&'a str, u128)>, now: Nanos) {
        let mut state = self.lock();
        let mut known = std::collections::HashSet::new();
        for (id, beat) in members {
            known.insert(id);
            if id == self.node_id {
                continue;
            }
            let heard = state
                .others
                .entry(id.to_owned())
                .or_insert(Heard { beat, at: now });
            if beat > heard.beat {
                *heard = Heard { beat, at: now };
            }
        }
        state.others.retain(|id, _| known.contains(id.as_str()));
    }

    /// Who was heard within the window before `now`, out of how many members.
    pub fn majority(&self, now: Nanos) -> Majority {
        let state = self.lock();
        let heard = 1 + state
            .others
            .values()
            .filter(|h| now.saturating_sub(h.at) <= self.window_ns)
            .count();
        Majority {
            heard,
            known: (1 + state.others.len()).max(self.least_known),
        }
    }

    /// How much longer than a lease TTL a node taking over a bucket must wait: the window plus
    /// the time gossip may take to arrive.
    pub fn margin(&self) -> Duration {
        self.window.saturating_add(DELIVERY_SLACK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn a_node_alone_is_its_own_majority_unless_it_came_to_join() {
        let alone = Quorum::new("a", Duration::from_secs(3), false);
        assert!(alone.majority(0).holds());
        let joining = Quorum::new("a", Duration::from_secs(3), true);
        assert_eq!(joining.majority(0), Majority { heard: 1, known: 2 });
        assert!(!joining.majority(0).holds());
    }

    #[test]
    fn a_member_counts_for_the_window_after_its_heartbeat_went_up() {
        let q = Quorum::new("a", Duration::from_secs(3), false);
        q.observe([("a", 7), ("b", 10), ("c", 10)], 0);
        assert_eq!(q.majority(0), Majority { heard: 3, known: 3 });
        // c keeps beating, b goes silent (but is still known).
        q.observe([("b", 10), ("c", 11)], S);
        q.observe([("b", 10), ("c", 12)], 2 * S);
        assert_eq!(q.majority(3 * S), Majority { heard: 3, known: 3 });
        assert_eq!(q.majority(3 * S + 1), Majority { heard: 2, known: 3 });
        assert!(q.majority(3 * S + 1).holds());
        // Now c too: a alone is no majority of three, however long it waits.
        assert_eq!(q.majority(5 * S + 1), Majority { heard: 1, known: 3 });
        assert!(!q.majority(60 * S).holds());
        // A heartbeat that did not go up is not news.
        q.observe([("b", 10), ("c", 12)], 61 * S);
        assert!(!q.majority(61 * S).holds());
        q.observe([("b", 11), ("c", 12)], 62 * S);
        assert!(q.majority(62 * S).holds());
    }

    #[test]
    fn two_halves_of_four_are_neither_a_majority() {
        let q = Quorum::new("a", Duration::from_secs(3), false);
        q.observe([("b", 1), ("c", 1), ("d", 1)], 0);
        q.observe([("b", 2), ("c", 1), ("d", 1)], 2 * S);
        assert_eq!(q.majority(4 * S), Majority { heard: 2, known: 4 });
        assert!(!q.majority(4 * S).holds(), "2 of 4 is not a majority");
        // d is deleted from gossip after its grace period: forgotten.
        q.observe([("b", 2), ("c", 1)], 4 * S);
        assert!(q.majority(4 * S).holds(), "2 of 3 is");
    }

    #[test]
    fn no_look_for_a_while_is_no_majority() {
        // The poller stopped (a pause): the check at grant time sees how old the news is.
        let q = Quorum::new("a", Duration::from_secs(3), false);
        q.observe([("b", 1), ("c", 1)], 0);
        assert!(q.majority(3 * S).holds());
        assert!(!q.majority(12 * S).holds());
        assert_eq!(q.margin(), Duration::from_secs(4));
    }
}
