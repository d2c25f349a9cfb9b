//! A new owner's census: instead of waiting out one lease TTL after the ring gives it
//! buckets, the owner asks every live member what it holds there, and grants once all have
//! answered.
//!
//! [`Tenure`](crate::tenure) makes a new owner of a `closed` policy's bucket wait
//! `lease_ttl + margin` so that every lease nobody handed over has expired. Most ring changes
//! are planned, though — a node joins, a node leaves gracefully, a rolling restart — and then
//! every holder is alive and can simply say what it holds. So, while its ring is young, an
//! owner asks each live member (the `Census` call): *"are you on my ring, have you handed
//! over what the change moved, and what do you still hold for my buckets?"* A member answers
//! only once it runs the same ring (its [`Ring::fingerprint`](crate::ring::Ring::fingerprint))
//! and its handoff for that ring has run; its answer lists every lease and loan it holds for
//! the asker's buckets, and the asker counts those it does not know (a handoff that failed, a
//! lease granted by the asker's previous process) until they expire.
//!
//! Holders that cannot answer are the danger: a crashed or paused node whose requests still
//! run on their permits. A member that is live but silent keeps the census open (the TTL fence
//! decides). A member that *departed* without stepping down first (a crash, a pause long
//! enough for the failure detector, a partition) is an *unclean departure*; every member
//! reports how long ago it last saw one and how long it has been awake itself. The census is
//! settled — the owner may grant before its tenure is long enough — only when:
//!
//! - every member live in the owner's view has answered on the owner's current ring;
//! - neither the owner nor any member that answered has seen an unclean departure within the
//!   window (`lease_ttl + margin`): a departed holder's leases have expired by then;
//! - someone — the owner or a member that answered — has been awake for the whole window, so
//!   that the window was watched (a whole cluster restarted has not been: it waits out its
//!   tenure, because a paused member of the cluster before could still hold leases) — or every
//!   one of them is on its first run: its data dir held no run of its own, so no lease can
//!   predate the cluster (a cluster deployed for the first time grants at once).
//!
//! A member that departs cleanly — it stepped down as an owner first, answered on the ring
//! without it, and drained — leaves nothing uncounted: its leases were handed over or listed.
//!
//! Pure logic: time comes in as an argument; the census calls are the server's.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use weir::Nanos;

/// What a member has seen of the cluster, as of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    /// How long it has run without a pause of its own.
    pub awake: Duration,
    /// How long ago it last saw a member depart without stepping down; `None`: never.
    pub unclean_departure: Option<Duration>,
    /// Its data dir held no run of its own before this process: nothing it granted or held
    /// can predate it.
    pub first_run: bool,
}

impl Quiet {
    /// Whether nothing this member saw stands in the way of granting leases of `window`: no
    /// unclean departure within it.
    fn is_quiet_for(&self, window: Duration) -> bool {
        self.unclean_departure.is_none_or(|ago| ago >= window)
    }
}

/// What one member holds on one bucket, as it says in its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The bucket.
    pub bucket: String,
    /// The owner the holder has it from (it may not be the asker: a handoff that failed).
    pub owner: String,
    /// Its id on that owner.
    pub id: u64,
    /// The units it counts for (a loan's whole size: the holder may take any of them without a
    /// call).
    pub units: u64,
    /// How long it still lives.
    pub remaining: Duration,
}

/// A member's answer to the census.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The fingerprint of the ring the member runs.
    pub fingerprint: u64,
    /// What it has seen.
    pub quiet: Quiet,
    /// What it holds for the asker's buckets.
    pub held: Vec<Held>,
}

/// How a member answers others' census: the server's, which knows the ring this node runs,
/// whether its handoff for it has run, and what its coordinators hold.
pub trait CensusAnswers: Send + Sync {
    /// This node's answer to `owner`, which runs the ring `fingerprint`; `None` while this node
    /// runs another ring or has not handed over for it yet.
    fn answer(&self, owner: &str, fingerprint: u64) -> Option<Answer>;
}

/// One owner's census of its current ring; see the [module docs](self).
#[derive(Debug, Default)]
pub struct Census {
    /// The ring counted.
    fingerprint: u64,
    /// The members expected to answer on it (the owner aside).
    expected: BTreeSet<String>,
    /// Who has answered on it, with what they had seen.
    answered: HashMap<String, Quiet>,
    /// When this node last saw a member depart without stepping down.
    unclean_at: Option<Nanos>,
    /// This process is its node's first run.
    first_run: bool,
}

impl Census {
    /// An empty census: nothing expected, nothing answered.
    pub fn new() -> Self {
        Census::default()
    }

    /// The ring in force is `fingerprint` and `live` are the members to hear from (this node
    /// among them or not). A new ring starts the count over; the same ring keeps the answers.
    pub fn expect(&mut self, fingerprint: u64, live: impl IntoIterator<Item = String>) {
        if fingerprint != self.fingerprint {
            self.fingerprint = fingerprint;
            self.answered.clear();
        }
        self.expected = live.into_iter().collect();
    }

    /// This process is its node's first run: its data dir held no run of its own.
    pub fn first_run(&mut self) {
        self.first_run = true;
    }

    /// This node saw a member depart at `now`; `stepped_down`: it had stopped owning first.
    pub fn departed(&mut self, stepped_down: bool, now: Nanos) {
        if !stepped_down {
            self.unclean_at = Some(self.unclean_at.map_or(now, |at| at.max(now)));
        }
    }

    /// What this node has seen, as of `now`, having been awake since `awake_since`.
    pub fn quiet(&self, awake_since: Nanos, now: Nanos) -> Quiet {
        Quiet {
            awake: Duration::from_nanos(now.saturating_sub(awake_since)),
            // Reported even from before a pause: what it saw stays true.
            unclean_departure: self
                .unclean_at
                .map(|at| Duration::from_nanos(now.saturating_sub(at))),
            first_run: self.first_run,
        }
    }

    /// Records `member`'s answer; false (and nothing recorded) if it answered on another ring
    /// than the one counted, or has answered on it already.
    pub fn answer(&mut self, member: &str, fingerprint: u64, quiet: Quiet) -> bool {
        if fingerprint != self.fingerprint || self.answered.contains_key(member) {
            return false;
        }
        self.answered.insert(member.to_owned(), quiet);
        true
    }

    /// The members expected on `fingerprint` that have not answered yet, `me` aside (all of
    /// them if the census counts another ring).
    pub fn missing(&self, fingerprint: u64, me: &str) -> Vec<String> {
        self.expected
            .iter()
            .filter(|m| *m != me)
            .filter(|m| fingerprint != self.fingerprint || !self.answered.contains_key(*m))
            .cloned()
            .collect()
    }

    /// Whether every member expected on `fingerprint` has answered on it, `me` aside: each has
    /// handed over what that ring moved to `me`.
    pub fn answered_all(&self, me: &str, fingerprint: u64) -> bool {
        fingerprint == self.fingerprint && self.missing(fingerprint, me).is_empty()
    }

    /// Whether node `me`, running ring `fingerprint` and having seen `own`, may grant leases
    /// of `window` (a TTL plus the margin) now: see the [module docs](self).
    pub fn settled(&self, me: &str, fingerprint: u64, own: Quiet, window: Duration) -> bool {
        if !self.answered_all(me, fingerprint) {
            return false;
        }
        let answers = || {
            self.expected
                .iter()
                .filter(|m| *m != me)
                .filter_map(|m| self.answered.get(m))
        };
        let everyone = || std::iter::once(&own).chain(answers());
        own.is_quiet_for(window)
            && answers().all(|quiet| quiet.is_quiet_for(window))
            && (everyone().any(|quiet| quiet.awake >= window)
                || everyone().all(|quiet| quiet.first_run))
    }
}

#[cfg(test)]
mod tests;
