//! `MULTI`, `EXEC`, `DISCARD`, `WATCH` and `UNWATCH`: commands queued and run together.
//!
//! Weir keeps no data a transaction could depend on, so a block is only run together — nothing
//! else of the connection between its commands — and there is nothing to watch.

use std::sync::Arc;

use bytes::Bytes;

use super::{Answer, Session, arity};
use crate::app::App;
use crate::front_door::resp::reply::Reply;

/// The commands of a `MULTI` block, run together at `EXEC`.
#[derive(Debug, Default)]
pub struct Transaction {
    /// Each command's name as [`counted_as`](super::counted_as) knows it, and its arguments (name first).
    queued: Vec<(&'static str, Vec<Bytes>)>,
    /// A command could not be queued (unknown): `EXEC` runs none, as Redis does.
    failed: bool,
}

impl Transaction {
    /// Queues a command (its name as [`counted_as`](super::counted_as) knows it, then its
    /// arguments after `first`, its name as sent).
    pub(super) fn queue(&mut self, name: &'static str, first: &Bytes, args: &[Bytes]) {
        self.queued.push((
            name,
            [first.clone()]
                .into_iter()
                .chain(args.iter().cloned())
                .collect(),
        ));
    }

    /// A command could not be queued: `EXEC` will run none.
    pub(super) fn fail(&mut self) {
        self.failed = true;
    }
}

/// `MULTI`: the commands after it are queued.
pub(super) fn multi(session: &mut Session, args: &[Bytes]) -> Reply {
    match (args, &session.transaction) {
        ([], None) => {
            session.transaction = Some(Transaction::default());
            Reply::Status("OK")
        }
        ([], Some(_)) => Reply::err("MULTI calls can not be nested"),
        _ => arity("MULTI"),
    }
}

/// `DISCARD`: the queued commands dropped.
pub(super) fn discard(session: &mut Session, args: &[Bytes]) -> Reply {
    match (args, session.transaction.take()) {
        ([], Some(_)) => Reply::Status("OK"),
        ([], None) => Reply::err("DISCARD without MULTI"),
        (_, transaction) => {
            session.transaction = transaction;
            arity("DISCARD")
        }
    }
}

/// `WATCH`: refused, as there is nothing to watch.
pub(super) fn watch() -> Reply {
    Reply::err(
        "WATCH is not supported: Weir keeps no keys to watch; MULTI and EXEC run a block together",
    )
}

/// `EXEC` as asked: the block run, or Redis's error for an `EXEC` out of place.
pub(super) fn exec(app: &Arc<App>, session: &mut Session, args: &[Bytes]) -> Answer {
    match (args, session.transaction.take()) {
        ([], Some(transaction)) => run_block(app, session, transaction),
        ([], None) => Answer::Now(Reply::err("EXEC without MULTI")),
        (_, transaction) => {
            session.transaction = transaction;
            Answer::Now(arity("EXEC"))
        }
    }
}

/// `EXEC`: the queued commands run in order, nothing else of this connection between them,
/// their replies one array. One that waits (a waiting acquire) makes the array wait for it.
fn run_block(app: &Arc<App>, session: &mut Session, transaction: Transaction) -> Answer {
    if transaction.failed {
        return Answer::Now(Reply::Error(
            "EXECABORT Transaction discarded because of previous errors.".to_owned(),
        ));
    }
    let answers: Vec<Answer> = transaction
        .queued
        .into_iter()
        .map(|(name, args)| super::run(app, session, name, args))
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
