//! `pb.gubernator.V1` over gRPC: `GetRateLimits`, `HealthCheck`, `LiveCheck`, on a listener
//! of its own (`[gubernator] listen`), as Gubernator's clients dial it.
//!
//! The service is routed by hand, as tonic's generated servers are (a path per method, prost's
//! codec), so that nothing outside this folder is generated for it.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::Gubernator;
use super::wire::{
    GetRateLimitsReq, GetRateLimitsResp, HealthCheckReq, HealthCheckResp, LiveCheckReq,
    LiveCheckResp,
};

/// The `pb.gubernator.V1` service.
#[derive(Clone)]
pub struct V1Server {
    door: Arc<Gubernator>,
}

impl V1Server {
    /// The service over `door`'s buckets.
    pub fn new(door: Arc<Gubernator>) -> Self {
        V1Server { door }
    }
}

impl NamedService for V1Server {
    const NAME: &'static str = "pb.gubernator.V1";
}

/// One unary method: the door and what it does with a request.
struct Method<F>(Arc<Gubernator>, F);

impl<Req, Resp, F> UnaryService<Req> for Method<F>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    F: Fn(&Gubernator, Request<Req>) -> Result<Resp, Status> + Copy + Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Response<Resp>, Status>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let (door, method) = (Arc::clone(&self.0), self.1);
        Box::pin(async move { method(&door, request).map(Response::new) })
    }
}

fn get_rate_limits(
    door: &Gubernator,
    request: Request<GetRateLimitsReq>,
) -> Result<GetRateLimitsResp, Status> {
    crate::front_door::grpc::check_data_token(&door.app, &request)?;
    door.get_rate_limits(request.get_ref())
}

fn health_check(
    door: &Gubernator,
    _request: Request<HealthCheckReq>,
) -> Result<HealthCheckResp, Status> {
    let health = door.health_check();
    // Gubernator answers an unhealthy node with UNAVAILABLE, its message the reason.
    if health.status != super::HEALTHY {
        return Err(Status::unavailable(health.message));
    }
    Ok(health)
}

fn live_check(
    _door: &Gubernator,
    _request: Request<LiveCheckReq>,
) -> Result<LiveCheckResp, Status> {
    Ok(LiveCheckResp {})
}

impl<B> tower::Service<http::Request<B>> for V1Server
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let door = Arc::clone(&self.door);
        match request.uri().path() {
            "/pb.gubernator.V1/GetRateLimits" => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Method(door, get_rate_limits), request).await)
            }),
            "/pb.gubernator.V1/HealthCheck" => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Method(door, health_check), request).await)
            }),
            "/pb.gubernator.V1/LiveCheck" => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Method(door, live_check), request).await)
            }),
            path => {
                let unknown = Status::unimplemented(format!("no method {path}"));
                Box::pin(async move { Ok(unknown.into_http()) })
            }
        }
    }
}
