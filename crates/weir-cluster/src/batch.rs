//! Batching per owner: a [`Transport`] wrapper that sends the lease requests, the releases and
//! the rate decisions that do not wait, bound for the same owner, together, so a busy node
//! makes one call per batch rather than one per request.
//!
//! Gubernator gathers requests for a fixed 500 µs before it sends. Weir does not wait: a batch
//! leaves as soon as one of the owner's [`MAX_IN_FLIGHT`] call slots is free, carrying whatever
//! queued while the slots were busy (up to [`MAX_BATCH`]). An idle coordinator therefore sends
//! each request at once, with no added latency, and a busy one batches exactly as much as the
//! round trip lets pile up.
//!
//! A grant whose asker stopped waiting (its acquire timed out) is given back at once instead
//! of living out its TTL on the owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::pool::Grant;
use crate::rates::{RateAsk, RateDecision};
use crate::transport::{
    BoxFuture, LeaseRequest, Message, Reply, Transport, TransportError, TransportExt, replied,
};

/// Calls in flight to one owner at a time, per kind (leases, releases).
pub const MAX_IN_FLIGHT: usize = 4;
/// Requests in one call.
pub const MAX_BATCH: usize = 256;

type Granted = oneshot::Sender<Result<Grant, TransportError>>;
type Decided = oneshot::Sender<Result<RateDecision, TransportError>>;

/// One owner's queues, each drained by a task of its own.
struct Queues {
    leases: mpsc::UnboundedSender<(LeaseRequest, Granted)>,
    releases: mpsc::UnboundedSender<(String, u64)>,
    decisions: mpsc::UnboundedSender<(RateAsk, Decided)>,
}

/// `inner`, with lease requests and releases batched per owner. Adoption and renewal are rare
/// and pass straight through. Must be used inside a tokio runtime (it spawns a task per owner).
pub struct Batching<T: Transport + 'static> {
    inner: Arc<T>,
    owners: Mutex<HashMap<String, Queues>>,
}

impl<T: Transport + 'static> Batching<T> {
    /// Batches `inner`'s calls.
    pub fn new(inner: Arc<T>) -> Self {
        Batching {
            inner,
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }

    /// Stops batching for the owners `keep` says no to (nodes that left): their queues close
    /// and their tasks end once what was queued has gone out.
    pub fn retain_owners(&self, keep: impl Fn(&str) -> bool) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|owner, _| keep(owner));
    }

    /// Queues a request for `owner` with `send` (false: the queue is closed) and answers with
    /// what its batch brings back; the owner is unreachable if nothing does.
    fn queue<R: Send + 'static>(
        &self,
        owner: &str,
        send: impl FnOnce(&Queues, oneshot::Sender<Result<R, TransportError>>) -> bool,
    ) -> BoxFuture<'_, Result<R, TransportError>> {
        let (reply, answer) = oneshot::channel();
        let queued = self.with_queues(owner, |queues| send(queues, reply));
        let owner = owner.to_owned();
        Box::pin(async move {
            if !queued {
                return Err(TransportError::Unreachable(owner));
            }
            answer
                .await
                .unwrap_or(Err(TransportError::Unreachable(owner)))
        })
    }

    /// Runs `f` on `owner`'s queues, starting its tasks on first use.
    fn with_queues<R>(&self, owner: &str, f: impl FnOnce(&Queues) -> R) -> R {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        let queues = owners.entry(owner.to_owned()).or_insert_with(|| {
            let (leases, lease_queue) = mpsc::unbounded_channel();
            let (releases, release_queue) = mpsc::unbounded_channel();
            let releases_back = releases.clone();
            tokio::spawn(send_leases(
                Arc::clone(&self.inner),
                owner.to_owned(),
                lease_queue,
                releases_back,
            ));
            tokio::spawn(send_releases(
                Arc::clone(&self.inner),
                owner.to_owned(),
                release_queue,
            ));
            let (decisions, decision_queue) = mpsc::unbounded_channel();
            tokio::spawn(send_decisions(
                Arc::clone(&self.inner),
                owner.to_owned(),
                decision_queue,
            ));
            Queues {
                leases,
                releases,
                decisions,
            }
        });
        f(queues)
    }
}

/// Waits for the next item, then for a free call slot — waiting for the slot is what lets a
/// batch grow — and takes everything queued meanwhile (up to [`MAX_BATCH`]). `None` once the
/// queue is closed.
async fn next_batch<T>(
    queue: &mut mpsc::UnboundedReceiver<T>,
    slots: &Arc<Semaphore>,
) -> Option<(OwnedSemaphorePermit, Vec<T>)> {
    let first = queue.recv().await?;
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    Some((slot, batch))
}

/// Drains `queue` into batched lease calls, [`MAX_IN_FLIGHT`] at a time; a grant nobody waits
/// for any more goes back through `give_back`.
async fn send_leases<T: Transport + 'static>(
    inner: Arc<T>,
    owner: String,
    mut queue: mpsc::UnboundedReceiver<(LeaseRequest, Granted)>,
    give_back: mpsc::UnboundedSender<(String, u64)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some((slot, batch)) = next_batch(&mut queue, &slots).await {
        let (inner, owner, give_back) = (Arc::clone(&inner), owner.clone(), give_back.clone());
        tokio::spawn(async move {
            let (requests, replies): (Vec<LeaseRequest>, Vec<Granted>) = batch.into_iter().unzip();
            let asked: Vec<(String, bool)> = requests
                .iter()
                .map(|r| (r.bucket.clone(), r.ask.is_loan()))
                .collect();
            let answers = inner.acquire_batch(&owner, requests).await;
            drop(slot);
            for ((reply, (bucket, lend)), answer) in replies.into_iter().zip(asked).zip(answers) {
                let Err(Ok(Grant::Granted { id, units, .. })) = reply.send(answer) else {
                    continue;
                };
                if lend {
                    // A loan: only the units this grant added go back (a renewal, which adds
                    // none, is not a `Granted`); its holder may use the rest.
                    let _ = inner.give_back(&owner, &bucket, id, units).await;
                } else {
                    let _ = give_back.send((bucket, id));
                }
            }
            // A reply left without an answer (a short batch) is dropped: its asker sees the
            // owner as unreachable.
        });
    }
}

/// Drains `queue` into batched release calls, [`MAX_IN_FLIGHT`] at a time.
async fn send_releases<T: Transport + 'static>(
    inner: Arc<T>,
    owner: String,
    mut queue: mpsc::UnboundedReceiver<(String, u64)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some((slot, batch)) = next_batch(&mut queue, &slots).await {
        let (inner, owner) = (Arc::clone(&inner), owner.clone());
        tokio::spawn(async move {
            // Best effort, as every release: a lost one expires with its TTL.
            let _ = inner.release_batch(&owner, batch).await;
            drop(slot);
        });
    }
}

/// Drains `queue` into batched decision calls, [`MAX_IN_FLIGHT`] at a time.
async fn send_decisions<T: Transport + 'static>(
    inner: Arc<T>,
    owner: String,
    mut queue: mpsc::UnboundedReceiver<(RateAsk, Decided)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some((slot, batch)) = next_batch(&mut queue, &slots).await {
        let (inner, owner) = (Arc::clone(&inner), owner.clone());
        tokio::spawn(async move {
            let (requests, replies): (Vec<RateAsk>, Vec<Decided>) = batch.into_iter().unzip();
            let answers = inner.decide_batch(&owner, requests).await;
            drop(slot);
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
    }
}

impl<T: Transport + 'static> Batching<T> {
    /// A decision that does not wait, queued for its owner's next batch.
    fn decide_queued(
        &self,
        owner: &str,
        request: RateAsk,
    ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
        self.queue(owner, |queues, reply| {
            queues.decisions.send((request, reply)).is_ok()
        })
    }

    /// A lease request, queued for its owner's next batch.
    fn acquire_queued(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        self.queue(owner, |queues, reply| {
            queues.leases.send((request, reply)).is_ok()
        })
    }

    /// A release, queued for its owner's next batch; answered at once.
    fn release_queued(
        &self,
        owner: &str,
        bucket: String,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let queued = self.with_queues(owner, |q| q.releases.send((bucket, lease)).is_ok());
        let owner = owner.to_owned();
        Box::pin(async move {
            match queued {
                true => Ok(()),
                false => Err(TransportError::Unreachable(owner)),
            }
        })
    }
}

impl<T: Transport + 'static> Transport for Batching<T> {
    /// Lease requests, releases and decisions that do not wait are batched per owner; a
    /// decision that may wait goes alone (a batch is answered in one go), and every other
    /// message goes straight through.
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        match message {
            Message::Decide(request) if request.max_wait.is_zero() => {
                replied(self.decide_queued(owner, request), Reply::Decision)
            }
            Message::Acquire(request) => replied(self.acquire_queued(owner, request), Reply::Grant),
            Message::Release { bucket, lease } => {
                replied(self.release_queued(owner, bucket, lease), |()| Reply::Done)
            }
            other => self.inner.send(owner, other),
        }
    }
}

#[cfg(test)]
mod tests;
