//! The plumbing that puts Weir's real gRPC protocol on turmoil's simulated network: a stream
//! the tonic server accepts, a listener's connections as a stream, and a transport whose
//! channels connect over turmoil.

#![allow(dead_code)] // each simulation uses a different part of this

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::Uri;
use weir::TokioClock;
use weir_cluster::grpc::{ClusterService, GrpcTransport};
use weir_cluster::owner::Owner;
use weir_cluster::rates::RateOwner;
use weir_cluster::transport::{BoxFuture, Message, Reply, Transport, TransportError};

/// The port every simulated node serves the cluster protocol on.
pub const PORT: u16 = 9000;

/// A simulated TCP stream the gRPC server can accept.
pub struct SimStream(turmoil::net::TcpStream);

impl tonic::transport::server::Connected for SimStream {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The listener's connections as a stream (accepted by a task of their own).
fn accepted(
    listener: turmoil::net::TcpListener,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<SimStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await.map(|(stream, _)| SimStream(stream));
            if tx.send(accepted).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves `owner`'s side of the protocol on [`PORT`] of the current simulated host, until the
/// host ends, deciding forwarded requests of cluster-scoped rate policies with `rates`.
pub async fn serve(owner: Arc<Owner>, rates: Option<Arc<dyn RateOwner>>) -> turmoil::Result {
    let mut service = ClusterService::new(owner, TokioClock::new());
    if let Some(rates) = rates {
        service = service.with_rates(rates);
    }
    let service = service.into_server(None);
    let listener =
        turmoil::net::TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), PORT)).await?;
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(accepted(listener))
        .await?;
    Ok(())
}

/// A gRPC transport whose channels connect over the simulated network, knowing `nodes` at
/// `http://{id}:{PORT}`.
pub fn transport<'a>(nodes: impl IntoIterator<Item = &'a str>) -> GrpcTransport<TokioClock> {
    let grpc = GrpcTransport::with_connect(
        TokioClock::new(),
        Box::new(|address| {
            let connector = tower::service_fn(|uri: Uri| async move {
                let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
                let stream = turmoil::net::TcpStream::connect(authority).await?;
                Ok::<_, io::Error>(TokioIo::new(stream))
            });
            Some(weir_cluster::grpc::endpoint(address)?.connect_with_connector_lazy(connector))
        }),
    );
    grpc.set_addresses(
        nodes
            .into_iter()
            .map(|id| (id.to_string(), format!("http://{id}:{PORT}")))
            .collect(),
    );
    grpc
}

/// A transport that counts the calls it makes to other nodes.
pub struct Counting<T> {
    /// The transport counted.
    pub inner: T,
    /// Calls made, added to as they are sent.
    pub calls: Arc<std::sync::atomic::AtomicU64>,
}

impl<T: Transport> Transport for Counting<T> {
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.send(owner, message)
    }
}
