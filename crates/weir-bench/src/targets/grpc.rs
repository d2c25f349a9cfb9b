//! A server's gRPC API, one unary call per request.

use anyhow::Context;
use tonic::transport::Channel;
use weir_api::grpc::weir_client::WeirClient;
use weir_api::grpc::{AcquireRequest, AcquireResponse, ReleaseRequest};
use weir_api::http::AcquireBody;

use super::{Answer, Target};
use crate::report::RequestOutcome;

/// Unary `Acquire` and `Release` on one server.
#[derive(Clone)]
pub struct Grpc(pub(super) WeirClient<Channel>);

impl Grpc {
    /// A client of the server at `base` (`http://host:port`).
    pub async fn connect(base: &str) -> anyhow::Result<Self> {
        let client = WeirClient::connect(base.to_owned())
            .await
            .with_context(|| format!("connecting to {base}"))?;
        Ok(Grpc(client))
    }
}

/// The gRPC form of a request; `id` matches a streamed answer to its request.
pub(super) fn request(body: AcquireBody, id: u64) -> AcquireRequest {
    AcquireRequest {
        policy: body.policy,
        key: body.key,
        kind: body.kind,
        cost: body.cost.unwrap_or(1),
        id,
        ..Default::default()
    }
}

/// A gRPC answer as an outcome, with its lease if it holds one.
pub(super) fn answer(answer: AcquireResponse) -> Answer {
    if !answer.error.is_empty() {
        return Err(answer.error);
    }
    match answer.admitted {
        true => Ok((
            RequestOutcome::Admitted,
            Some(answer.lease).filter(|lease| !lease.is_empty()),
        )),
        false => Ok((RequestOutcome::Refused, None)),
    }
}

/// Gives `lease` back over a unary call.
pub(super) async fn release(client: &mut WeirClient<Channel>, lease: String) {
    let _ = client.release(ReleaseRequest { lease }).await;
}

impl Target for Grpc {
    async fn acquire(&mut self, body: AcquireBody) -> Answer {
        match self.0.acquire(request(body, 0)).await {
            Ok(reply) => answer(reply.into_inner()),
            Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
        }
    }

    async fn release(&mut self, lease: String) {
        release(&mut self.0, lease).await;
    }
}
