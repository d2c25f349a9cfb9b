//! The Redis protocol (RESP2 and RESP3): any Redis client throttles through Weir.
//!
//! Many services already throttle through Redis — a Lua script, or redis-cell's
//! `CL.THROTTLE`, which managed Redis offerings cannot load. This listener speaks the
//! protocol their clients already speak: the handshake they send, `CL.THROTTLE` with
//! redis-cell's replies, and `WEIR.*` commands over every configured policy.
//!
//! | file | job |
//! |---|---|
//! | `framing.rs` | cutting requests out of the bytes read, bounded |
//! | `commands/` | each command: what it asks of the core, and its reply (a file per command) |
//! | `reply.rs` | replies, encoded as RESP2 or RESP3 with the `redis-protocol` crate |
//! | `settings.rs` | `[resp]`: where it listens, `CL.THROTTLE`'s key cap, the idle timeout |
//!
//! A connection is one task. It reads what has arrived, runs every whole request in it in
//! order, and writes the replies together — so a pipeline of a thousand requests is a few
//! reads, a thousand decisions and a few writes. Memory per connection is bounded three ways:
//! a request larger than [`MAX_REQUEST`] or with more than [`MAX_ARGS`] arguments is refused
//! before it is buffered (an announced 1 GB bulk string costs nothing); at most
//! [`MAX_PENDING`] replies wait for one that is still being decided, after which nothing more
//! is read; replies are written [`MAX_OUTPUT`] bytes at a time at most; and a client that does
//! not read its replies for [`WRITE_TIMEOUT`] is cut off.
//!
//! Time is bounded as on the HTTP port. A connection that has not given the password within
//! `auth_timeout` is closed, and so is one that starts a request and does not finish it within
//! `command_timeout` (both `server.header_timeout`); one with nothing asked of it for
//! `idle_timeout` (`resp.idle_timeout`, 0 = never, as Redis's `timeout`) is closed too.
//! At `max_connections`, the connection silent longest makes room for a newcomer (`room.rs`),
//! so sockets that connect and say nothing cannot lock the port. A connection that ends stops
//! the commands still being decided for it. A
//! malformed request gets its error, then the connection closes: the bytes after it cannot be
//! told apart into requests any more. The server goes on. Each command is counted in
//! `weir_api_requests{api="resp"}` under its name (`other` for names Weir does not answer).

mod commands;
mod framing;
mod metrics;
mod reply;
mod room;
pub mod settings;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::tls::{Listener, Tls};
use commands::{Answer, Session};
use framing::Limits;
use reply::Reply;
use room::{Room, Seat};

/// The largest request, in bytes. Weir's commands are short: a key is at most 256 bytes.
pub const MAX_REQUEST: usize = 64 * 1024;
/// The most arguments in one request.
pub const MAX_ARGS: usize = 1024;
/// Replies held back behind one still being decided before the connection stops reading.
pub const MAX_PENDING: usize = 1024;
/// How long a write may wait for a client to read its replies.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most reply bytes encoded before they are written: a connection's output buffer stays
/// about this size whatever it is asked.
pub const MAX_OUTPUT: usize = 64 * 1024;

const LIMITS: Limits = Limits {
    max_request: MAX_REQUEST,
    max_args: MAX_ARGS,
};

/// Serves the Redis protocol on `listener` until the drain, with `[server]`'s bounds and
/// `[resp]`'s.
pub fn start(
    app: &Arc<App>,
    listener: TcpListener,
    server: &crate::config::ServerSettings,
    resp: &settings::RespTable,
    tls: Option<Arc<Tls>>,
) -> JoinHandle<()> {
    tokio::spawn(serve(
        listener,
        Arc::clone(app),
        server.max_connections,
        ConnectionLimits {
            auth_timeout: server.header_timeout,
            command_timeout: server.header_timeout,
            idle_timeout: Some(resp.idle_timeout).filter(|t| !t.is_zero()),
        },
        tls,
    ))
}

/// Serves the Redis protocol on `listener` until shutdown begins, at most `max_connections`
/// at once: at the cap, a newcomer is let in when a connection closes, or in place of the one
/// silent longest (see `room.rs`).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    max_connections: usize,
    limits: ConnectionLimits,
    tls: Option<Arc<Tls>>,
) {
    let closed = metrics::Closed::registered(&app);
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let room = Arc::new(Room::default());
    let epoch = tokio::time::Instant::now();
    let ids = Arc::new(AtomicI64::new(1));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = app.health().shutting_down() => return,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let Some(slot) = room_for_one(&slots, &room, epoch, &app, &closed).await else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let id = ids.fetch_add(1, Ordering::Relaxed);
        let seat = room.enter(id, since(epoch));
        let tls = tls.as_ref().map(|tls| tls.acceptor(Listener::Resp));
        let closed = closed.clone();
        tokio::spawn(async move {
            let ended = match tls {
                None => connection(stream, &app, id, limits, (&seat, epoch), &closed).await,
                // The handshake is bounded like the AUTH that follows it.
                // It may also be cut short to make room, like a silent connection.
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.auth_timeout, acceptor.accept(stream));
                    let shaken = tokio::select! {
                        shaken = handshake => shaken,
                        () = seat.occupant().evicted() => Ok(Err(evicted())),
                    };
                    match shaken {
                        Ok(Ok(stream)) => {
                            connection(stream, &app, id, limits, (&seat, epoch), &closed).await
                        }
                        Ok(Err(error)) => Err(error),
                        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
                    }
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "a Redis-protocol connection ended");
            }
            drop(seat);
            drop(slot);
        });
    }
}

/// Why a connection closed to make room ended.
fn evicted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "closed to make room for a new connection",
    )
}

/// Nanoseconds since `epoch`, the room's clock.
fn since(epoch: tokio::time::Instant) -> u64 {
    nanos_between(epoch, tokio::time::Instant::now())
}

/// Nanoseconds from `epoch` to `at` (0 if `at` is earlier).
fn nanos_between(epoch: tokio::time::Instant, at: tokio::time::Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// A slot for a connection just accepted: a free one, or one that a silent connection gives
/// up (asked again while none has been silent long enough). `None` once shutdown begins.
async fn room_for_one(
    slots: &Arc<Semaphore>,
    room: &Room,
    epoch: tokio::time::Instant,
    app: &App,
    closed: &metrics::Closed,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        return Some(slot);
    }
    let mut asked = tokio::time::interval(room::MIN_SILENCE / 4);
    loop {
        tokio::select! {
            slot = Arc::clone(slots).acquire_owned() => return slot.ok(),
            _ = asked.tick() => {
                if let Some(id) = room.make_room(since(epoch)) {
                    tracing::debug!(connection = id, "closing a silent Redis-protocol connection to make room");
                    closed.count("evicted");
                }
            }
            () = app.health().shutting_down() => return None,
        }
    }
}

/// A reply in the order of its request: ready, or still being decided (with what it is
/// counted under, and when it was asked); and whether it is written in RESP3 — the protocol
/// in force when it was asked, since a later `HELLO` must not change an earlier reply.
enum Pending {
    Ready(Reply, bool),
    Deciding(JoinHandle<Reply>, &'static str, Instant, bool),
}

/// A connection's replies not yet written. Dropped with the connection, it stops the commands
/// still being decided for it: a client that has gone takes no tokens and holds no leases.
#[derive(Default)]
struct Pipeline(VecDeque<Pending>);

impl Drop for Pipeline {
    fn drop(&mut self) {
        for pending in &self.0 {
            if let Pending::Deciding(task, ..) = pending {
                task.abort();
            }
        }
    }
}

/// Counts a command's answer in `weir_api_requests{api="resp"}` and its time.
fn count(app: &App, command: &'static str, reply: &Reply, asked: Instant) {
    app.metrics()
        .observe("resp", command, code_of(reply), asked.elapsed());
}

/// A reply's `code` label.
fn code_of(reply: &Reply) -> &'static str {
    match reply {
        Reply::Error(_) => "error",
        _ => "ok",
    }
}

/// What a connection is allowed to take.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a connection may stay without giving the password, when one is asked for.
    pub auth_timeout: Duration,
    /// How long a request may take to arrive whole, from its first byte.
    pub command_timeout: Duration,
    /// How long a connection with nothing asked of it is kept; `None`: for ever.
    pub idle_timeout: Option<Duration>,
}

/// One connection, until the client leaves, sends what cannot be read, stops reading its
/// replies, or the server shuts down.
async fn connection(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    app: &Arc<App>,
    id: i64,
    limits: ConnectionLimits,
    (seat, epoch): (&Seat, tokio::time::Instant),
    closed: &metrics::Closed,
) -> std::io::Result<()> {
    let occupant = seat.occupant();
    let mut session = Session::new(id, app);
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = BytesMut::with_capacity(16 * 1024);
    let mut pending = Pipeline::default();
    // No more requests are taken (QUIT, or a request that cannot be read); no more bytes are
    // read (that, or the client has closed its side: what it sent is still answered).
    let mut done_taking = false;
    let mut done_reading = false;
    let mut shutting_down = false;
    let auth_deadline = tokio::time::Instant::now() + limits.auth_timeout;
    // When the request at the head of `input` began arriving (`None`: nothing partial), and
    // when the client last completed a request.
    let mut command_started: Option<tokio::time::Instant> = None;
    let mut last_request = tokio::time::Instant::now();
    // The commands of one read answered at once, counted together after it (see below).
    let mut answered: Vec<(&'static str, &'static str)> = Vec::new();
    occupant.set_authenticated(session.authenticated);
    loop {
        // Before running anything read: a connection the room has chosen to close runs
        // nothing more (and one that has begun is not chosen).
        if !input.is_empty() && !occupant.work() {
            return Err(evicted());
        }
        // Every whole request read so far, in order, as long as replies can be held; whole
        // requests may be left in the buffer (held back) when they cannot.
        let mut held_back = false;
        let mut took_any = false;
        // When the first request of this read was taken: every request of a pipeline is timed
        // from there, so a read of many pays for two clock reads, not two each.
        let mut batch_start: Option<Instant> = None;
        while !done_taking {
            if pending.0.len() >= MAX_PENDING {
                held_back = true;
                break;
            }
            match framing::next_request(&mut input, LIMITS) {
                Ok(Some(args)) => {
                    let asked = *batch_start.get_or_insert_with(Instant::now);
                    took_any = true;
                    let command = args
                        .first()
                        .map_or("other", |name| commands::counted_as(name));
                    let resp3 = session.resp3;
                    match commands::run(app, &mut session, command, args) {
                        Answer::Now(reply) => {
                            answered.push((command, code_of(&reply)));
                            pending.0.push_back(Pending::Ready(reply, session.resp3));
                        }
                        Answer::Later(task) => {
                            pending
                                .0
                                .push_back(Pending::Deciding(task, command, asked, resp3));
                        }
                        Answer::Close(reply) => {
                            answered.push((command, code_of(&reply)));
                            pending.0.push_back(Pending::Ready(reply, resp3));
                            done_taking = true;
                        }
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    pending
                        .0
                        .push_back(Pending::Ready(Reply::err(error), session.resp3));
                    done_taking = true;
                }
            }
        }
        // Each command answered at once took as long as the read's commands took to answer.
        if let Some(start) = batch_start
            && !answered.is_empty()
        {
            let took = start.elapsed();
            for (command, code) in answered.drain(..) {
                app.metrics().observe("resp", command, code, took);
            }
        }
        // Once a read's worth of requests, not per request: a pipeline of a thousand pays for
        // one clock read here.
        if took_any {
            last_request = tokio::time::Instant::now();
            occupant.requested(nanos_between(epoch, last_request));
            occupant.set_authenticated(session.authenticated);
        }
        // A request begun and not yet whole: timed from when its first bytes were seen.
        if input.is_empty() || held_back {
            command_started = None;
        } else if command_started.is_none() || took_any {
            command_started = Some(tokio::time::Instant::now());
        }
        // The replies that are ready, up to the first one still being decided, as many as fit
        // one write.
        while output.len() < MAX_OUTPUT && matches!(pending.0.front(), Some(Pending::Ready(..))) {
            if let Some(Pending::Ready(reply, resp3)) = pending.0.pop_front() {
                reply.encode(&mut output, resp3);
            }
        }
        if !output.is_empty() {
            match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&output)).await {
                Ok(written) => written?,
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client did not read its replies",
                    ));
                }
            }
            output.clear();
            if let Some(Pending::Ready(..)) = pending.0.front() {
                continue;
            }
        }
        if pending.0.is_empty() {
            occupant.rest();
        }
        if pending.0.is_empty() && (done_taking || (done_reading && !held_back)) {
            return Ok(());
        }
        // Requests held back while replies were full: take them before reading more.
        if held_back && pending.0.len() < MAX_PENDING {
            continue;
        }
        let reading = !done_reading && !done_taking && pending.0.len() < MAX_PENDING;
        let awaiting_auth = !session.authenticated;
        let idle = input.is_empty() && pending.0.is_empty();
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        let command_deadline = command_started.map_or(far, |at| at + limits.command_timeout);
        let idle_deadline = limits
            .idle_timeout
            .map_or(far, |timeout| last_request + timeout);
        tokio::select! {
            read = stream.read_buf(&mut input), if reading => {
                if read? == 0 {
                    done_reading = true;
                }
            }
            decided = wait_front(&mut pending.0) => {
                if let Some(Pending::Deciding(_, command, asked, resp3)) = pending.0.front() {
                    count(app, command, &decided, *asked);
                    let resp3 = *resp3;
                    pending.0[0] = Pending::Ready(decided, resp3);
                }
            }
            () = tokio::time::sleep_until(auth_deadline), if awaiting_auth => {
                closed.count("auth_timeout");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not give the password in time",
                ));
            }
            () = tokio::time::sleep_until(command_deadline), if reading && command_started.is_some() => {
                closed.count("command_timeout");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not finish its request within `server.header_timeout`",
                ));
            }
            () = tokio::time::sleep_until(idle_deadline), if idle && limits.idle_timeout.is_some() => {
                // As Redis does at its `timeout`: closed without a word.
                closed.count("idle_timeout");
                return Ok(());
            }
            () = occupant.evicted() => return Err(evicted()),
            () = app.health().shutting_down(), if !shutting_down => {
                // A waiting acquire answers for itself (the core refuses it on shutdown).
                shutting_down = true;
                done_taking = true;
                if pending.0.is_empty() {
                    return Ok(());
                }
            }
        }
    }
}

/// The first pending reply once it is decided; never, if it is ready or there is none (the
/// loop takes ready ones itself).
async fn wait_front(pending: &mut VecDeque<Pending>) -> Reply {
    match pending.front_mut() {
        Some(Pending::Deciding(task, ..)) => task
            .await
            .unwrap_or_else(|error| Reply::err(format!("the command failed: {error}"))),
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
