//! A member's side of the policy log's calls: Raft's messages handed to Raft, a change
//! proposed if this member leads, the read barrier, whether its log has started, and a voter
//! forgotten by an operator's command.

use std::sync::Arc;

use openraft::error::{Fatal, InstallSnapshotError, RaftError};
use serde::de::DeserializeOwned;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};
use weir_cluster::grpc::proto::RaftBody;
use weir_cluster::grpc::proto::policy_log_server::{PolicyLog as PolicyLogRpc, PolicyLogServer};
use weir_cluster::secret::RequireToken;

use super::network::body_of;
use super::{PolicyLog, change::Change};

/// The service, behind the cluster's token check.
pub type GuardedPolicyLog = InterceptedService<PolicyLogServer<Service>, RequireToken>;

/// The policy log's gRPC service.
#[derive(Debug)]
pub struct Service {
    log: Arc<PolicyLog>,
}

impl PolicyLog {
    /// This member's service, refusing calls without `require`'s token.
    pub fn service(self: &Arc<Self>, require: RequireToken) -> GuardedPolicyLog {
        PolicyLogServer::with_interceptor(
            Service {
                log: Arc::clone(self),
            },
            require,
        )
    }
}

impl Service {
    /// Refuses a call from another cluster's log (see [`super::identity`]); `from_leader` for
    /// an append or a snapshot, whose identity a member without one takes.
    fn admit(&self, request: &Request<RaftBody>, from_leader: bool) -> Result<(), Status> {
        let theirs = request
            .metadata()
            .get(super::identity::HEADER)
            .and_then(|value| value.to_str().ok());
        self.log
            .admit_call(theirs, from_leader)
            .map_err(Status::failed_precondition)
    }
}

fn decode<T: DeserializeOwned>(request: Request<RaftBody>) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().json).map_err(|e| {
        Status::invalid_argument(format!("a policy log message that does not parse: {e}"))
    })
}

fn reply(message: &impl serde::Serialize) -> Result<Response<RaftBody>, Status> {
    Ok(Response::new(body_of(message)))
}

/// Raft's error of an append or a vote, as it crosses: only `Fatal` can happen.
fn fatal_of(error: RaftError<u64>) -> Fatal<u64> {
    match error {
        RaftError::Fatal(fatal) => fatal,
        RaftError::APIError(never) => match never {},
    }
}

#[tonic::async_trait]
impl PolicyLogRpc for Service {
    async fn append_entries(
        &self,
        request: Request<RaftBody>,
    ) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, true)?;
        let answer = self.log.raft().append_entries(decode(request)?).await;
        reply(&answer.map_err(fatal_of))
    }

    async fn vote(&self, request: Request<RaftBody>) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, false)?;
        let answer = self.log.raft().vote(decode(request)?).await;
        reply(&answer.map_err(fatal_of))
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftBody>,
    ) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, true)?;
        let answer: Result<_, RaftError<u64, InstallSnapshotError>> =
            self.log.raft().install_snapshot(decode(request)?).await;
        reply(&answer)
    }

    async fn propose(&self, request: Request<RaftBody>) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, false)?;
        let change: Change = decode(request)?;
        reply(&self.log.propose_here(change).await)
    }

    async fn read_index(&self, request: Request<RaftBody>) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, false)?;
        reply(&self.log.read_index_here().await)
    }

    async fn started(&self, _request: Request<RaftBody>) -> Result<Response<RaftBody>, Status> {
        reply(&self.log.started().await)
    }

    async fn forget(&self, request: Request<RaftBody>) -> Result<Response<RaftBody>, Status> {
        self.admit(&request, false)?;
        let node: String = decode(request)?;
        reply(&self.log.forget_here(&node).await)
    }
}
