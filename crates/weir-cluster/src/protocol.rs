//! Which version of the cluster protocol a cluster of mixed releases speaks.
//!
//! Each release speaks a range of versions ([`Speaks`]): the newest it was written for, and
//! the older ones it still understands, so that a rolling upgrade can pass through it. A member
//! advertises in gossip the version it speaks *now* (covered by its proof, with the rest of what
//! places it on the ring) and the newest it could speak. Each member speaks the newest version
//! that every member it shares a version with can speak: while one member of an older release
//! is up, every member speaks that release's version, so the cluster stays one ring and every
//! bucket has one owner through the mixed window; once the last such member is gone, each
//! raises its version. A member is on this node's ring while this node understands the
//! version it speaks — not only while it speaks the same one — so the moments in which members
//! raise their versions one after another move no bucket.
//!
//! A release whose oldest version is newer than another's newest cannot share a ring with it:
//! upgrade through each release in turn (`docs/deployment.md`, "Upgrades and rollbacks").
//! Releases before this negotiation advertise one version and place on their ring only members
//! speaking exactly it; a newer release speaks that version to them while they are up.
//!
//! Pure logic: the versions come in as arguments; gossip is [`membership`](crate::membership)'s.

/// The versions of the cluster protocol one release speaks, oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speaks {
    /// The oldest it understands.
    pub oldest: u32,
    /// The newest, which it speaks among members that all speak it too.
    pub newest: u32,
}

impl Speaks {
    /// Only `version`.
    pub const fn only(version: u32) -> Self {
        Speaks {
            oldest: version,
            newest: version,
        }
    }

    /// Whether a member speaking `version` can be understood (and placed on the ring).
    pub fn understands(&self, version: u32) -> bool {
        (self.oldest..=self.newest).contains(&version)
    }

    /// The version to speak among members whose newest versions are `newest` (this node's own
    /// among them or not): the newest all of them can speak, within this release's range.
    /// Members this release shares no version with are not counted: they are on no ring of
    /// this release's, and it cannot speak down to them.
    pub fn among(&self, newest: impl IntoIterator<Item = u32>) -> u32 {
        newest
            .into_iter()
            .filter(|&theirs| theirs >= self.oldest)
            .fold(self.newest, u32::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_cluster_speaks_the_newest_version_every_member_speaks() {
        let next = Speaks {
            oldest: 3,
            newest: 4,
        };
        // Alone, or among its own release: its newest.
        assert_eq!(next.among([4]), 4);
        assert_eq!(next.among([4, 4, 4]), 4);
        // A member of the previous release up: that release's version, for everyone.
        assert_eq!(next.among([4, 3, 4]), 3);
        // A release it shares no version with is not spoken down to.
        assert_eq!(next.among([4, 2]), 4);
        // A newer release than itself: its own newest.
        assert_eq!(next.among([5, 4]), 4);
    }

    #[test]
    fn a_member_is_understood_within_the_release_s_range() {
        let next = Speaks {
            oldest: 3,
            newest: 4,
        };
        assert!(next.understands(3) && next.understands(4));
        assert!(!next.understands(2) && !next.understands(5));
        assert!(Speaks::only(3).understands(3));
        assert!(!Speaks::only(3).understands(4));
    }
}
