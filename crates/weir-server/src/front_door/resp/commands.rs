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
//! A command is decided when it is read, in the order the pipeline sends them, except that a
//! `WEIR.ACQUIRE` that has to wait goes on waiting in a task of its own while the commands
//! behind it are decided: its reply, and every reply behind it, is written when it is done,
//! so replies always come back in the order of the requests.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::reply::Reply;
use crate::app::cells::Throttle;
use crate::app::{AcquireInput, AcquireOutcome, App, MAX_KEY_BYTES};
use crate::error::ApiError;

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

/// The commands of a `MULTI` block, run together at `EXEC`.
#[derive(Debug, Default)]
pub struct Transaction {
    /// Each command's name as [`counted_as`] knows it, and its arguments (name first).
    queued: Vec<(&'static str, Vec<Bytes>)>,
    /// A command could not be queued (unknown): `EXEC` runs none, as Redis does.
    failed: bool,
}

impl Session {
    /// A new connection's session: RESP2, authenticated only if no password is asked for.
    pub fn new(id: i64, app: &App) -> Self {
        Session {
            id,
            resp3: false,
            authenticated: !app.needs_data_token(),
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
            transaction.failed = true;
            return Answer::Now(unknown(&String::from_utf8_lossy(first), args));
        }
        transaction.queued.push((
            name,
            [first.clone()]
                .into_iter()
                .chain(args.iter().cloned())
                .collect(),
        ));
        return Answer::Now(Reply::Status("QUEUED"));
    }
    let reply = match name {
        "MULTI" => match (args, &session.transaction) {
            ([], None) => {
                session.transaction = Some(Transaction::default());
                Reply::Status("OK")
            }
            ([], Some(_)) => Reply::err("MULTI calls can not be nested"),
            _ => arity(name),
        },
        "EXEC" => match (args, session.transaction.take()) {
            ([], Some(transaction)) => return exec(app, session, transaction),
            ([], None) => Reply::err("EXEC without MULTI"),
            (_, transaction) => {
                session.transaction = transaction;
                arity(name)
            }
        },
        "DISCARD" => match (args, session.transaction.take()) {
            ([], Some(_)) => Reply::Status("OK"),
            ([], None) => Reply::err("DISCARD without MULTI"),
            (_, transaction) => {
                session.transaction = transaction;
                arity(name)
            }
        },
        // Weir keeps no data a transaction could depend on, so there is nothing to watch.
        "WATCH" => Reply::err(
            "WATCH is not supported: Weir keeps no keys to watch; MULTI and EXEC run a block together",
        ),
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
        "HELLO" => hello(app, session, args),
        "AUTH" => match args {
            [password] => auth(app, session, None, password),
            [user, password] => auth(app, session, Some(user), password),
            _ => arity(name),
        },
        "SELECT" => match args {
            [db] if db.as_ref() == b"0" => Reply::Status("OK"),
            [_] => Reply::err("DB index is out of range"),
            _ => arity(name),
        },
        "CLIENT" => client(session, args),
        "COMMAND" => command(session, args),
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
        "CL.THROTTLE" => cl_throttle(app, args),
        "WEIR.ACQUIRE" => return acquire(app, args),
        "WEIR.RELEASE" => match args {
            [lease] => match app.release(&String::from_utf8_lossy(lease)) {
                Ok(()) => Reply::Status("OK"),
                Err(error) => api_error(&error),
            },
            _ => arity(name),
        },
        "WEIR.RENEW" => return renew(app, args),
        "WEIR.BUSY" => match args {
            [policy] => match app.busy(&String::from_utf8_lossy(policy)) {
                Ok(tightened) => Reply::Integer(i64::from(tightened)),
                Err(error) => api_error(&error),
            },
            _ => arity(name),
        },
        _ => unknown(&String::from_utf8_lossy(first), args),
    };
    Answer::Now(reply)
}

/// `EXEC`: the queued commands run in order, nothing else of this connection between them,
/// their replies one array. One that waits (a waiting acquire) makes the array wait for it.
fn exec(app: &Arc<App>, session: &mut Session, transaction: Transaction) -> Answer {
    if transaction.failed {
        return Answer::Now(Reply::Error(
            "EXECABORT Transaction discarded because of previous errors.".to_owned(),
        ));
    }
    let answers: Vec<Answer> = transaction
        .queued
        .into_iter()
        .map(|(name, args)| run(app, session, name, args))
        .collect();
    if answers.iter().all(|a| matches!(a, Answer::Now(_))) {
        let replies = answers
            .into_iter()
            .filter_map(|a| match a {
                Answer::Now(reply) => Some(reply),
                _ => None,
            })
            .collect();
        return Answer::Now(Reply::Array(replies));
    }
    Answer::Later(tokio::spawn(async move {
        let mut replies = Vec::with_capacity(answers.len());
        for answer in answers {
            replies.push(match answer {
                Answer::Now(reply) | Answer::Close(reply) => reply,
                Answer::Later(task) => task
                    .await
                    .unwrap_or_else(|_| Reply::err("the command's task ended without a reply")),
            });
        }
        Reply::Array(replies)
    }))
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

/// The password is the data token, given alone or as user `default`'s (Redis's one user
/// without ACLs). The admin token is never a password here: a service that throttles through
/// Redis holds no credential that rewrites policies.
fn auth(app: &App, session: &mut Session, user: Option<&[u8]>, password: &[u8]) -> Reply {
    let given = String::from_utf8_lossy(password);
    if !app.needs_data_token() {
        return Reply::err(
            "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    if user.is_none_or(|user| user == b"default") && app.check_password(&given) {
        session.authenticated = true;
        Reply::Status("OK")
    } else {
        Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".to_owned())
    }
}

/// `HELLO [protover [AUTH user password] [SETNAME name]]`.
fn hello(app: &App, session: &mut Session, args: &[Bytes]) -> Reply {
    let mut resp3 = session.resp3;
    let mut rest = args;
    if let [version, tail @ ..] = args {
        match version.as_ref() {
            b"2" => resp3 = false,
            b"3" => resp3 = true,
            _ => return Reply::Error("NOPROTO unsupported protocol version".to_owned()),
        }
        rest = tail;
    }
    let mut name = None;
    while let [option, tail @ ..] = rest {
        match (option.to_ascii_uppercase().as_slice(), tail) {
            (b"AUTH", [user, password, more @ ..]) => {
                if let Reply::Error(error) = auth(app, session, Some(user), password) {
                    return Reply::Error(error);
                }
                rest = more;
            }
            (b"SETNAME", [value, more @ ..]) => {
                name = Some(value.clone());
                rest = more;
            }
            _ => {
                return Reply::err(format!(
                    "syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                ));
            }
        }
    }
    if !session.authenticated {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".to_owned(),
        );
    }
    session.resp3 = resp3;
    if name.is_some() {
        session.name = name;
    }
    Reply::Map(vec![
        ("server", Reply::text("weir")),
        ("version", Reply::text(env!("CARGO_PKG_VERSION"))),
        ("proto", Reply::Integer(if resp3 { 3 } else { 2 })),
        ("id", Reply::Integer(session.id)),
        ("mode", Reply::text("standalone")),
        ("role", Reply::text("master")),
        ("modules", Reply::Array(Vec::new())),
    ])
}

/// `CLIENT SETNAME | GETNAME | SETINFO | ID`.
fn client(session: &mut Session, args: &[Bytes]) -> Reply {
    let Some(sub) = args.first() else {
        return arity("client");
    };
    match (sub.to_ascii_uppercase().as_slice(), &args[1..]) {
        (b"SETNAME", [name]) => {
            if name.iter().any(|b| *b <= b' ' || *b > b'~') {
                return Reply::err(
                    "Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!name.is_empty()).then(|| name.clone());
            Reply::Status("OK")
        }
        (b"GETNAME", []) => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        (b"SETINFO", [_, _]) => Reply::Status("OK"),
        (b"ID", []) => Reply::Integer(session.id),
        _ => Reply::err(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// `COMMAND [COUNT | DOCS | INFO …]`: enough for clients that look before they send; Weir
/// describes no commands, so a client falls back to sending them as typed.
fn command(session: &Session, args: &[Bytes]) -> Reply {
    match args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
        None => Reply::Array(Vec::new()),
        Some(b"COUNT") => Reply::Integer(0),
        Some(b"DOCS") if session.resp3 => Reply::Map(Vec::new()),
        Some(b"DOCS") => Reply::Array(Vec::new()),
        Some(b"INFO") => Reply::Array(args[1..].iter().map(|_| Reply::Null).collect()),
        Some(other) => Reply::err(format!(
            "unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(other)
        )),
    }
}

/// An argument as a signed integer, or Redis's error for one that is not.
fn integer(arg: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Reply::err("value is not an integer or out of range"))
}

/// `CL.THROTTLE key max_burst count period [quantity]`.
fn cl_throttle(app: &App, args: &[Bytes]) -> Reply {
    let (key, numbers) = match args {
        [key, numbers @ ..] if (3..=4).contains(&numbers.len()) => (key, numbers),
        _ => return arity("cl.throttle"),
    };
    let mut parsed = [0i64; 4];
    parsed[3] = 1;
    for (slot, arg) in parsed.iter_mut().zip(numbers) {
        match integer(arg) {
            Ok(n) => *slot = n,
            Err(reply) => return reply,
        }
    }
    let [max_burst, count, period, quantity] = parsed;
    let throttle = Throttle {
        max_burst,
        count,
        period,
        quantity,
    };
    if key.len() > MAX_KEY_BYTES {
        return Reply::err(format!(
            "key is {} bytes long; the most is {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    match app.throttle_cell(key, &throttle) {
        Ok(verdict) => Reply::Array(
            [
                i64::from(verdict.limited),
                verdict.limit,
                verdict.remaining,
                verdict.retry_after,
                verdict.reset_after,
            ]
            .map(Reply::Integer)
            .to_vec(),
        ),
        Err(error) => Reply::err(error),
    }
}

/// `WEIR.ACQUIRE policy key [KIND k] [COST n] [WAIT ms]`.
fn acquire(app: &Arc<App>, args: &[Bytes]) -> Answer {
    let input = match acquire_input(args) {
        Ok(input) => input,
        Err(reply) => return Answer::Now(reply),
    };
    let app = Arc::clone(app);
    now_or_later(async move { acquire_reply(app.acquire(&input).await) })
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

fn acquire_input(args: &[Bytes]) -> Result<AcquireInput, Reply> {
    let [policy, key, options @ ..] = args else {
        return Err(arity("weir.acquire"));
    };
    let text = |arg: &Bytes| String::from_utf8_lossy(arg).into_owned();
    let mut input = AcquireInput {
        policy: text(policy),
        key: text(key),
        kind: None,
        cost: None,
        max_wait_ms: None,
    };
    let mut rest = options;
    while let [option, tail @ ..] = rest {
        let [value, more @ ..] = tail else {
            return Err(Reply::err(format!(
                "syntax error: {} needs a value",
                String::from_utf8_lossy(option)
            )));
        };
        match option.to_ascii_uppercase().as_slice() {
            b"KIND" => input.kind = Some(text(value)),
            b"COST" => input.cost = Some(non_negative(value, "COST")?),
            b"WAIT" => input.max_wait_ms = Some(non_negative(value, "WAIT")?),
            _ => {
                return Err(Reply::err(format!(
                    "syntax error: unknown option '{}' (KIND, COST, WAIT)",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        rest = more;
    }
    Ok(input)
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

/// An acquisition's outcome as fields, the HTTP API's names: `admitted`, then when admitted
/// `waited_ms`, `lease` and `ttl_ms` (nil and −1 for a rate policy), `tier` and
/// `would_throttle`; when refused `retry_after_ms` (−1 if unknown) and `reason`.
fn acquire_reply(outcome: Result<AcquireOutcome, ApiError>) -> Reply {
    match outcome {
        Ok(AcquireOutcome::Admitted {
            waited,
            lease,
            would_throttle,
            tier,
            ..
        }) => Reply::Map(vec![
            ("admitted", Reply::Boolean(true)),
            ("waited_ms", Reply::Integer(millis(waited))),
            (
                "lease",
                lease
                    .as_ref()
                    .map_or(Reply::Null, |(id, _)| Reply::text(id.clone())),
            ),
            (
                "ttl_ms",
                Reply::Integer(lease.map_or(-1, |(_, ttl)| millis(ttl))),
            ),
            ("tier", Reply::text(tier.name())),
            ("would_throttle", Reply::Boolean(would_throttle)),
        ]),
        Ok(AcquireOutcome::Refused {
            retry_after,
            reason,
            ..
        }) => Reply::Map(vec![
            ("admitted", Reply::Boolean(false)),
            (
                "retry_after_ms",
                Reply::Integer(retry_after.map_or(-1, millis)),
            ),
            ("reason", Reply::text(reason)),
        ]),
        Err(error) => api_error(&error),
    }
}

/// `WEIR.RENEW lease [TTL ms]`: the lease's time left, in milliseconds.
fn renew(app: &Arc<App>, args: &[Bytes]) -> Answer {
    let (lease, ttl_ms) = match args {
        [lease] => (lease, None),
        [lease, option, value] if option.eq_ignore_ascii_case(b"TTL") => {
            match non_negative(value, "TTL") {
                Ok(ms) => (lease, Some(ms)),
                Err(reply) => return Answer::Now(reply),
            }
        }
        _ => return Answer::Now(arity("weir.renew")),
    };
    let lease = String::from_utf8_lossy(lease).into_owned();
    let app = Arc::clone(app);
    now_or_later(async move {
        match app.renew(&lease, ttl_ms).await {
            Ok(left) => Reply::Integer(millis(left)),
            Err(error) => api_error(&error),
        }
    })
}
