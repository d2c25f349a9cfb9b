//! The commands: what each request asks of the core, and its reply.
//!
//! Three groups. The handshake real clients send before anything else — `HELLO`, `AUTH`,
//! `PING`, `ECHO`, `SELECT 0`, `CLIENT …`, `COMMAND …`, `INFO`, `CONFIG GET`, `QUIT`,
//! `RESET` — answered as Redis answers them, so that clients work unmodified. redis-cell's
//! `CL.THROTTLE`. And Weir's own commands over every configured policy, mirroring the HTTP
//! API: `WEIR.ACQUIRE`, `WEIR.RELEASE`, `WEIR.RENEW`, `WEIR.BUSY`. The admin commands stay on
//! the HTTP API. Any of them may be queued between `MULTI` and `EXEC` (redis-py's default
//! pipeline is such a block) and run together.
//!
//! A file per command that does more than answer in a line (`hello.rs`, `auth.rs`,
//! `client.rs`, `command.rs`, `cl_throttle.rs`, `acquire.rs`, `renew.rs`), `transaction.rs` for
//! `MULTI`/`EXEC`/`DISCARD`/`WATCH` together; the one-line answers (`PING`, `ECHO`, `SELECT`,
//! `INFO`, `CONFIG GET`, `QUIT`, `RESET`, `WEIR.RELEASE`, `WEIR.BUSY`) stay in `run`'s match.
//!
//! A command is decided when it is read, in the order the pipeline sends them, except that a
//! `WEIR.ACQUIRE` that has to wait goes on waiting in a task of its own while the commands
//! behind it are decided: its reply, and every reply behind it, is written when it is done,
//! so replies always come back in the order of the requests.

mod acquire;
mod auth;
mod cl_throttle;
mod client;
mod command;
mod hello;
mod renew;
mod transaction;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::reply::Reply;
use crate::app::App;
use crate::error::ApiError;
pub use transaction::Transaction;

/// What a connection has said about itself.
#[derive(Debug)]
pub struct Session {
    /// Its id (`CLIENT ID`, `HELLO`).
    pub id: i64,
    /// Speaks RESP3 (after `HELLO 3`).
    pub resp3: bool,
    /// Has given the password, or none is needed.
    pub authenticated: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// Between `MULTI` and `EXEC`: the commands queued.
    pub transaction: Option<Transaction>,
}

impl Session {
    /// A new connection's session: RESP2, authenticated only if no password is asked for.
    pub fn new(id: i64, app: &App) -> Self {
        Session {
            id,
            resp3: false,
            authenticated: !app.access().needs_data_token(),
            name: None,
            transaction: None,
        }
    }
}

/// A command's answer.
#[derive(Debug)]
pub enum Answer {
    /// Its reply, now.
    Now(Reply),
    /// Its reply when the task ends (a waiting acquire).
    Later(JoinHandle<Reply>),
    /// Its reply, and then the connection closes (`QUIT`).
    Close(Reply),
}

/// The name a command is counted under in `weir_api_requests{api="resp"}`: its own for the
/// commands Weir answers, `other` for the rest (a client's words are never a label).
pub fn counted_as(name: &[u8]) -> &'static str {
    const NAMES: [&str; 21] = [
        "PING",
        "ECHO",
        "HELLO",
        "AUTH",
        "SELECT",
        "CLIENT",
        "COMMAND",
        "INFO",
        "CONFIG",
        "QUIT",
        "RESET",
        "CL.THROTTLE",
        "WEIR.ACQUIRE",
        "WEIR.RELEASE",
        "WEIR.RENEW",
        "WEIR.BUSY",
        "MULTI",
        "EXEC",
        "DISCARD",
        "WATCH",
        "UNWATCH",
    ];
    NAMES
        .iter()
        .find(|known| name.eq_ignore_ascii_case(known.as_bytes()))
        .copied()
        .unwrap_or("other")
}

/// Runs one request (its name first) for the connection `session`; `known` is the name as
/// [`counted_as`] knows it, so a request is classified once.
pub fn run(app: &Arc<App>, session: &mut Session, known: &'static str, args: Vec<Bytes>) -> Answer {
    let Some((first, args)) = args.split_first() else {
        return Answer::Now(Reply::err("empty command"));
    };
    let name = known;
    // Before the password, only what a client needs to give it, or to leave.
    if !session.authenticated && !matches!(name, "AUTH" | "HELLO" | "QUIT" | "RESET") {
        return Answer::Now(Reply::Error("NOAUTH Authentication required.".to_owned()));
    }
    if let Some(transaction) = &mut session.transaction
        && !matches!(
            name,
            "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "QUIT" | "RESET"
        )
    {
        // Queued, as Redis queues: an unknown command is refused now and the block with it.
        if name == "other" {
            transaction.fail();
            return Answer::Now(unknown(&String::from_utf8_lossy(first), args));
        }
        transaction.queue(name, first, args);
        return Answer::Now(Reply::Status("QUEUED"));
    }
    let reply = match name {
        "MULTI" => transaction::multi(session, args),
        "EXEC" => return transaction::exec(app, session, args),
        "DISCARD" => transaction::discard(session, args),
        "WATCH" => transaction::watch(),
        "UNWATCH" => Reply::Status("OK"),
        "PING" => match args {
            [] => Reply::Status("PONG"),
            [message] => Reply::Bulk(message.clone()),
            _ => arity(name),
        },
        "ECHO" => match args {
            [message] => Reply::Bulk(message.clone()),
            _ => arity(name),
        },
        "HELLO" => hello::run(app, session, args),
        "AUTH" => match args {
            [password] => auth::run(app, session, None, password),
            [user, password] => auth::run(app, session, Some(user), password),
            _ => arity(name),
        },
        "SELECT" => match args {
            [db] if db.as_ref() == b"0" => Reply::Status("OK"),
            [_] => Reply::err("DB index is out of range"),
            _ => arity(name),
        },
        "CLIENT" => client::run(session, args),
        "COMMAND" => command::run(session, args),
        "INFO" => Reply::text(format!(
            "# Server\r\nredis_version:7.2.0\r\nweir_version:{}\r\nredis_mode:standalone\r\nnode_id:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            app.node_id()
        )),
        // redis-benchmark asks for `save` and `appendonly`; Weir keeps no data set to save.
        "CONFIG" => match args.first().map(|a| a.to_ascii_uppercase()) {
            Some(sub) if sub == b"GET" => Reply::Array(Vec::new()),
            _ => Reply::err("CONFIG is not supported: Weir's config is its file and HTTP API"),
        },
        "QUIT" => return Answer::Close(Reply::Status("OK")),
        "RESET" => {
            *session = Session::new(session.id, app);
            Reply::Status("RESET")
        }
        "CL.THROTTLE" => cl_throttle::run(app, args),
        "WEIR.ACQUIRE" => return acquire::run(app, args),
        "WEIR.RELEASE" => match args {
            [lease] => match app.release(&String::from_utf8_lossy(lease)) {
                Ok(()) => Reply::Status("OK"),
                Err(error) => api_error(&error),
            },
            _ => arity(name),
        },
        "WEIR.RENEW" => return renew::run(app, args),
        "WEIR.BUSY" => match args {
            [policy] => match app.policy_admin().busy(&String::from_utf8_lossy(policy)) {
                Ok(tightened) => Reply::Integer(i64::from(tightened)),
                Err(error) => api_error(&error),
            },
            _ => arity(name),
        },
        _ => unknown(&String::from_utf8_lossy(first), args),
    };
    Answer::Now(reply)
}

/// Redis's wrong-arity error.
fn arity(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// Redis's unknown-command error, quoting the first arguments.
fn unknown(name: &str, args: &[Bytes]) -> Reply {
    let quoted: String = args
        .iter()
        .take(3)
        .map(|a| format!("'{}' ", String::from_utf8_lossy(&a[..a.len().min(64)])))
        .collect();
    Reply::err(format!(
        "unknown command '{}', with args beginning with: {quoted}",
        name.to_ascii_lowercase()
    ))
}

/// An API error as a RESP error: `ERR` and the same sentence the HTTP API gives.
fn api_error(error: &ApiError) -> Reply {
    Reply::err(error.detail())
}

/// An argument as a signed integer, or Redis's error for one that is not.
fn integer(arg: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Reply::err("value is not an integer or out of range"))
}

fn non_negative(arg: &[u8], name: &str) -> Result<u64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Reply::err(format!("{name} must be a whole number of 0 or more")))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Answers in place with `reply` if it is ready at once — most are — and otherwise gives it a
/// task of its own, so that the requests behind it are decided meanwhile.
fn now_or_later(reply: impl Future<Output = Reply> + Send + 'static) -> Answer {
    let mut reply = Box::pin(reply);
    // A first poll with a waker that does nothing: whatever the future waits on registers
    // again, with the task's own waker, when the task polls it.
    match reply.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(reply) => Answer::Now(reply),
        Poll::Pending => Answer::Later(tokio::spawn(reply)),
    }
}
