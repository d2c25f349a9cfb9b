//! Who is in the cluster: a small [`Membership`] interface, a static implementation for tests,
//! and gossip ([chitchat]) for real clusters.
//!
//! A member advertises its node id, its gRPC address, the cluster protocol version it speaks
//! and whether it may own buckets. Membership is a watch channel of the live members; when it
//! changes, [`apply`] rebuilds the ring and updates the transport's addresses (the caller then
//! hands its own leases over with `TwoTier::rehome`).
//!
//! The leases a departed member held on this node's pool are *not* dropped: "departed" is what
//! a failure detector concludes from silence, and a paused or partitioned node is silent but may
//! still be using its permits. Dropping them early let others take their place, and when the
//! node came back the ceiling was exceeded. They expire with their TTL instead — the price is
//! that a node that really crashed strands its shared permits for up to one `lease_ttl`.
//!
//! [chitchat]: https://docs.rs/chitchat

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chitchat::transport::UdpTransport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig};
use tokio::sync::watch;

use crate::protocol::Speaks;
use crate::ring::{Member, Ring, SharedRing};
use crate::secret::ClusterSecret;

/// A live member, as it advertises itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeInfo {
    /// Its node id.
    pub id: String,
    /// Its gRPC address, `http://host:port`.
    pub grpc: String,
    /// The cluster protocol version it speaks now.
    pub protocol: u32,
    /// The newest version it could speak (its `protocol` for a release from before versions
    /// were negotiated: the only one it speaks).
    pub newest: u32,
    /// Whether it may own buckets.
    pub owner: bool,
}

/// A source of the live members.
pub trait Membership: Send + Sync {
    /// The live members, updated as they change.
    fn watch(&self) -> watch::Receiver<Vec<NodeInfo>>;
}

/// Members set by hand: for tests and fixed deployments.
#[derive(Debug)]
pub struct StaticMembership {
    members: watch::Sender<Vec<NodeInfo>>,
}

impl StaticMembership {
    /// These members, live.
    pub fn new(members: Vec<NodeInfo>) -> Self {
        StaticMembership {
            members: watch::channel(members).0,
        }
    }

    /// Replaces the live members.
    pub fn set(&self, members: Vec<NodeInfo>) {
        self.members.send_replace(members);
    }
}

impl Membership for StaticMembership {
    fn watch(&self) -> watch::Receiver<Vec<NodeInfo>> {
        self.members.subscribe()
    }
}

/// How to join a gossip cluster.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    /// This node's id.
    pub node_id: String,
    /// The cluster's name: nodes of other clusters are ignored.
    pub cluster_id: String,
    /// The UDP address to gossip on (also advertised to peers).
    pub gossip: SocketAddr,
    /// Peers to contact first (`host:port`).
    pub seeds: Vec<String>,
    /// This node's gRPC address, `http://host:port`.
    pub grpc: String,
    /// The cluster protocol versions this node speaks.
    pub speaks: Speaks,
    /// Whether this node may own buckets.
    pub owner: bool,
    /// How often to gossip.
    pub interval: Duration,
    /// The cluster's secret: with it, this node advertises a proof that it knows the secret,
    /// and members without one are left out (see [`secret`](crate::secret)).
    pub secret: Option<ClusterSecret>,
}

/// Joining or running gossip failed.
#[derive(Debug, thiserror::Error)]
#[error("gossip on {address}: {detail}")]
pub struct GossipError {
    /// The gossip address.
    pub address: SocketAddr,
    /// What failed.
    pub detail: String,
}

/// Membership by gossip (chitchat over UDP), with its failure detector.
pub struct GossipMembership {
    handle: ChitchatHandle,
    members: watch::Receiver<Vec<NodeInfo>>,
    follower: tokio::task::JoinHandle<()>,
    strangers: Arc<AtomicU64>,
    cluster_id: String,
    secret: Option<ClusterSecret>,
    /// What places this node on the others' rings, as it advertises it now.
    advertised: Arc<std::sync::Mutex<Placement>>,
}

/// What places a node on the rings, advertised with the proof that covers it: a change of
/// either the version it speaks or whether it owns is proved again and travels in one delta.
#[derive(Debug)]
struct Placement {
    cluster_id: String,
    node_id: String,
    grpc: String,
    secret: Option<ClusterSecret>,
    speaking: u32,
    owner: bool,
}

impl Placement {
    /// The keys and values that advertise it: the version, whether it owns, and their proof.
    fn entries(&self) -> Vec<(&'static str, String)> {
        let (protocol, owner) = (self.speaking.to_string(), self.owner.to_string());
        let proof = self.secret.as_ref().map(|secret| {
            let fields = [
                self.cluster_id.as_str(),
                &self.node_id,
                &self.grpc,
                &protocol,
                &owner,
            ];
            (KEY_PROOF, secret.prove(&fields))
        });
        let mut entries = vec![(KEY_PROTOCOL, protocol), (KEY_OWNER, owner)];
        entries.extend(proof);
        entries
    }

    /// Writes them into this node's gossip state, all in one delta.
    fn write(&self, state: &mut chitchat::NodeState) {
        for (key, value) in self.entries() {
            state.set(key, value);
        }
    }
}

impl std::fmt::Debug for GossipMembership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipMembership")
            .field("members", &*self.members.borrow())
            .finish()
    }
}

const KEY_GRPC: &str = "grpc";
const KEY_PROTOCOL: &str = "protocol";
/// The newest protocol version a member could speak; not covered by the proof (a release from
/// before versions were negotiated verifies the fields it knows), so a forged one can at most
/// make members speak an older version they all understand.
const KEY_PROTOCOL_NEWEST: &str = "protocol_newest";
const KEY_OWNER: &str = "owner";
const KEY_PROOF: &str = "proof";

/// What a member advertises beside its place in the ring, for the others to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advertised {
    /// The version of the policies it runs (a digest of every policy's config).
    ConfigVersion,
    /// The identity of the policy log its data dir holds.
    PolicyLog,
    /// What it can run that not every member may (`redis`: it has a `[redis]` store).
    Abilities,
    /// The Weir release it runs (`0.1.0`): what a rolling upgrade has reached, shown only.
    Build,
}

impl Advertised {
    /// Its key in gossip.
    fn key(self) -> &'static str {
        match self {
            Advertised::ConfigVersion => "config",
            Advertised::PolicyLog => "policy_log",
            Advertised::Abilities => "abilities",
            Advertised::Build => "build",
        }
    }
}

impl GossipMembership {
    /// Starts gossiping over UDP and joins through `settings.seeds`.
    pub async fn start(settings: GossipSettings) -> Result<Self, GossipError> {
        Self::start_on(settings, &UdpTransport).await
    }

    /// Like [`start`](Self::start), over `transport` (a test brings chitchat's in-process one,
    /// whose links it can cut).
    pub async fn start_on(
        settings: GossipSettings,
        transport: &dyn chitchat::transport::Transport,
    ) -> Result<Self, GossipError> {
        let generation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let config = ChitchatConfig {
            chitchat_id: ChitchatId::new(settings.node_id.clone(), generation, settings.gossip),
            cluster_id: settings.cluster_id.clone(),
            gossip_interval: settings.interval,
            listen_addr: settings.gossip,
            seed_nodes: settings.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                initial_interval: settings.interval,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V0,
        };
        // Its oldest version first, which every member that understands it at all places on
        // its ring; raised once it sees what the members speak.
        let placement = Placement {
            cluster_id: settings.cluster_id.clone(),
            node_id: settings.node_id.clone(),
            grpc: settings.grpc.clone(),
            secret: settings.secret.clone(),
            speaking: settings.speaks.oldest,
            owner: settings.owner,
        };
        let mut key_values = vec![
            (KEY_GRPC.to_owned(), settings.grpc.clone()),
            (
                KEY_PROTOCOL_NEWEST.to_owned(),
                settings.speaks.newest.to_string(),
            ),
        ];
        key_values.extend(
            placement
                .entries()
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value)),
        );
        let cluster_id = settings.cluster_id.clone();
        let (admit_cluster, admit_secret) = (cluster_id.clone(), settings.secret.clone());
        let handle = chitchat::spawn_chitchat(config, key_values, transport)
            .await
            .map_err(|e| GossipError {
                address: settings.gossip,
                detail: e.to_string(),
            })?;
        let advertised = Arc::new(std::sync::Mutex::new(placement));
        let mut live = handle.chitchat().lock().await.live_nodes_watcher();
        let (tx, members) = watch::channel(Vec::new());
        let strangers = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&strangers);
        let secret = settings.secret.clone();
        let (placement, chitchat, speaks) =
            (Arc::clone(&advertised), handle.chitchat(), settings.speaks);
        let follower = tokio::spawn(async move {
            loop {
                let mut left_out = 0;
                let snapshot: Vec<NodeInfo> = live
                    .borrow_and_update()
                    .iter()
                    .filter_map(|(id, state)| {
                        match admitted(id, state, &cluster_id, secret.as_ref()) {
                            Admitted::Member(info) => Some(info),
                            Admitted::Stranger => {
                                left_out += 1;
                                None
                            }
                            Admitted::Incomplete => None,
                        }
                    })
                    .collect();
                if counted.swap(left_out, Ordering::Relaxed) < left_out {
                    tracing::warn!(
                        left_out,
                        "gossip peers without this cluster's secret are left out of the ring (a node with another `cluster_secret`, or a stranger)"
                    );
                }
                let speaking = speaks.among(snapshot.iter().map(|m| m.newest));
                let spoken = placement.lock().unwrap_or_else(|p| p.into_inner()).speaking;
                if spoken != speaking {
                    tracing::info!(
                        from = spoken,
                        to = speaking,
                        "the cluster protocol this node speaks changes: the newest every member speaks"
                    );
                    // Gossip's lock first, as `step_down` takes them.
                    let mut chitchat = chitchat.lock().await;
                    let mut placement = placement.lock().unwrap_or_else(|p| p.into_inner());
                    placement.speaking = speaking;
                    placement.write(chitchat.self_node_state());
                }
                // Only a change of who is a member, or of how one advertises itself, is a
                // change: a key that is no part of it (a config version) changes no ring.
                tx.send_if_modified(|members| {
                    let changed = *members != snapshot;
                    if changed {
                        *members = snapshot;
                    }
                    changed
                });
                if live.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(GossipMembership {
            handle,
            members,
            follower,
            strangers,
            cluster_id: admit_cluster,
            secret: admit_secret,
            advertised,
        })
    }

    /// Every member gossip knows, live or departed (departed ones are remembered for an hour),
    /// with its beat — its generation and heartbeat, which go up while it lives — for a
    /// [`Quorum`](crate::quorum::Quorum). Peers without the proof of the secret are not members.
    pub async fn beats(&self) -> Vec<(String, u128)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let mut beats: HashMap<String, u128> = HashMap::new();
        for (id, state) in chitchat.node_states() {
            if let Admitted::Member(info) =
                admitted(id, state, &self.cluster_id, self.secret.as_ref())
            {
                let beat =
                    (u128::from(id.generation_id) << 64) | u128::from(u64::from(state.heartbeat()));
                let newest = beats.entry(info.id).or_default();
                *newest = (*newest).max(beat);
            }
        }
        beats.into_iter().collect()
    }

    /// Stops owning buckets while staying a member: advertises itself as no owner, so that
    /// every member — this one too — rebuilds its ring without it and its buckets move to
    /// their next owners while it still answers. What a graceful leave does first.
    pub async fn step_down(&self) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let mut placement = self.advertised.lock().unwrap_or_else(|p| p.into_inner());
        placement.owner = false;
        placement.write(chitchat.self_node_state());
    }

    /// Advertises `value` under `key` (one of [`Advertised`]), for the members to compare:
    /// not part of the member's advertisement (the proof covers only what places it in the
    /// ring), so a new value changes no ring.
    pub async fn advertise(&self, key: Advertised, value: &str) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        if chitchat.self_node_state().get(key.key()) != Some(value) {
            chitchat.self_node_state().set(key.key(), value);
        }
    }

    /// What each live member advertises under `key` (one that has not yet is left out).
    pub async fn advertised(&self, key: Advertised) -> Vec<(String, String)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        chitchat
            .live_nodes()
            .filter_map(|id| {
                let state = chitchat.node_state(id)?;
                match admitted(id, state, &self.cluster_id, self.secret.as_ref()) {
                    Admitted::Member(info) => Some((info.id, state.get(key.key())?.to_owned())),
                    _ => None,
                }
            })
            .collect()
    }

    /// Live gossip peers left out of the membership now because they lack the proof that they
    /// know the cluster's secret (0 without a secret).
    pub fn strangers(&self) -> u64 {
        self.strangers.load(Ordering::Relaxed)
    }

    /// Leaves: stops gossiping (peers notice through their failure detectors).
    pub async fn stop(self) {
        self.follower.abort();
        let _ = self.handle.shutdown().await;
    }
}

impl Membership for GossipMembership {
    fn watch(&self) -> watch::Receiver<Vec<NodeInfo>> {
        self.members.clone()
    }
}

/// What a gossip peer is to this node.
enum Admitted {
    /// A member, as it advertises itself.
    Member(NodeInfo),
    /// A peer without the proof that it knows the cluster's secret.
    Stranger,
    /// A peer whose advertisement has not fully arrived.
    Incomplete,
}

/// Whether the peer `id`, advertising `state`, is a member of cluster `cluster_id` — with
/// `secret`, only if it proves it knows it.
fn admitted(
    id: &ChitchatId,
    state: &chitchat::NodeState,
    cluster_id: &str,
    secret: Option<&ClusterSecret>,
) -> Admitted {
    let (Some(grpc), Some(protocol), Some(owner)) = (
        state.get(KEY_GRPC),
        state.get(KEY_PROTOCOL),
        state.get(KEY_OWNER),
    ) else {
        return Admitted::Incomplete;
    };
    let node_id: &str = &id.node_id;
    if let Some(secret) = secret {
        let fields = [cluster_id, node_id, grpc, protocol, owner];
        if !secret.verify(&fields, state.get(KEY_PROOF).unwrap_or("")) {
            return Admitted::Stranger;
        }
    }
    let Ok(protocol) = protocol.parse() else {
        return Admitted::Incomplete;
    };
    let newest = state
        .get(KEY_PROTOCOL_NEWEST)
        .and_then(|newest| newest.parse().ok())
        .unwrap_or(protocol);
    Admitted::Member(NodeInfo {
        id: node_id.to_owned(),
        grpc: grpc.to_owned(),
        protocol,
        newest,
        owner: owner == "true",
    })
}

/// What a membership change did on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Members that left since the previous change.
    pub departed: Vec<String>,
    /// Members that joined since the previous change.
    pub joined: Vec<String>,
}

/// Applies a new member list: publishes the ring of eligible members, hands `addresses` the
/// gRPC address of every member, and reports the members that left since `previous` (which is
/// updated). Their leases stay until they expire (see the [module docs](self)).
pub fn apply(
    members: &[NodeInfo],
    previous: &mut BTreeSet<String>,
    ring: &SharedRing,
    vnodes: u32,
    speaks: Speaks,
    mut addresses: impl FnMut(HashMap<String, String>),
) -> Applied {
    ring.publish(Ring::speaking(
        members.iter().map(|m| Member {
            id: m.id.clone(),
            protocol: m.protocol,
            owner: m.owner,
        }),
        vnodes,
        speaks,
    ));
    addresses(
        members
            .iter()
            .map(|m| (m.id.clone(), m.grpc.clone()))
            .collect(),
    );
    let now: BTreeSet<String> = members.iter().map(|m| m.id.clone()).collect();
    let departed: Vec<String> = previous.difference(&now).cloned().collect();
    let joined: Vec<String> = now.difference(previous).cloned().collect();
    *previous = now;
    Applied { departed, joined }
}

#[cfg(test)]
mod tests;
