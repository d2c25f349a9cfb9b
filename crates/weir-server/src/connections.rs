//! Accepting connections: the listen backlog, a cap on connections served at once, and the
//! HTTP timeouts that keep a slow or silent client from holding a connection forever.
//!
//! `axum::serve` has no timeouts: a client sending its headers a byte a second, or opening a
//! connection and sending nothing, kept it for as long as it liked. Here each connection is
//! served by hyper directly with a header-read timeout. hyper starts that timer whenever it
//! waits for a request's head — on a new connection and between requests on a kept-alive one —
//! so the same timeout bounds a slow sender, a silent connection and an idle keep-alive (and a
//! connection that sends nothing at all is closed here, before hyper reads the first bytes to
//! tell HTTP/1 from HTTP/2). The body's timeout is kept where the body is read, in the HTTP
//! API's JSON extractor.
//!
//! Over TLS the same timeout bounds the handshake, and then the wait for the first bytes
//! (read into a buffer, since TLS cannot be peeked at).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use atomic_waker::AtomicWaker;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::log_gate::LogGate;
use crate::tls::{Listener, Tls};
use header_timer::HeaderTimer;

mod header_timer;

/// A listener on `addr` with a listen backlog of `backlog`.
///
/// `TcpListener::bind` asks for 128, which a burst of new connections overflows: the kernel
/// then drops SYNs, and each client waits a whole second to retransmit.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The first byte of a TLS connection: a handshake record's content type.
pub(crate) const TLS_HANDSHAKE: u8 = 0x16;

/// Answers a client that sent plain HTTP to a TLS port with a plain `400` that says so, then
/// closes. The request is read only to be dropped — the answer is the same whatever it asked —
/// and the client's side is drained before closing (for a second at most), since closing a
/// socket with unread bytes resets it and can take the answer with it.
async fn refuse_plain_http(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: &str = r#"{"error":"tls_required","detail":"this port serves HTTPS: send the request over TLS (https://)"}"#;
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let mut dropped = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.read(&mut dropped).await;
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await?;
        while tcp.read(&mut dropped).await? > 0 {}
        Ok::<(), io::Error>(())
    })
    .await;
}

/// What the HTTP listener serves: the HTTP API's router (named by its bounds, so that this
/// module does not depend on the front door that depends on it).
pub trait HttpService:
    tower::Service<
        axum::http::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: tower::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// How the HTTP listener bounds its clients.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// How long a client has to send a request's head, from when the server waits for it.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

/// Serves `router` on `listener` (over `tls` if given) until `shutdown` resolves; then stops
/// accepting, lets each connection finish the request it is on (hyper's graceful shutdown),
/// and returns when all are closed.
pub async fn serve_http<S>(
    listener: TcpListener,
    router: S,
    limits: HttpLimits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()>,
) where
    S: HttpService,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Each connection gets a header timer of its own (`header_timer.rs`).
    builder.http1().header_read_timeout(limits.header_timeout);
    // HTTP/2 has no header timeout of its own: a peer that stops answering pings is dropped.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.header_timeout)
        .keep_alive_timeout(Duration::from_secs(20));
    let draining = Arc::new(Draining::default());
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A slot first: at the cap, connections wait in the backlog, not in memory here.
        static GATE: LogGate = LogGate::new();
        let accepting = next_connection(&listener, &slots, ("an HTTP", &GATE));
        let Some((slot, tcp)) = (tokio::select! {
            next = accepting => next,
            () = &mut shutdown => None,
        }) else {
            break;
        };
        let service = TowerToHyperService::new(router.clone());
        let mut builder = builder.clone();
        builder.http1().timer(HeaderTimer::default());
        let draining = Arc::clone(&draining);
        let tls = tls.as_ref().map(|tls| tls.acceptor(Listener::Http));
        tokio::spawn(async move {
            match tls {
                None => {
                    // Telling HTTP/1 from HTTP/2 waits for the first bytes, with no timer of
                    // its own: a connection that never sends is closed here.
                    let mut first = [0u8; 1];
                    let spoke = draining
                        .unless_begun(tokio::time::timeout(
                            limits.header_timeout,
                            tcp.peek(&mut first),
                        ))
                        .await;
                    if matches!(spoke, Some(Ok(Ok(1)))) {
                        serve_connection(builder, tcp, service, &draining).await;
                    }
                }
                Some(acceptor) => {
                    // A TLS client opens with a handshake record (0x16); anything else is a
                    // client speaking plain HTTP to a TLS port, told so in plain HTTP rather
                    // than with a TLS alert it cannot read.
                    let mut first = [0u8; 1];
                    let spoke = draining
                        .unless_begun(tokio::time::timeout(
                            limits.header_timeout,
                            tcp.peek(&mut first),
                        ))
                        .await;
                    if !matches!(spoke, Some(Ok(Ok(1)))) {
                        drop(slot);
                        return;
                    }
                    if first[0] != TLS_HANDSHAKE {
                        refuse_plain_http(tcp).await;
                        drop(slot);
                        return;
                    }
                    let handshake = draining
                        .unless_begun(tokio::time::timeout(
                            limits.header_timeout,
                            acceptor.accept(tcp),
                        ))
                        .await;
                    if let Some(Ok(Ok(stream))) = handshake {
                        // No peek through TLS: the first bytes are waited for in a buffer
                        // hyper then reads from, under the same timeout.
                        let mut stream = tokio::io::BufReader::new(stream);
                        let spoke = draining
                            .unless_begun(tokio::time::timeout(
                                limits.header_timeout,
                                tokio::io::AsyncBufReadExt::fill_buf(&mut stream),
                            ))
                            .await;
                        if matches!(spoke, Some(Ok(Ok(first))) if !first.is_empty()) {
                            serve_connection(builder, stream, service, &draining).await;
                        }
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    draining.start();
    // Every connection holds a slot until it has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// The next connection with a slot to serve it in, TCP_NODELAY set (see [`accept_grpc`]); `None`
/// only if the slots are closed, which they never are. An accept that fails — out of
/// descriptors, a connection reset before it was accepted — leaves the connections there are
/// served and is tried again shortly, logged (`what`'s gate) at most once a minute.
async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    (what, gate): (&str, &'static LogGate),
) -> Option<(OwnedSemaphorePermit, TcpStream)> {
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                let _ = tcp.set_nodelay(true);
                return Some((slot, tcp));
            }
            Err(e) => {
                if let Some(unlogged) = gate.pass() {
                    tracing::warn!(
                        unlogged,
                        "accepting {what} connection (logged at most once a minute): {e}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The gRPC listener's connections, for tonic's `serve_with_incoming`: each after its TLS
/// handshake (with `tls`), and once it has sent its first bytes, with TCP_NODELAY set: HTTP/2
/// writes each frame with a syscall of its own, and with Nagle's algorithm on, a small frame
/// that follows another waits for the peer's delayed ACK — up to 40 ms on Linux, which showed
/// as 40 ms stalls between nodes.
///
/// An HTTP/2 client sends its connection preface as soon as it connects; hyper waits for it
/// with no timer of its own, so a client that connects (and shakes hands) and then says
/// nothing would hold its connection for ever. Here the handshake and the first bytes are
/// waited for within `first_bytes_timeout`, side by side, so that a slow client does not hold
/// up the others; at most `max_pending` at once (more wait in the listen backlog), so that a
/// flood of silent connections cannot take every descriptor. One that fails is the client's
/// business and is dropped here. Accepting stops, and the listener closes, when `shutdown`
/// resolves or the stream is dropped.
pub fn accept_grpc(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    first_bytes_timeout: Duration,
    max_pending: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl tokio_stream::Stream<Item = io::Result<GrpcConnection>> {
    let (ready, accepted) = tokio::sync::mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(max_pending.max(1)));
    tokio::spawn(async move {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            static GATE: LogGate = LogGate::new();
            let accepting = next_connection(&listener, &slots, ("a gRPC", &GATE));
            let Some((slot, tcp)) = (tokio::select! {
                next = accepting => next,
                () = &mut shutdown => None,
                () = ready.closed() => None,
            }) else {
                return;
            };
            let acceptor = tls.as_ref().map(|tls| tls.acceptor(Listener::Grpc));
            let ready = ready.clone();
            tokio::spawn(async move {
                let opened = tokio::time::timeout(first_bytes_timeout, async move {
                    match acceptor {
                        None => {
                            let mut first = [0u8; 1];
                            match tcp.peek(&mut first).await? {
                                0 => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                                _ => Ok(GrpcConnection::Plain(tcp)),
                            }
                        }
                        Some(acceptor) => {
                            let mut stream = tokio::io::BufReader::new(acceptor.accept(tcp).await?);
                            match tokio::io::AsyncBufReadExt::fill_buf(&mut stream)
                                .await?
                                .len()
                            {
                                0 => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                                _ => Ok(GrpcConnection::Tls(Box::new(stream))),
                            }
                        }
                    }
                })
                .await;
                drop(slot);
                match opened {
                    Ok(Ok(connection)) => {
                        let _ = ready.send(Ok(connection)).await;
                    }
                    Ok(Err(e)) => tracing::debug!("a gRPC connection ended before a request: {e}"),
                    Err(_) => tracing::debug!("a gRPC connection sent nothing in time"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(accepted)
}

/// A gRPC server as every gRPC listener of a node runs one: a peer that stops answering pings
/// is dropped, not kept for ever.
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
}

/// Serves `router` on `listener`, its connections accepted as [`accept_grpc`] bounds them
/// (`first_bytes_timeout`, `max_pending`), until `shutting_down()` resolves; logs, naming
/// `what`, if the server stops on an error.
pub async fn serve_grpc<F>(
    router: tonic::transport::server::Router,
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    (first_bytes_timeout, max_pending): (Duration, usize),
    shutting_down: impl Fn() -> F,
    what: &str,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let incoming = accept_grpc(
        listener,
        tls,
        first_bytes_timeout,
        max_pending,
        shutting_down(),
    );
    if let Err(error) = router
        .serve_with_incoming_shutdown(incoming, shutting_down())
        .await
    {
        tracing::error!(%error, "{what} stopped");
    }
}

/// A gRPC connection, plain or over TLS (its first bytes already read into the buffer).
#[derive(Debug)]
pub enum GrpcConnection {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, read through a buffer.
    Tls(Box<tokio::io::BufReader<TlsStream<TcpStream>>>),
}

impl tonic::transport::server::Connected for GrpcConnection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            GrpcConnection::Plain(tcp) => tcp.connect_info(),
            GrpcConnection::Tls(stream) => stream.get_ref().get_ref().0.connect_info(),
        }
    }
}

impl tokio::io::AsyncRead for GrpcConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcConnection::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            GrpcConnection::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for GrpcConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            GrpcConnection::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            GrpcConnection::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            GrpcConnection::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            GrpcConnection::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            GrpcConnection::Plain(tcp) => tcp.is_write_vectored(),
            GrpcConnection::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcConnection::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            GrpcConnection::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcConnection::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            GrpcConnection::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Serves one connection until it closes, or, once draining, until the request it is on is
/// answered. A connection's end (a timeout, a reset) is the client's business, not an error
/// of the server's.
async fn serve_connection<I, S>(
    builder: auto::Builder<TokioExecutor>,
    io: I,
    service: TowerToHyperService<S>,
    draining: &Arc<Draining>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: HttpService,
{
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .into_owned();
    let _ = Arc::clone(draining).watch(connection).await;
}

/// Tells the open connections that the server is shutting down, so that each finishes the
/// request it is on and closes (hyper's graceful shutdown).
///
/// hyper-util's `GracefulShutdown` does the same with a watch channel whose `changed()` each
/// connection polls every time it is polled (its cost per request: `docs/benchmarks.md`). Here
/// a connection's poll costs a flag's load and its waker's registration, and a shutdown wakes
/// each connection once.
#[derive(Debug, Default)]
struct Draining {
    started: AtomicBool,
    /// Wakes the connections that have not sent their first bytes yet.
    begun: tokio::sync::Notify,
    /// Each open connection's waker, by the connection's number.
    open: Mutex<HashMap<u64, Arc<AtomicWaker>>>,
    next: AtomicU64,
}

impl Draining {
    /// Serves `connection` until it ends, shutting it down gracefully once draining starts.
    async fn watch<C: GracefulConnection>(self: Arc<Self>, connection: C) -> C::Output {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.lock().insert(id, Arc::clone(&waker));
        let output = Watched {
            connection,
            draining: &self,
            waker: &waker,
            told: false,
        }
        .await;
        self.lock().remove(&id);
        output
    }

    /// `wait`'s output, or `None` if draining starts first. A connection that has not sent
    /// its first bytes has no request to finish: waiting its first-bytes timeout out (an HTTP
    /// client may open a connection for its pool and send nothing on it yet) held a stop for
    /// that long.
    async fn unless_begun<F: Future>(&self, wait: F) -> Option<F::Output> {
        let begun = self.begun.notified();
        let mut begun = std::pin::pin!(begun);
        // Enabled before the flag is read: a start in between still wakes it.
        begun.as_mut().enable();
        if self.started.load(Ordering::SeqCst) {
            return None;
        }
        tokio::select! {
            // First bytes that came with the start are a request begun: served.
            biased;
            output = wait => Some(output),
            () = begun => None,
        }
    }

    /// Starts draining: wakes every open connection to tell it.
    fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
        self.begun.notify_waiters();
        for waker in self.lock().values() {
            waker.wake();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<AtomicWaker>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pin_project_lite::pin_project! {
    /// A connection, told to shut down gracefully once draining starts.
    struct Watched<'a, C> {
        #[pin]
        connection: C,
        draining: &'a Draining,
        waker: &'a AtomicWaker,
        told: bool,
    }
}

impl<C: GracefulConnection> Future for Watched<'_, C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        if !*this.told {
            // Registered before the flag is read: a start in between still wakes this task.
            this.waker.register(cx.waker());
            if this.draining.started.load(Ordering::SeqCst) {
                *this.told = true;
                this.connection.as_mut().graceful_shutdown();
            }
        }
        this.connection.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 600 connections nobody has accepted yet all complete their handshake: with the
    /// default backlog of 128, the 130th would wait for SYN retransmits that never succeed
    /// while the queue stays full.
    #[tokio::test]
    async fn a_burst_of_connections_fits_the_backlog() {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)), 1024).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for i in 0..600 {
            let connected =
                tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                    .await
                    .unwrap_or_else(|_| panic!("connection {i} stalled: the backlog is full"));
            held.push(connected.unwrap());
        }
        drop(listener);
    }
}
