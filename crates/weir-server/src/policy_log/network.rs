//! The policy log's calls to other members: Raft's messages, and a change or a read barrier
//! sent to the leader, each over the members' gRPC port as the JSON form of the message.
//!
//! Calls carry the cluster's token and the log's identity (see [`super::identity`]), and go over TLS when the cluster's calls do (the channel
//! comes from the same connector as the owner calls'). A member's error crosses as Raft's
//! `Fatal` (the only error of an append or a vote: their API error cannot happen).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use weir_cluster::grpc::proto::RaftBody;
use weir_cluster::grpc::proto::policy_log_client::PolicyLogClient;
use weir_cluster::secret::AttachToken;

use super::PolicyRaft;
use super::identity::{self, Identity};

/// How a member's channel is opened: lazily, over TLS when the cluster's calls are.
pub type Connect = Arc<dyn Fn(&str) -> Option<Channel> + Send + Sync>;

/// A client of another member's policy log service.
pub type Client = PolicyLogClient<InterceptedService<Channel, AttachToken>>;

/// One of the service's methods, called on a client.
pub type Method = for<'c> fn(
    &'c mut Client,
    tonic::Request<RaftBody>,
) -> futures_util::future::BoxFuture<
    'c,
    Result<tonic::Response<RaftBody>, tonic::Status>,
>;

/// Why a call to another member failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The address is not a gRPC address.
    #[error("`{0}` is not a member's gRPC address")]
    Address(String),
    /// The call failed (unreachable, refused, too slow).
    #[error("calling {address}: {status}")]
    Status {
        /// The member called.
        address: String,
        /// What gRPC said.
        status: tonic::Status,
    },
    /// The body did not parse.
    #[error("the reply of {address} does not parse: {error}")]
    Body {
        /// The member called.
        address: String,
        /// The parse error.
        error: serde_json::Error,
    },
}

/// The other members' channels, opened once each.
#[derive(Clone)]
pub struct Peers {
    connect: Connect,
    token: AttachToken,
    identity: Arc<Identity>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl Peers {
    /// Peers reached through `connect`, calls carrying `token` and this log's `identity`.
    pub fn new(connect: Connect, token: AttachToken, identity: Arc<Identity>) -> Peers {
        Peers {
            connect,
            token,
            identity,
            channels: Arc::default(),
        }
    }

    /// A client of the member at `address`.
    pub fn client(&self, address: &str) -> Result<Client, CallError> {
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let channel = match channels.get(address) {
            Some(channel) => channel.clone(),
            None => {
                let channel = (self.connect)(address)
                    .ok_or_else(|| CallError::Address(address.to_owned()))?;
                channels.insert(address.to_owned(), channel.clone());
                channel
            }
        };
        Ok(PolicyLogClient::with_interceptor(
            channel,
            self.token.clone(),
        ))
    }
}

/// Encodes a message as a call's body.
pub fn body_of(message: &impl Serialize) -> RaftBody {
    RaftBody {
        json: serde_json::to_vec(message).unwrap_or_default(),
    }
}

/// Calls `method` of the member at `address` with `message`, within `within`.
pub async fn call<T: Serialize, R: DeserializeOwned>(
    peers: &Peers,
    address: &str,
    within: Duration,
    message: &T,
    method: Method,
) -> Result<R, CallError> {
    let mut client = peers.client(address)?;
    let mut request = tonic::Request::new(body_of(message));
    request.set_timeout(within);
    if let Some(id) = peers.identity.get().and_then(|id| id.parse().ok()) {
        request.metadata_mut().insert(identity::HEADER, id);
    }
    let status = |status| CallError::Status {
        address: address.to_owned(),
        status,
    };
    let reply = tokio::time::timeout(within, method(&mut client, request))
        .await
        .map_err(|_| status(tonic::Status::deadline_exceeded("no answer in time")))?
        .map_err(status)?;
    serde_json::from_slice(&reply.into_inner().json).map_err(|error| CallError::Body {
        address: address.to_owned(),
        error,
    })
}

/// The connection to one member, for Raft.
pub struct Member {
    peers: Peers,
    id: u64,
    address: String,
}

impl RaftNetworkFactory<PolicyRaft> for Peers {
    type Network = Member;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Member {
        Member {
            peers: self.clone(),
            id: target,
            address: node.addr.clone(),
        }
    }
}

impl Member {
    /// A Raft message sent, its reply (or the member's error, as `W` on the wire) returned.
    async fn send<T: Serialize, R: DeserializeOwned, W, E>(
        &self,
        message: &T,
        option: &RPCOption,
        method: Method,
    ) -> Result<R, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        W: DeserializeOwned + Into<RaftError<u64, E>>,
        E: std::error::Error,
    {
        let reply: Result<Result<R, W>, CallError> = call(
            &self.peers,
            &self.address,
            option.hard_ttl(),
            message,
            method,
        )
        .await;
        match reply {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) => Err(RPCError::RemoteError(RemoteError::new(
                self.id,
                error.into(),
            ))),
            Err(error @ CallError::Body { .. }) => {
                Err(RPCError::Network(NetworkError::new(&AnyError::new(&error))))
            }
            Err(error) => {
                // The Raft library reports it as an ERROR of its own, held back (`log_gate`):
                // a member being restarted is normal operation, said here at INFO.
                if let Some(unlogged) = UNREACHABLE.pass() {
                    tracing::info!(
                        member = %self.address,
                        unlogged,
                        "the policy log cannot reach a member (restarting, stopped or cut off; its state shows in /v1/cluster): {error}"
                    );
                }
                Err(RPCError::Unreachable(Unreachable::new(&AnyError::new(
                    &error,
                ))))
            }
        }
    }
}

/// Calls to a member of the policy log that could not reach it, logged once a minute.
static UNREACHABLE: crate::log_gate::LogGate = crate::log_gate::LogGate::new();

impl RaftNetwork<PolicyRaft> for Member {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<PolicyRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.send::<_, _, Fatal<u64>, _>(&rpc, &option, |c, r| Box::pin(c.append_entries(r)))
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<PolicyRaft>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        self.send::<_, _, RaftError<u64, InstallSnapshotError>, _>(&rpc, &option, |c, r| {
            Box::pin(c.install_snapshot(r))
        })
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.send::<_, _, Fatal<u64>, _>(&rpc, &option, |c, r| Box::pin(c.vote(r)))
            .await
    }
}
