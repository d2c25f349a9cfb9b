//! A network for the simulated policy log: members in one process, each message delivered
//! after a delay on the (paused) clock, links that can be cut, members that can be stopped.
//!
//! The delay model: a message waits for its sender's outgoing link (each message occupies it
//! for [`World::per_message`], so a leader's fan-out to N − 1 followers takes N − 1 slots),
//! then crosses in [`World::latency`]. The reply crosses back the same way. Disk writes take
//! no simulated time.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, Raft};
use tokio::time::Instant;

use super::super::PolicyRaft;

/// The simulated world: who is up, which links are cut, and the delay model.
pub struct World {
    /// The members up, by id.
    pub up: HashMap<u64, Raft<PolicyRaft>>,
    /// Links that carry nothing (both directions).
    pub cut: BTreeSet<(u64, u64)>,
    /// One-way latency of every link.
    pub latency: Duration,
    /// How long one message occupies its sender's outgoing link.
    pub per_message: Duration,
    /// When each member's outgoing link is free again.
    busy_until: HashMap<u64, Instant>,
}

/// The world, shared by every member's network.
pub type Shared = Arc<Mutex<World>>;

impl World {
    /// A world with no member up yet.
    pub fn new(latency: Duration, per_message: Duration) -> Shared {
        Arc::new(Mutex::new(World {
            up: HashMap::new(),
            cut: BTreeSet::new(),
            latency,
            per_message,
            busy_until: HashMap::new(),
        }))
    }

    /// Whether `a` and `b` can reach each other.
    pub fn linked(&self, a: u64, b: u64) -> bool {
        !self.cut.contains(&(a.min(b), a.max(b)))
    }

    /// Cuts every link between `side` and the other members in `all`.
    pub fn partition(&mut self, side: &[u64], all: &[u64]) {
        for &a in side {
            for &b in all.iter().filter(|b| !side.contains(b)) {
                self.cut.insert((a.min(b), a.max(b)));
            }
        }
    }

    /// When a message `from` → `to` sent now arrives.
    fn arrival(&mut self, from: u64) -> Instant {
        let now = Instant::now();
        let free = self.busy_until.get(&from).copied().unwrap_or(now).max(now) + self.per_message;
        self.busy_until.insert(from, free);
        free + self.latency
    }
}

pub fn lock(world: &Shared) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One member's view of the world: the factory of its links.
#[derive(Clone)]
pub struct Network {
    /// The member.
    pub me: u64,
    /// The world.
    pub world: Shared,
}

/// A link from one member to another.
pub struct Link {
    from: u64,
    to: u64,
    world: Shared,
}

impl RaftNetworkFactory<PolicyRaft> for Network {
    type Network = Link;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Link {
        Link {
            from: self.me,
            to: target,
            world: self.world.clone(),
        }
    }
}

fn unreachable<E: std::error::Error>(why: &str) -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(why)))
}

impl Link {
    /// Carries a message one way: whether the link still stands when it arrives.
    async fn cross(&self, from: u64, to: u64) -> bool {
        let arrival = {
            let mut world = lock(&self.world);
            if !world.linked(from, to) {
                return false;
            }
            world.arrival(from)
        };
        tokio::time::sleep_until(arrival).await;
        lock(&self.world).linked(from, to)
    }

    /// Sends a request, has `handle` answer it at the far end, and carries the answer back.
    async fn call<R, E, F>(
        &self,
        handle: impl FnOnce(Raft<PolicyRaft>) -> F,
    ) -> Result<R, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        E: std::error::Error,
        F: std::future::Future<Output = Result<R, RaftError<u64, E>>>,
    {
        let far = match self.cross(self.from, self.to).await {
            true => lock(&self.world).up.get(&self.to).cloned(),
            false => None,
        };
        let Some(far) = far else {
            return Err(unreachable("the member is down or cut off"));
        };
        let answer = handle(far).await;
        if !self.cross(self.to, self.from).await {
            return Err(unreachable("the answer was lost"));
        }
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.to, error)))
    }
}

impl RaftNetwork<PolicyRaft> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<PolicyRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(|raft| async move { raft.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<PolicyRaft>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        self.call(|raft| async move { raft.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(|raft| async move { raft.vote(rpc).await }).await
    }
}
