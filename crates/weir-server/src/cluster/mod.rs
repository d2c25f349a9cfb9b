//! Cluster mode in the server: gossip membership, this node's owner service, two-tier
//! admission for concurrency policies with a `shared_limit`, and the owners of cluster-scoped
//! rate buckets (`scope = "cluster"`: the owner decides, other nodes forward to it).
//!
//! A concurrency policy's node tier is the policy itself (its `node_limit` per bucket on this
//! node). When it is full and the policy has a `shared_limit`, the request asks the bucket's
//! owner for a shared lease through a shared-only [`TwoTier`]. Membership changes rebuild the
//! ring, update the owners' addresses, and hand this node's leases over to their buckets' new
//! owners; leases departed nodes held here stay until they expire (a "departed" node may only be
//! paused, and still using them).

mod assignments;
mod awaiting;
mod census;
mod config_versions;
mod coordinators;
mod leaving;
mod policies;
mod rates;
mod view;

pub use config_versions::ConfigVersions;
pub use rates::HANDOVER_HOLD;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tonic::transport::Channel;
use weir::policy::ConcurrencySpec;
use weir::{Clock, SystemClock};
use weir_api::http::{ClusterCounters, ClusterMember, ClusterView, RingSummary};
use weir_cluster::admission::{ClusterAdmission, TwoTier, TwoTierConfig};
use weir_cluster::batch::Batching;
use weir_cluster::grpc::{ClusterService, GrpcTransport, GuardedCluster};

use crate::tls::PeerConnector;
use weir_cluster::membership::{self, GossipMembership, GossipSettings, Membership, NodeInfo};
use weir_cluster::owner::Owner;
use weir_cluster::pool::SharedPool;
use weir_cluster::protocol::Speaks;
use weir_cluster::quorum::{DEFAULT_WINDOW, Quorum};
use weir_cluster::rates::{RateDecision, RateOwner, bucket_of};
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use weir_cluster::secret::ClusterSecret;

/// The newest cluster protocol version this build speaks (see `docs/configuration.md`, Cluster
/// mode).
/// 2: leases carry units (loans), `Unlease` gives units back, `Adopt` moves a loan whole.
/// 3: a shared pool's bucket is named by its policy and key; a rate decision may carry a
/// handover (the bucket's state from its previous owner).
pub const PROTOCOL: u32 = 3;

/// The versions this build speaks: a mixed cluster speaks the newest every member does, and
/// members speaking any of these share this node's ring ([`weir_cluster::protocol`]). The
/// next version that changes a message raises `newest` and keeps 3 understood for a release,
/// so that a rolling upgrade from this one keeps one ring.
pub const SPEAKS: Speaks = Speaks {
    oldest: 3,
    newest: PROTOCOL,
};

/// The coordinator a concurrency policy asks for shared leases: over gRPC, batched per owner.
pub type SharedCoordinator = TwoTier<SystemClock, Batching<GrpcTransport<SystemClock>>>;
type Coordinator = SharedCoordinator;

/// A node's cluster state.
pub struct ClusterMode {
    node_id: String,
    ring: Arc<SharedRing>,
    pool: Arc<SharedPool>,
    owner: Arc<Owner>,
    transport: Arc<Batching<GrpcTransport<SystemClock>>>,
    members: watch::Receiver<Vec<NodeInfo>>,
    gossip: tokio::sync::Mutex<Option<GossipMembership>>,
    coordinators: Mutex<HashMap<String, (TwoTierConfig, Arc<Coordinator>)>>,
    secret: Option<ClusterSecret>,
    quorum: Arc<Quorum>,
    /// Channels to the other members' public gRPC API, by address.
    peer_channels: Mutex<HashMap<String, Channel>>,
    /// How calls to other nodes are made secure, if they are.
    tls: Option<PeerConnector>,
    /// Cluster-scoped rate decisions: sent to owners, failed over to this node, made here for
    /// others.
    rates: RateCounters,
    /// This node's cluster-scoped rate policies, as an owner: what it hands over when the ring
    /// moves their buckets away (set with the service).
    rate_owner: std::sync::OnceLock<Arc<dyn RateOwner>>,
    /// Shares of cluster-scoped rate buckets lent to this node and by it.
    assignments: assignments::Assignments,
    /// Started with seeds to join through: not joined until another member is seen.
    seeded: bool,
    /// This node's config version and the members', as last shared.
    config_versions: Mutex<ConfigVersions>,
    /// The seeds and this node's gossip address, and when it started: what a node that has
    /// not joined yet says it is waiting for.
    seeds: Vec<String>,
    gossip_address: SocketAddr,
    started: std::time::Instant,
    /// This node runs the cluster's ring: one with another member in it, which every live
    /// member has answered this node's census on (or that has held for
    /// [`census::AGREE_WITHIN`]). For good: a node that has joined stays joined.
    joined: watch::Sender<bool>,
    /// Cluster-scoped rate buckets handed to this node lately.
    handed: Mutex<leaving::Handed>,
    /// The ring generation whose change the membership follower has finished applying
    /// (leases rehomed, rate buckets handed over).
    followed: watch::Sender<u64>,
    /// The cluster's policy changes, agreed by Raft.
    policy_log: Arc<crate::policy_log::PolicyLog>,
    /// What this node brings to a policy log it starts: its own overlay (taken once).
    seed: Mutex<Option<crate::durable::Overlay>>,
    /// This node has caught up with the policy log (or given up waiting).
    caught_up: watch::Sender<bool>,
    /// Why this member must not run in this cluster, once found (see `policies.rs`).
    refused: watch::Sender<Option<String>>,
    /// Where this node keeps its state (the clean-stop mark among it).
    data_dir: std::path::PathBuf,
    /// Some member has not answered this node's census of its ring yet: buckets the ring just
    /// gave it may still have a handover on the way (see `rates.rs`).
    handovers_pending: std::sync::atomic::AtomicBool,
    /// Rate buckets handed over before their policy runs here (see `awaiting.rs`).
    awaiting_policy: awaiting::Awaiting,
}

/// What cluster-scoped rate policies did on this node.
#[derive(Debug)]
struct RateCounters {
    forwarded: AtomicU64,
    forward_failed: AtomicU64,
    decided_for_others: AtomicU64,
    handed_over: AtomicU64,
    taken_on: AtomicU64,
    learning: AtomicU64,
    /// How long forwarded decisions took, answered or not (a waiting one's wait included).
    forward_latency: Histogram,
}

impl Default for RateCounters {
    fn default() -> Self {
        RateCounters {
            forwarded: AtomicU64::new(0),
            forward_failed: AtomicU64::new(0),
            decided_for_others: AtomicU64::new(0),
            handed_over: AtomicU64::new(0),
            taken_on: AtomicU64::new(0),
            learning: AtomicU64::new(0),
            forward_latency: Histogram::new([
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0,
            ]),
        }
    }
}

impl std::fmt::Debug for ClusterMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMode")
            .field("node_id", &self.node_id)
            .finish()
    }
}

/// A lazily connected channel to the node at `address`: over `tls` if given, else plain.
fn connect(address: &str, tls: Option<&PeerConnector>) -> Option<Channel> {
    match tls {
        Some(tls) => Some(
            weir_cluster::grpc::endpoint(&crate::tls::plain_uri(address))?
                .connect_with_connector_lazy(tls.clone()),
        ),
        None => Some(weir_cluster::grpc::endpoint(address)?.connect_lazy()),
    }
}

impl ClusterMode {
    /// Joins the cluster: gossips on `gossip` (through `join` seeds), advertising `grpc_url`,
    /// and keeps its part of the policy log in `data_dir`. With `tls`, every call to another
    /// node goes over it.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        data_dir: &std::path::Path,
        node_id: &str,
        cluster_id: &str,
        gossip: SocketAddr,
        join: Vec<String>,
        grpc_url: String,
        secret: Option<ClusterSecret>,
        tls: Option<PeerConnector>,
    ) -> anyhow::Result<Arc<Self>> {
        let ring = Arc::new(SharedRing::default());
        // Lease ids go on from the wall clock's nanoseconds, so that a process that restarts
        // under the same node id never hands out an id a holder still has from the one before.
        let first_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let pool = Arc::new(SharedPool::new(1_000_000).with_first_id(first_id));
        let previous = Self::previous_run(data_dir);
        let policy_log = crate::policy_log::PolicyLog::start(
            node_id,
            grpc_url.clone(),
            data_dir,
            {
                let tls = tls.clone();
                Arc::new(move |address: &str| connect(address, tls.as_ref()))
            },
            secret
                .as_ref()
                .map(ClusterSecret::attach)
                .unwrap_or_default(),
        )
        .await?;
        // A node that was in a cluster with others before joins it again, even started
        // without seeds (the first node of a cluster, restarted): alone, its ring would make
        // it the owner of every bucket, deciding them fresh and full.
        let seeded = !join.is_empty() || policy_log.voters_before().await > 1;
        let seeds = join.clone();
        let quorum = Arc::new(Quorum::new(node_id, DEFAULT_WINDOW, seeded));
        let owner = Arc::new(
            Owner::new(node_id, Arc::clone(&ring), Arc::clone(&pool))
                .with_quorum(Arc::clone(&quorum)),
        );
        match previous {
            census::PreviousRun::Crashed => {
                tracing::info!(
                    "the previous run of this node did not stop cleanly: new owners wait out their tenure for a lease TTL"
                );
                owner.departed(false, SystemClock::new().now());
            }
            census::PreviousRun::None => owner.first_run(),
            census::PreviousRun::Clean => {}
        }
        let membership = GossipMembership::start(GossipSettings {
            node_id: node_id.to_owned(),
            cluster_id: cluster_id.to_owned(),
            gossip,
            seeds: join,
            grpc: grpc_url.clone(),
            speaks: SPEAKS,
            owner: true,
            interval: Duration::from_millis(200),
            secret: secret.clone(),
        })
        .await?;
        let members = membership.watch();
        // A data dir that does not read is reported when the node builds its policies.
        let seed = crate::durable::load(data_dir).unwrap_or_default();
        Ok(Arc::new(ClusterMode {
            node_id: node_id.to_owned(),
            ring,
            pool,
            owner,
            transport: Arc::new(Batching::new(Arc::new(
                GrpcTransport::with_connect(SystemClock::new(), {
                    let tls = tls.clone();
                    Box::new(move |address| connect(address, tls.as_ref()))
                })
                .with_secret(secret.as_ref()),
            ))),
            members,
            gossip: tokio::sync::Mutex::new(Some(membership)),
            coordinators: Mutex::new(HashMap::new()),
            secret,
            quorum,
            peer_channels: Mutex::new(HashMap::new()),
            tls,
            rates: RateCounters::default(),
            rate_owner: std::sync::OnceLock::new(),
            assignments: assignments::Assignments::default(),
            seeded,
            config_versions: Mutex::default(),
            seeds,
            gossip_address: gossip,
            started: std::time::Instant::now(),
            joined: watch::channel(false).0,
            handed: Mutex::default(),
            followed: watch::channel(0).0,
            policy_log,
            seed: Mutex::new(Some(seed)),
            caught_up: watch::channel(false).0,
            refused: watch::channel(None).0,
            data_dir: data_dir.to_owned(),
            handovers_pending: std::sync::atomic::AtomicBool::new(true),
            awaiting_policy: awaiting::Awaiting::default(),
        }))
    }

    /// What this node is waiting for, if it has not joined its cluster yet: the seeds it gossips
    /// to, for how long, and what to check. `None` once joined.
    pub fn joining(&self) -> Option<String> {
        if let Some(why) = self.policy_log.stopped() {
            return Some(format!(
                "this member's part of the cluster's policy log has stopped ({why}): it cannot take the policy changes the cluster makes, so it serves none until the log runs again (it is started again every {} s)",
                crate::policy_log::RESTART_EVERY.as_secs()
            ));
        }
        if self.has_joined() {
            return None;
        }
        if self.gossip_has_joined() {
            return Some(format!(
                "catching up with the cluster's policy log (leader: {}); a node serves once it runs the policies the cluster has committed, or after {} s without a leader",
                self.policy_log
                    .leader()
                    .unwrap_or_else(|| "none known yet".to_owned()),
                policies::CATCH_UP_WITHIN.as_secs()
            ));
        }
        Some(format!(
            "joining the cluster: not yet on one ring with the other members after {} s, through {} (gossiping on {}); check that a seed's gossip address is right and reachable, and that the nodes share `cluster_id` and `cluster_secret`",
            self.started.elapsed().as_secs(),
            match self.seeds.is_empty() {
                true => format!(
                    "the members it had before (its policy log's; it serves alone after {} s)",
                    policies::CATCH_UP_WITHIN.as_secs()
                ),
                false => format!("the seed(s) {}", self.seeds.join(", ")),
            },
            self.gossip_address
        ))
    }

    /// Says in the log what a node that has not joined is waiting for: within 5 s of the
    /// start, then every 30 s until it joins (said once, at INFO, when it does).
    pub async fn report_joining(self: Arc<Self>) {
        if !self.seeded {
            return;
        }
        let mut wait = Duration::from_secs(5);
        let mut warned = false;
        loop {
            tokio::select! {
                () = self.joined() => {
                    if warned {
                        tracing::info!(members = self.members(), "joined the cluster");
                    }
                    return;
                }
                () = tokio::time::sleep(wait) => {}
            }
            if let Some(waiting) = self.joining() {
                tracing::warn!("not ready: {waiting}");
                warned = true;
            }
            wait = Duration::from_secs(30);
        }
    }

    /// Whether this node has joined its cluster: seen another member (at once for a node
    /// started without seeds, the first of a cluster) and caught up with the policy log.
    pub fn has_joined(&self) -> bool {
        self.gossip_has_joined() && self.has_caught_up() && self.policy_log.stopped().is_none()
    }

    /// Whether gossip has joined: at once for a node started without seeds, else once this
    /// node runs the cluster's ring (see `census.rs`). Seeing another member in gossip is not
    /// enough: until the ring follows, and while it holds only some of the members, this
    /// node decides as the owner of buckets the cluster's ring gives to others, on its own
    /// fresh and full state (a rolling restart measured a burst over the rate each time a
    /// node came back).
    fn gossip_has_joined(&self) -> bool {
        !self.seeded || *self.joined.borrow()
    }

    /// Resolves once this node has joined (see [`has_joined`](Self::has_joined)); never, if
    /// membership ends first.
    pub async fn joined(&self) {
        self.gossip_joined().await;
        self.caught_up().await;
    }

    /// Resolves once gossip has joined; never, if membership ends first.
    async fn gossip_joined(&self) {
        let mut joined = self.joined.subscribe();
        if joined
            .wait_for(|joined| *joined || !self.seeded)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// This node's owner service, to add to the gRPC server (behind the secret's check when
    /// the cluster has one).
    pub fn service(self: &Arc<Self>, rates: Arc<dyn RateOwner>) -> GuardedCluster<SystemClock> {
        let _ = self.rate_owner.set(Arc::clone(&rates));
        ClusterService::new(Arc::clone(&self.owner), SystemClock::new())
            .with_rates(rates)
            .with_census(Arc::new(census::Answers(Arc::clone(self))))
            .into_server(self.secret.as_ref())
    }

    /// Follows membership until the process ends: each change rebuilds the ring, updates
    /// addresses and hands this node's leases over. Meanwhile, every 100 ms, the quorum
    /// learns whom gossip has heard from, and the owner beats, so that it knows how long it has
    /// held each bucket and notices a pause of its own; and every 250 ms the loans this node
    /// holds are looked after (renewed when due, trimmed, returned when idle).
    pub async fn follow(self: Arc<Self>) {
        let seed = self
            .seed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        tokio::spawn(Arc::clone(&self).follow_policies(seed));
        let node = Arc::clone(&self);
        let beats = tokio::spawn(async move {
            let clock = SystemClock::new();
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let beats = match node.gossip.lock().await.as_ref() {
                    Some(gossip) => gossip.beats().await,
                    None => return,
                };
                let now = clock.now();
                node.quorum
                    .observe(beats.iter().map(|(id, beat)| (id.as_str(), *beat)), now);
                node.owner.beat(now);
            }
        });
        let _beats = AbortOnDrop(beats);
        let node = Arc::clone(&self);
        let upkeep = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(weir_cluster::loan::UPKEEP_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                node.upkeep().await;
            }
        });
        let _upkeep = AbortOnDrop(upkeep);
        let _census = AbortOnDrop(tokio::spawn(Arc::clone(&self).take_census()));
        let mut watch = self.members.clone();
        let mut previous = BTreeSet::new();
        // Whether each member owned buckets, as last seen: one that departs still owning them
        // did not step down first.
        let mut owning: HashMap<String, bool> = HashMap::new();
        loop {
            let members = watch.borrow_and_update().clone();
            // Before the ring changes: its buckets' handovers are on their way from then.
            self.handovers_pending.store(true, Ordering::Release);
            let before = self.ring.load();
            let transport = Arc::clone(&self.transport);
            let applied = membership::apply(
                &members,
                &mut previous,
                &self.ring,
                DEFAULT_VNODES,
                SPEAKS,
                |addresses| {
                    transport.retain_owners(|owner| addresses.contains_key(owner));
                    transport.inner().set_addresses(addresses);
                },
            );
            // Membership changes are normal operation (a rolling restart is one per node):
            // INFO, not a warning that pages someone.
            let joined: Vec<&String> = applied
                .joined
                .iter()
                .filter(|id| **id != self.node_id)
                .collect();
            if !joined.is_empty() {
                tracing::info!(
                    ?joined,
                    members = members.len(),
                    "members joined the cluster"
                );
            }
            // A member that stepped down first (no longer owning) left gracefully, its buckets
            // handed over; one that vanished still owning them was lost.
            let (left, lost): (Vec<&String>, Vec<&String>) = applied
                .departed
                .iter()
                .partition(|id| owning.get(*id) == Some(&false));
            if !left.is_empty() {
                tracing::info!(
                    ?left,
                    members = members.len(),
                    "members left the cluster after handing their buckets over"
                );
            }
            if !lost.is_empty() {
                tracing::info!(
                    ?lost,
                    members = members.len(),
                    "members lost (no longer seen, still owning buckets: stopped, paused or cut off); their buckets move to the next owners, and shared leases they held here expire with their TTL"
                );
            }
            let now = SystemClock::new().now();
            for departed in &applied.departed {
                let stepped_down = owning.get(departed) == Some(&false);
                self.owner.departed(stepped_down, now);
            }
            owning = members.iter().map(|m| (m.id.clone(), m.owner)).collect();
            for coordinator in self.coordinators() {
                coordinator.rehome().await;
            }
            let (generation, after) = self.ring.load_versioned();
            self.hand_over_rates(&before, &after).await;
            self.followed.send_replace(generation);
            self.owner.expect(members.iter().map(|m| m.id.clone()));
            self.note_handovers();
            if watch.changed().await.is_err() {
                return;
            }
        }
    }

    /// Live members seen, this node included.
    pub fn members(&self) -> usize {
        self.members.borrow().len()
    }

    /// A channel to each other live member's gRPC address, kept from one call to the next (a
    /// member back at another address gets a new one). Channels connect lazily and are pinged,
    /// like the owners' channels.
    pub fn peers(&self) -> Vec<(String, Channel)> {
        let members: Vec<(String, String)> = self
            .members
            .borrow()
            .iter()
            .filter(|m| m.id != self.node_id)
            .map(|m| (m.id.clone(), m.grpc.clone()))
            .collect();
        let mut channels = self.peer_channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.retain(|address, _| members.iter().any(|(_, a)| a == address));
        members
            .into_iter()
            .filter_map(|(id, address)| {
                let channel = match channels.get(&address) {
                    Some(channel) => channel.clone(),
                    None => {
                        let channel = connect(&address, self.tls.as_ref())?;
                        channels.insert(address, channel.clone());
                        channel
                    }
                };
                Some((id, channel))
            })
            .collect()
    }

    /// The ring in force: its generation (one more each time membership changed it) and each
    /// owner's share of it.
    pub fn ring_shares(&self) -> (u64, Vec<(String, f64)>) {
        let (generation, ring) = self.ring.load_versioned();
        (generation, ring.shares())
    }

    /// Leaves the cluster: hands this node's cluster-scoped rate buckets over to the owners
    /// the ring will have without it, then says goodbye.
    pub async fn stop(&self) {
        let before = self.ring.load();
        let after = Ring::new(
            before
                .members()
                .iter()
                .filter(|id| **id != self.node_id)
                .map(|id| Member::owner(id.clone(), PROTOCOL)),
            DEFAULT_VNODES,
            PROTOCOL,
        );
        self.hand_over_rates(&before, &after).await;
        if let Some(gossip) = self.gossip.lock().await.take() {
            gossip.stop().await;
        }
        self.policy_log.stop().await;
        self.mark_stopped_cleanly();
    }
}

/// Aborts a background task when dropped, so it ends with the task that started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
