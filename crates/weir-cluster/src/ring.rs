//! The ownership ring: which node owns a bucket's shared pool.
//!
//! Consistent hashing with virtual nodes. Every node places `vnodes` points on a 64-bit circle
//! (`xxh3(node id # i)`, a fixed, specified hash — never a per-process seeded one, or nodes
//! would disagree); a bucket belongs to the first point at or after `xxh3(bucket)`, wrapping
//! around. Equal points are ordered by node id, so the ring depends only on the *set* of
//! members, never on the order they were learned in. A node joining or leaving moves only the
//! buckets between its points and their predecessors: about `1/N` of them.
//!
//! Only members that may own buckets and speak a protocol version this node understands are
//! placed ([`protocol`](crate::protocol)).
//! [`SharedRing`] publishes a ring atomically so lookups take no lock.

use std::sync::Arc;

use arc_swap::ArcSwap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::protocol::Speaks;

/// The fixed seed of the ring's hash: part of the protocol, the same on every node.
pub const RING_SEED: u64 = 0x5745_4952_5249_4e47; // "WEIRRING"

/// Virtual nodes per member, by default.
pub const DEFAULT_VNODES: u32 = 128;

/// A cluster member as the ring sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The node's id, unique in the cluster.
    pub id: String,
    /// The cluster protocol version it speaks.
    pub protocol: u32,
    /// Whether it may own buckets.
    pub owner: bool,
}

impl Member {
    /// An owner-eligible member speaking `protocol`.
    pub fn owner(id: impl Into<String>, protocol: u32) -> Self {
        Member {
            id: id.into(),
            protocol,
            owner: true,
        }
    }
}

/// A consistent-hash ring over the eligible members; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ring {
    /// Points on the circle, sorted by (hash, member id).
    points: Vec<(u64, u32)>,
    /// The placed members' ids, sorted.
    members: Vec<String>,
}

fn point_hash(id: &str, vnode: u32) -> u64 {
    let mut key = Vec::with_capacity(id.len() + 5);
    key.extend_from_slice(id.as_bytes());
    key.push(b'#');
    key.extend_from_slice(&vnode.to_be_bytes());
    xxh3_64_with_seed(&key, RING_SEED)
}

impl Ring {
    /// A ring of the `members` that may own buckets and speak `protocol`, `vnodes` points each.
    pub fn new(members: impl IntoIterator<Item = Member>, vnodes: u32, protocol: u32) -> Self {
        Ring::speaking(members, vnodes, Speaks::only(protocol))
    }

    /// A ring of the `members` that may own buckets and speak a version `speaks` understands,
    /// `vnodes` points each.
    pub fn speaking(
        members: impl IntoIterator<Item = Member>,
        vnodes: u32,
        speaks: Speaks,
    ) -> Self {
        let mut ids: Vec<String> = members
            .into_iter()
            .filter(|m| m.owner && speaks.understands(m.protocol))
            .map(|m| m.id)
            .collect();
        ids.sort();
        ids.dedup();
        let mut points: Vec<(u64, u32)> = ids
            .iter()
            .enumerate()
            .flat_map(|(index, id)| (0..vnodes).map(move |v| (point_hash(id, v), index as u32)))
            .collect();
        // Members are indexed in id order, so sorting by (hash, index) breaks ties by id.
        points.sort_unstable();
        Ring {
            points,
            members: ids,
        }
    }

    /// The member that owns `bucket`, or `None` if the ring is empty.
    pub fn owner_of(&self, bucket: &str) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let hash = xxh3_64_with_seed(bucket.as_bytes(), RING_SEED);
        let at = self.points.partition_point(|&(point, _)| point < hash);
        let (_, member) = self.points[at % self.points.len()];
        Some(&self.members[member as usize])
    }

    /// Each placed member's share of the circle (0 to 1; together 1): the fraction of bucket
    /// names it owns, on average. A point owns the arc from the point before it up to itself.
    pub fn shares(&self) -> Vec<(String, f64)> {
        let mut arcs = vec![0u64; self.members.len()];
        let mut previous = self.points.last().map_or(0, |&(point, _)| point);
        for &(point, member) in &self.points {
            // The first point's arc wraps around from the last point.
            arcs[member as usize] =
                arcs[member as usize].wrapping_add(point.wrapping_sub(previous));
            previous = point;
        }
        let whole = 2f64.powi(64);
        self.members
            .iter()
            .zip(arcs)
            .map(|(id, arc)| {
                // One member alone owns the whole circle, an arc that wraps to 0.
                let share = if self.members.len() == 1 {
                    1.0
                } else {
                    arc as f64 / whole
                };
                (id.clone(), share)
            })
            .collect()
    }

    /// The placed members, sorted by id.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// A hash of who is placed and how: two rings with the same fingerprint give every bucket
    /// the same owner (for a [`Census`](crate::census::Census), which compares members' rings).
    pub fn fingerprint(&self) -> u64 {
        let mut key = Vec::new();
        key.extend_from_slice(&(self.points.len() as u64).to_be_bytes());
        for id in &self.members {
            key.extend_from_slice(id.as_bytes());
            key.push(0);
        }
        xxh3_64_with_seed(&key, RING_SEED)
    }

    /// Whether no member is placed.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// A ring published for lock-free lookups and replaced whole when membership changes. Each
/// ring published gets the next generation number, so a reader can tell whether it missed one.
#[derive(Debug, Default)]
pub struct SharedRing {
    ring: ArcSwap<Published>,
}

#[derive(Debug, Default)]
struct Published {
    generation: u64,
    ring: Arc<Ring>,
}

impl SharedRing {
    /// Publishes `ring`.
    pub fn new(ring: Ring) -> Self {
        SharedRing {
            ring: ArcSwap::from_pointee(Published {
                generation: 0,
                ring: Arc::new(ring),
            }),
        }
    }

    /// The ring in force.
    pub fn load(&self) -> Arc<Ring> {
        Arc::clone(&self.ring.load().ring)
    }

    /// The ring in force and its generation.
    pub fn load_versioned(&self) -> (u64, Arc<Ring>) {
        let published = self.ring.load();
        (published.generation, Arc::clone(&published.ring))
    }

    /// Replaces the ring.
    pub fn publish(&self, ring: Ring) {
        let ring = Arc::new(ring);
        self.ring.rcu(|current| Published {
            generation: current.generation + 1,
            ring: Arc::clone(&ring),
        });
    }

    /// The owner of `bucket` under the ring in force.
    pub fn owner_of(&self, bucket: &str) -> Option<String> {
        self.ring.load().ring.owner_of(bucket).map(str::to_owned)
    }

    /// Whether the current ring names `node` as `bucket`'s owner (without copying the name).
    pub fn is_owner(&self, bucket: &str, node: &str) -> bool {
        self.ring.load().ring.owner_of(bucket) == Some(node)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const PROTOCOL: u32 = 1;

    fn ring(ids: &[&str]) -> Ring {
        Ring::new(
            ids.iter().map(|id| Member::owner(*id, PROTOCOL)),
            DEFAULT_VNODES,
            PROTOCOL,
        )
    }

    fn keys() -> impl Iterator<Item = String> {
        (0..100_000).map(|i| format!("group-{}:user:{i}", i % 97))
    }

    #[test]
    fn the_same_members_in_any_order_give_the_same_owners() {
        let a = ring(&["n1", "n2", "n3"]);
        let b = ring(&["n3", "n1", "n2", "n1"]);
        assert_eq!(a, b);
        for key in keys().take(1000) {
            assert_eq!(a.owner_of(&key), b.owner_of(&key));
        }
    }

    #[test]
    fn load_is_balanced_over_three_nodes() {
        let r = ring(&["n1", "n2", "n3"]);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for key in keys() {
            *counts.entry(r.owner_of(&key).unwrap()).or_default() += 1;
        }
        let mean = 100_000.0 / 3.0;
        let max = *counts.values().max().unwrap() as f64;
        assert!(
            max / mean <= 1.15,
            "max/mean = {:.3}: {counts:?}",
            max / mean
        );
    }

    /// The shares add up to the whole circle and match the fraction of keys each member owns.
    #[test]
    fn shares_are_the_fractions_of_keys_owned() {
        assert_eq!(ring(&["solo"]).shares(), vec![("solo".to_owned(), 1.0)]);
        assert!(ring(&[]).shares().is_empty());
        let r = ring(&["n1", "n2", "n3"]);
        let shares = r.shares();
        let total: f64 = shares.iter().map(|(_, s)| s).sum();
        assert!((total - 1.0).abs() < 1e-9, "{shares:?}");
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for key in keys() {
            *counts.entry(r.owner_of(&key).unwrap()).or_default() += 1;
        }
        for (id, share) in &shares {
            let seen = counts[id.as_str()] as f64 / 100_000.0;
            assert!((seen - share).abs() < 0.01, "{id}: {seen} vs {share}");
        }
    }

    /// The keys whose owner differs between two rings, as (before, after).
    fn moves(before: &Ring, after: &Ring) -> Vec<(String, String)> {
        keys()
            .filter_map(|key| {
                let (was, is) = (before.owner_of(&key)?, after.owner_of(&key)?);
                (was != is).then(|| (was.to_owned(), is.to_owned()))
            })
            .collect()
    }

    #[test]
    fn a_leave_moves_only_the_leavers_keys() {
        let moved = moves(&ring(&["n1", "n2", "n3"]), &ring(&["n1", "n3"]));
        assert!(moved.iter().all(|(was, _)| was == "n2"), "only n2 left");
        assert!(
            moved.len() as f64 / 100_000.0 <= 1.0 / 3.0 + 0.05,
            "{} moved",
            moved.len()
        );
    }

    #[test]
    fn a_join_moves_at_most_its_share_and_only_to_the_joiner() {
        let moved = moves(&ring(&["n1", "n2", "n3"]), &ring(&["n1", "n2", "n3", "n4"]));
        assert!(moved.iter().all(|(_, is)| is == "n4"), "only n4 joined");
        assert!(
            moved.len() as f64 / 100_000.0 <= 1.0 / 4.0 + 0.05,
            "{} moved",
            moved.len()
        );
    }

    #[test]
    fn only_eligible_members_of_this_protocol_own_buckets() {
        let r = Ring::new(
            [
                Member::owner("n1", PROTOCOL),
                Member::owner("old", PROTOCOL - 1),
                Member {
                    id: "coordinator-only".into(),
                    protocol: PROTOCOL,
                    owner: false,
                },
            ],
            DEFAULT_VNODES,
            PROTOCOL,
        );
        assert_eq!(r.members(), ["n1"]);
        assert!(keys().take(100).all(|k| r.owner_of(&k) == Some("n1")));
        assert_eq!(Ring::default().owner_of("any"), None);
    }

    #[test]
    fn a_shared_ring_swaps_whole() {
        let shared = SharedRing::new(ring(&["n1"]));
        assert_eq!(shared.owner_of("b").as_deref(), Some("n1"));
        assert_eq!(shared.load_versioned().0, 0);
        shared.publish(ring(&[]));
        assert_eq!(shared.owner_of("b"), None);
        assert!(shared.load().is_empty());
        assert_eq!(shared.load_versioned().0, 1, "each publish is a generation");
    }

    #[test]
    fn rings_that_place_the_same_members_alike_share_a_fingerprint() {
        let ring = |ids: &[&str], vnodes| {
            Ring::new(ids.iter().map(|id| Member::owner(*id, 1)), vnodes, 1).fingerprint()
        };
        assert_eq!(ring(&["a", "b"], 64), ring(&["b", "a"], 64));
        assert_ne!(ring(&["a", "b"], 64), ring(&["a", "b", "c"], 64));
        assert_ne!(ring(&["a", "b"], 64), ring(&["a", "b"], 32));
        assert_ne!(ring(&["ab"], 64), ring(&["a", "b"], 64));
        // A member that does not own buckets is not placed.
        let stepped_down = Ring::new(
            [
                Member::owner("a", 1),
                Member {
                    owner: false,
                    ..Member::owner("b", 1)
                },
            ],
            64,
            1,
        );
        assert_eq!(stepped_down.fingerprint(), ring(&["a"], 64));
    }
}
