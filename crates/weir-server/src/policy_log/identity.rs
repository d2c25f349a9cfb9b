//! Which cluster a policy log belongs to.
//!
//! Raft's safety rests on log matching: two logs with an entry at the same term and index hold
//! the same entries up to it. Logs of two clusters both start at term 1, index 1, so a data dir
//! copied (or restored) from another cluster onto a member matches nothing yet looks as if it
//! did: the member would keep a foreign policy for ever, silently. So each log has an identity,
//! 128 random bits minted by the member that starts it (or, for a log from before identities,
//! by the first leader that has none), kept in `raft.redb`, carried by every call between
//! members and advertised in gossip:
//!
//! - a member with no identity yet (a new one, or one from before identities) takes the one
//!   its leader's calls carry;
//! - a member whose identity differs from a call's refuses the call;
//! - a member whose identity no other member advertises, while others advertise one, holds
//!   another cluster's log: it stops, naming its data dir (see `cluster::policies`).

use std::sync::RwLock;

/// The call metadata that carries the sender's identity.
pub const HEADER: &str = "weir-policy-log";

/// Its record in the log's store.
pub(super) const RECORD: &str = "cluster";

/// This member's identity, once known.
#[derive(Debug, Default)]
pub struct Identity {
    id: RwLock<Option<String>>,
}

impl Identity {
    /// An identity of `id`, if known.
    pub fn new(id: Option<String>) -> Self {
        Identity {
            id: RwLock::new(id),
        }
    }

    /// The identity, once known.
    pub fn get(&self) -> Option<String> {
        self.id.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets it (the caller keeps it durably first).
    pub fn set(&self, id: String) {
        *self.id.write().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }
}

/// A new identity: 128 random bits, in hex.
pub fn mint() -> String {
    use rand::{Rng, SeedableRng};
    format!(
        "{:032x}",
        rand::rngs::StdRng::from_os_rng().random::<u128>()
    )
}

/// What a call carrying `theirs` is to a member whose identity is `ours`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same log, or a sender that says nothing (a member from before identities).
    Same,
    /// This member has none yet: it takes the sender's, if the sender leads.
    Take(String),
    /// Another cluster's log.
    Foreign {
        /// This member's.
        ours: String,
        /// The sender's.
        theirs: String,
    },
}

/// Judges a call carrying `theirs` at a member whose identity is `ours`.
pub fn judge(ours: Option<&str>, theirs: Option<&str>) -> Verdict {
    match (ours, theirs) {
        (_, None) => Verdict::Same,
        (None, Some(theirs)) => Verdict::Take(theirs.to_owned()),
        (Some(ours), Some(theirs)) if ours == theirs => Verdict::Same,
        (Some(ours), Some(theirs)) => Verdict::Foreign {
            ours: ours.to_owned(),
            theirs: theirs.to_owned(),
        },
    }
}

/// Whether this member, of identity `ours`, holds another cluster's log, from what the other
/// members advertise: `Some(theirs)` when others advertise an identity and none advertises
/// this member's.
pub fn foreign_among<'a>(ours: &str, others: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut theirs = None;
    for other in others {
        if other == ours {
            return None;
        }
        theirs.get_or_insert_with(|| other.to_owned());
    }
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_member_takes_its_leaders_identity_and_a_different_one_is_foreign() {
        assert_eq!(judge(None, Some("a")), Verdict::Take("a".into()));
        assert_eq!(judge(Some("a"), Some("a")), Verdict::Same);
        assert_eq!(
            judge(Some("a"), None),
            Verdict::Same,
            "an older member says nothing"
        );
        assert_eq!(
            judge(Some("a"), Some("b")),
            Verdict::Foreign {
                ours: "a".into(),
                theirs: "b".into()
            }
        );
        assert_ne!(mint(), mint());
        assert_eq!(mint().len(), 32);
    }

    #[test]
    fn a_member_is_foreign_only_when_no_other_shares_its_log() {
        assert_eq!(foreign_among("b", ["a", "a"]), Some("a".into()));
        assert_eq!(foreign_among("a", ["a", "b"]), None, "one other shares it");
        assert_eq!(foreign_among("a", []), None, "nobody to compare with");
    }
}
