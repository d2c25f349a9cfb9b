//! `weir bench floor`: the frameworks' own floor, to measure Weir's front doors against.
//!
//! A server that does everything Weir's HTTP and gRPC front doors do *except* deciding: the
//! HTTP side is a bare axum route that parses the same JSON body into the same type
//! ([`AcquireBody`]) and answers a fixed [`Admission`]; the gRPC side is a bare tonic service
//! of Weir's own `Weir` service definition whose `Acquire` and `AcquireStream` answer a fixed
//! [`AcquireResponse`] carrying the request's id. Whatever a request costs this server, Weir
//! cannot cost less; what Weir costs beyond it is Weir's plumbing plus its decision
//! (`bench/floor.sh` puts the two side by side, by server CPU and by instructions).
//!
//! Both are served the frameworks' default way (`axum::serve`, tonic's `Server`, each without
//! Nagle's delay as Weir's listeners are), with none of Weir's timeouts, metrics or shutdown
//! handling: that is the point of a floor.

use std::net::SocketAddr;
use std::pin::Pin;

use axum::routing::post;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use weir_api::grpc::weir_server::{Weir, WeirServer};
use weir_api::grpc::{
    AcquireRequest, AcquireResponse, BusyRequest, BusyResponse, ReleaseRequest, ReleaseResponse,
    RenewRequest, RenewResponse, StatsRequest, StatsResponse, ThrottlesRequest, ThrottlesResponse,
};
use weir_api::http::{AcquireBody, Admission};

/// Serves the floor on `http` and `grpc` (port 0: any free port) until the process is
/// stopped, after printing `listening http=ADDR grpc=ADDR` as `weir serve` does.
pub async fn serve(http: SocketAddr, grpc: SocketAddr) -> anyhow::Result<()> {
    let router = Router::new().route("/v1/acquire", post(acquire));
    let http_listener = tokio::net::TcpListener::bind(http).await?;
    let grpc_listener = tokio::net::TcpListener::bind(grpc).await?;
    println!(
        "listening http={} grpc={}",
        http_listener.local_addr()?,
        grpc_listener.local_addr()?
    );
    // Without Nagle's delay, as Weir's listeners: a small answer is sent at once.
    let http_listener = http_listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener).map(|accepted| {
        accepted.inspect(|tcp| {
            let _ = tcp.set_nodelay(true);
        })
    });
    let grpc_server = tonic::transport::Server::builder()
        .add_service(WeirServer::new(Floor))
        .serve_with_incoming(incoming);
    let http_server = axum::serve(http_listener, router);
    tokio::select! {
        served = http_server => served?,
        served = grpc_server => served?,
    }
    Ok(())
}

async fn acquire(Json(body): Json<AcquireBody>) -> Json<Admission<'static>> {
    // Read the body as Weir does, so the parse is not optimised away.
    std::hint::black_box(&body);
    Json(admitted_body())
}

fn admitted_body() -> Admission<'static> {
    Admission {
        admitted: true,
        waited_ms: 0,
        tier: "node".into(),
        lease: None,
        lease_ttl_ms: None,
        would_throttle: false,
    }
}

fn admitted(request: &AcquireRequest) -> AcquireResponse {
    std::hint::black_box(request);
    AcquireResponse {
        admitted: true,
        tier: "node".into(),
        id: request.id,
        ..Default::default()
    }
}

/// The bare gRPC service: `Acquire` and `AcquireStream` admit everything; the rest are not
/// part of the floor.
#[derive(Debug, Clone, Copy)]
struct Floor;

type AcquireStream = Pin<Box<dyn Stream<Item = Result<AcquireResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Weir for Floor {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        Ok(Response::new(admitted(request.get_ref())))
    }

    async fn release(
        &self,
        _: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    async fn renew(&self, _: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    async fn busy(&self, _: Request<BusyRequest>) -> Result<Response<BusyResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    async fn throttles(
        &self,
        _: Request<ThrottlesRequest>,
    ) -> Result<Response<ThrottlesResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    async fn stats(&self, _: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    type AcquireStreamStream = AcquireStream;

    async fn acquire_stream(
        &self,
        request: Request<Streaming<AcquireRequest>>,
    ) -> Result<Response<Self::AcquireStreamStream>, Status> {
        let answers = request
            .into_inner()
            .map(|request| request.map(|request| admitted(&request)));
        Ok(Response::new(Box::pin(answers)))
    }
}
