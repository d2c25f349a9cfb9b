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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;

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

/// How the HTTP listener bounds its clients.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// How long a client has to send a request's head, from when the server waits for it.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets each
/// connection finish the request it is on (hyper's graceful shutdown), and returns when all
/// are closed.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // HTTP/2 has no header timeout of its own: a peer that stops answering pings is dropped.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.header_timeout)
        .keep_alive_timeout(Duration::from_secs(20));
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A slot first: at the cap, connections wait in the backlog, not in memory here.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted: keep
                    // serving the connections there are, and try again shortly.
                    tracing::warn!("accepting an HTTP connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // See `serve::without_nagle`.
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // Telling HTTP/1 from HTTP/2 waits for the first bytes, with no timer of its own:
            // a connection that never sends is closed here.
            let mut first = [0u8; 1];
            let spoke = tokio::time::timeout(limits.header_timeout, tcp.peek(&mut first)).await;
            if !matches!(spoke, Ok(Ok(1))) {
                drop(slot);
                return;
            }
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                .into_owned();
            // A connection's end (a timeout, a reset) is the client's business, not an error
            // of the server's.
            let _ = watcher.watch(connection).await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
