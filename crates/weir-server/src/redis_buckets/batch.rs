//! Decisions bound for Redis, sent together: a script call costs Redis a fixed part (reading
//! it, starting the script, writing the reply) beside each key's own work, so decisions that
//! arrive while others are in flight leave as one call over all their keys and share it.
//!
//! A decision never waits to be batched. It joins the queue, and if fewer than
//! `batches_in_flight` calls are out, a sender starts at once with whatever is queued (a lone
//! request: itself). A sender sends up to `batch_limit` decisions in one call, and once
//! answered takes what queued meanwhile, until the queue is empty. Under no load every
//! decision leaves alone, as before; under load the calls fill, sized by the round trip
//! itself — the way a pipelining client batches, with no timer to wait on.
//!
//! In a Redis Cluster the keys of one call must share a slot; the cluster client routes each
//! decision of a batch on its own, still together in time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::Value;
use tokio::sync::oneshot;

use super::script::ARGUMENTS_PER_KEY;
use super::{Connector, Link, RedisUnavailable};

/// A bucket's five integers, as the script answers them.
pub(super) type Reply = (u64, u64, u64, u64, i64);

/// One decision waiting to be sent.
pub(super) struct Pending {
    /// The bucket's Redis key.
    pub key: String,
    /// Its arguments to the script.
    pub arguments: [String; ARGUMENTS_PER_KEY],
    /// Where its answer goes.
    pub answer: oneshot::Sender<Result<Reply, RedisUnavailable>>,
}

/// The queue of decisions and the senders draining it.
pub(super) struct Batches {
    queue: Mutex<Queue>,
    /// The most decisions in one call.
    limit: usize,
    /// The most calls out at once.
    in_flight: usize,
    /// Script calls sent: decisions over calls is the batches' mean size.
    calls: AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: std::collections::VecDeque<Pending>,
    senders: usize,
}

impl Batches {
    /// Batches of at most `limit` decisions, at most `in_flight` of them out at once.
    pub(super) fn new(limit: usize, in_flight: usize) -> Self {
        Batches {
            queue: Mutex::new(Queue::default()),
            limit: limit.max(1),
            in_flight: in_flight.max(1),
            calls: AtomicU64::new(0),
        }
    }

    /// Script calls sent so far.
    pub(super) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Queues `pending`, starting a sender when fewer than `in_flight` are out.
    pub(super) fn send(self: &Arc<Self>, connector: &Arc<Connector>, pending: Pending) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.waiting.push_back(pending);
        if queue.senders >= self.in_flight {
            return;
        }
        queue.senders += 1;
        drop(queue);
        let batches = Arc::clone(self);
        let connector = Arc::clone(connector);
        tokio::spawn(async move { batches.drain(&connector).await });
    }

    /// Sends what is queued, a batch at a time, until nothing is.
    async fn drain(&self, connector: &Connector) {
        loop {
            let batch: Vec<Pending> = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.senders -= 1;
                    return;
                }
                let taken = queue.waiting.len().min(self.limit);
                queue.waiting.drain(..taken).collect()
            };
            let timeout = connector.timeout;
            match tokio::time::timeout(timeout, call(connector, &self.calls, &batch)).await {
                Ok(Ok(replies)) => {
                    for (pending, reply) in batch.into_iter().zip(replies) {
                        let _ = pending.answer.send(reply);
                    }
                }
                Ok(Err(failed)) => {
                    let failed = Arc::new(failed);
                    for pending in batch {
                        let _ = pending
                            .answer
                            .send(Err(RedisUnavailable::Failed(Arc::clone(&failed))));
                    }
                }
                Err(_) => {
                    for pending in batch {
                        let _ = pending
                            .answer
                            .send(Err(RedisUnavailable::TimedOut(timeout)));
                    }
                }
            }
        }
    }
}

/// One call for `batch` (one per decision in a Redis Cluster): each decision's reply, in
/// order, or the error that failed the whole call.
async fn call(
    connector: &Connector,
    calls: &AtomicU64,
    batch: &[Pending],
) -> Result<Vec<Result<Reply, RedisUnavailable>>, redis::RedisError> {
    let value = match connector.link().await? {
        Link::Cluster(connection) => {
            calls.fetch_add(batch.len() as u64, Ordering::Relaxed);
            let each = batch.iter().map(|pending| {
                let mut connection = connection.clone();
                async move {
                    let value = invocation(&connector.script, std::slice::from_ref(pending))
                        .invoke_async::<Value>(&mut connection)
                        .await;
                    match value {
                        Ok(value) => replies_of(value, 1).pop().unwrap_or_else(|| {
                            Err(RedisUnavailable::Failed(Arc::new(unreadable())))
                        }),
                        Err(error) => Err(RedisUnavailable::Failed(Arc::new(error))),
                    }
                }
            });
            return Ok(futures_util::future::join_all(each).await);
        }
        Link::Single(mut connection) => {
            calls.fetch_add(1, Ordering::Relaxed);
            invocation(&connector.script, batch)
                .invoke_async::<Value>(&mut connection)
                .await
        }
        Link::Sentinel(mut connection) => {
            calls.fetch_add(1, Ordering::Relaxed);
            let value = invocation(&connector.script, batch)
                .invoke_async::<Value>(&mut connection)
                .await;
            if value.is_err() {
                connector.forget_link().await;
            }
            value
        }
    }?;
    Ok(replies_of(value, batch.len()))
}

/// The script over `batch`'s keys and arguments.
fn invocation<'a>(script: &'a redis::Script, batch: &[Pending]) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    for pending in batch {
        invocation.key(&pending.key);
        for argument in &pending.arguments {
            invocation.arg(argument);
        }
    }
    invocation
}

/// Each key's reply out of the script's array of `expected`.
fn replies_of(value: Value, expected: usize) -> Vec<Result<Reply, RedisUnavailable>> {
    let items = match value {
        Value::Array(items) if items.len() == expected => items,
        _ => {
            let unreadable = Arc::new(unreadable());
            return (0..expected)
                .map(|_| Err(RedisUnavailable::Failed(Arc::clone(&unreadable))))
                .collect();
        }
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::BulkString(message) => Err(RedisUnavailable::Failed(Arc::new(error_of(
                &String::from_utf8_lossy(&message),
            )))),
            item => redis::from_owned_redis_value::<Reply>(item)
                .map_err(|error| RedisUnavailable::Failed(Arc::new(error))),
        })
        .collect()
}

/// The error a key's command failed with, from its message (`WRONGTYPE Operation against…`):
/// its code first, as Redis would have answered it alone.
fn error_of(message: &str) -> redis::RedisError {
    let (code, detail) = message.split_once(' ').unwrap_or((message, ""));
    redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
}

/// A reply that is not one answer per key.
fn unreadable() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::TypeError,
        "the decision script's reply is not one answer per key",
    ))
}
