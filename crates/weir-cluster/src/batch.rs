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
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use weir::Nanos;

use crate::pool::Grant;
use crate::rates::{RateDecision, RateRequest};
use crate::transport::{BoxFuture, LeaseRequest, Transport, TransportError};

/// Calls in flight to one owner at a time, per kind (leases, releases).
pub const MAX_IN_FLIGHT: usize = 4;
/// Requests in one call.
pub const MAX_BATCH: usize = 256;

type Reply = oneshot::Sender<Result<Grant, TransportError>>;
type Decided = oneshot::Sender<Result<RateDecision, TransportError>>;

/// One owner's queues, each drained by a task of its own.
struct Queues {
    leases: mpsc::UnboundedSender<(LeaseRequest, Reply)>,
    releases: mpsc::UnboundedSender<(String, u64)>,
    decisions: mpsc::UnboundedSender<(RateRequest, Decided)>,
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
    mut queue: mpsc::UnboundedReceiver<(LeaseRequest, Reply)>,
    give_back: mpsc::UnboundedSender<(String, u64)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some((slot, batch)) = next_batch(&mut queue, &slots).await {
        let (inner, owner, give_back) = (Arc::clone(&inner), owner.clone(), give_back.clone());
        tokio::spawn(async move {
            let (requests, replies): (Vec<LeaseRequest>, Vec<Reply>) = batch.into_iter().unzip();
            let asked: Vec<(String, bool)> = requests
                .iter()
                .map(|r| (r.bucket.clone(), r.lend))
                .collect();
            let answers = inner.acquire_batch(&owner, requests).await;
            drop(slot);
            for ((reply, (bucket, lend)), answer) in replies.into_iter().zip(asked).zip(answers) {
                let Err(Ok(Grant::Granted { id, units, .. })) = reply.send(answer) else {
                    continue;
                };
                if lend {
                    // A loan: only the units this grant added go back (none for a renewal);
                    // its holder may use the rest.
                    if units > 0 {
                        let _ = inner.give_back(&owner, &bucket, id, units).await;
                    }
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
    mut queue: mpsc::UnboundedReceiver<(RateRequest, Decided)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some((slot, batch)) = next_batch(&mut queue, &slots).await {
        let (inner, owner) = (Arc::clone(&inner), owner.clone());
        tokio::spawn(async move {
            let (requests, replies): (Vec<RateRequest>, Vec<Decided>) = batch.into_iter().unzip();
            let answers = inner.decide_batch(&owner, requests).await;
            drop(slot);
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
    }
}

impl<T: Transport + 'static> Transport for Batching<T> {
    /// A decision that may wait goes alone (a batch is answered in one go); the others are
    /// batched per owner.
    fn decide(
        &self,
        owner: &str,
        request: RateRequest,
    ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
        if !request.max_wait.is_zero() {
            return self.inner.decide(owner, request);
        }
        self.queue(owner, |queues, reply| {
            queues.decisions.send((request, reply)).is_ok()
        })
    }

    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        self.queue(owner, |queues, reply| {
            queues.leases.send((request, reply)).is_ok()
        })
    }

    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let queued = self.with_queues(owner, |q| {
            q.releases.send((bucket.to_owned(), lease)).is_ok()
        });
        let owner = owner.to_owned();
        Box::pin(async move {
            match queued {
                true => Ok(()),
                false => Err(TransportError::Unreachable(owner)),
            }
        })
    }

    fn adopt(
        &self,
        owner: &str,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> BoxFuture<'_, Result<u64, TransportError>> {
        self.inner
            .adopt(owner, bucket, holder, expires_at, units, lent)
    }

    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.give_back(owner, bucket, lease, units)
    }

    fn renew(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: Nanos,
        fenced: bool,
    ) -> BoxFuture<'_, Result<bool, TransportError>> {
        self.inner.renew(owner, bucket, lease, ttl, now, fenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::Owner;
    use crate::pool::SharedPool;
    use crate::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
    use crate::transport::InMemory;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts the calls that reach the network, and holds every call until released.
    struct Counting {
        network: InMemory,
        lease_calls: AtomicUsize,
        release_calls: AtomicUsize,
        decision_calls: AtomicUsize,
        single_decisions: AtomicUsize,
        gate: tokio::sync::Notify,
        gated: std::sync::atomic::AtomicBool,
    }

    impl Transport for Counting {
        fn acquire(
            &self,
            owner: &str,
            request: LeaseRequest,
        ) -> BoxFuture<'_, Result<Grant, TransportError>> {
            self.network.acquire(owner, request)
        }
        fn release(
            &self,
            owner: &str,
            bucket: &str,
            lease: u64,
        ) -> BoxFuture<'_, Result<(), TransportError>> {
            self.network.release(owner, bucket, lease)
        }
        fn adopt(
            &self,
            owner: &str,
            bucket: &str,
            holder: &str,
            expires_at: Nanos,
            units: u64,
            lent: bool,
        ) -> BoxFuture<'_, Result<u64, TransportError>> {
            self.network
                .adopt(owner, bucket, holder, expires_at, units, lent)
        }
        fn renew(
            &self,
            owner: &str,
            bucket: &str,
            lease: u64,
            ttl: Duration,
            now: Nanos,
            fenced: bool,
        ) -> BoxFuture<'_, Result<bool, TransportError>> {
            self.network.renew(owner, bucket, lease, ttl, now, fenced)
        }
        fn give_back(
            &self,
            owner: &str,
            bucket: &str,
            lease: u64,
            units: u64,
        ) -> BoxFuture<'_, Result<(), TransportError>> {
            self.network.give_back(owner, bucket, lease, units)
        }
        fn acquire_batch(
            &self,
            owner: &str,
            requests: Vec<LeaseRequest>,
        ) -> BoxFuture<'_, Vec<Result<Grant, TransportError>>> {
            self.lease_calls.fetch_add(1, Ordering::SeqCst);
            let owner = owner.to_owned();
            Box::pin(async move {
                if self.gated.load(Ordering::SeqCst) {
                    self.gate.notified().await;
                }
                self.network.acquire_batch(&owner, requests).await
            })
        }
        fn release_batch(
            &self,
            owner: &str,
            leases: Vec<(String, u64)>,
        ) -> BoxFuture<'_, Result<(), TransportError>> {
            self.release_calls.fetch_add(1, Ordering::SeqCst);
            self.network.release_batch(owner, leases)
        }
        fn decide(
            &self,
            _owner: &str,
            _request: RateRequest,
        ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
            self.single_decisions.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(admitted()) })
        }
        fn decide_batch(
            &self,
            _owner: &str,
            requests: Vec<RateRequest>,
        ) -> BoxFuture<'_, Vec<Result<RateDecision, TransportError>>> {
            self.decision_calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if self.gated.load(Ordering::SeqCst) {
                    self.gate.notified().await;
                }
                requests.iter().map(|_| Ok(admitted())).collect()
            })
        }
    }

    fn admitted() -> RateDecision {
        RateDecision::Admitted {
            waited: Duration::ZERO,
            would_throttle: false,
            quota: None,
        }
    }

    fn decision(max_wait: Duration) -> RateRequest {
        RateRequest {
            policy: "p".to_owned(),
            key: "k".to_owned(),
            kind: String::new(),
            cost: 1,
            max_wait,
            handed: None,
        }
    }

    /// Lets the batching tasks run until `done` holds; fails if it never does.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never happened: {what}");
    }

    fn one_owner() -> (Arc<Counting>, Arc<SharedPool>) {
        let ring = Arc::new(SharedRing::new(Ring::new(
            [Member::owner("n1", 1)],
            DEFAULT_VNODES,
            1,
        )));
        let pool = Arc::new(SharedPool::new(1000));
        let network = InMemory::new();
        network.add("n1", Arc::new(Owner::new("n1", ring, Arc::clone(&pool))));
        let counting = Arc::new(Counting {
            network,
            lease_calls: AtomicUsize::new(0),
            release_calls: AtomicUsize::new(0),
            decision_calls: AtomicUsize::new(0),
            single_decisions: AtomicUsize::new(0),
            gate: tokio::sync::Notify::new(),
            gated: std::sync::atomic::AtomicBool::new(false),
        });
        (counting, pool)
    }

    fn request(bucket: &str) -> LeaseRequest {
        LeaseRequest::one(bucket, 1000, "n2", Duration::from_secs(1), 0)
    }

    /// With every call slot busy, the requests that queue meanwhile leave together: after
    /// four single calls fill the slots, 96 more requests cost one call, and every request
    /// gets its own answer.
    #[tokio::test]
    async fn requests_that_queue_behind_busy_slots_leave_in_one_batch() {
        let (counting, pool) = one_owner();
        counting.gated.store(true, Ordering::SeqCst);
        let batching = Batching::new(Arc::clone(&counting));
        let mut answers = Vec::new();
        for slot in 1..=MAX_IN_FLIGHT {
            answers.push(batching.acquire("n1", request("b0")));
            until("the slot's call", || {
                counting.lease_calls.load(Ordering::SeqCst) >= slot
            })
            .await;
        }
        // Queued as `acquire` returns, behind the four held calls.
        for i in 0..96 {
            answers.push(batching.acquire("n1", request(&format!("b{}", i % 2))));
        }
        counting.gated.store(false, Ordering::SeqCst);
        counting.gate.notify_waiters();
        for answer in answers {
            assert!(matches!(answer.await, Ok(Grant::Granted { .. })));
        }
        assert_eq!(pool.in_use("b0", 0) + pool.in_use("b1", 0), 100);
        assert_eq!(
            counting.lease_calls.load(Ordering::SeqCst),
            MAX_IN_FLIGHT + 1
        );
    }

    /// Rate decisions that do not wait batch as leases do; one that may wait goes alone.
    #[tokio::test]
    async fn decisions_batch_behind_busy_slots_and_a_waiting_one_goes_alone() {
        let (counting, _) = one_owner();
        counting.gated.store(true, Ordering::SeqCst);
        let batching = Batching::new(Arc::clone(&counting));
        let mut answers = Vec::new();
        for slot in 1..=MAX_IN_FLIGHT {
            answers.push(batching.decide("n1", decision(Duration::ZERO)));
            until("the slot's call", || {
                counting.decision_calls.load(Ordering::SeqCst) >= slot
            })
            .await;
        }
        for _ in 0..96 {
            answers.push(batching.decide("n1", decision(Duration::ZERO)));
        }
        let waiting = batching.decide("n1", decision(Duration::from_secs(1)));
        assert_eq!(waiting.await, Ok(admitted()));
        assert_eq!(counting.single_decisions.load(Ordering::SeqCst), 1);
        counting.gated.store(false, Ordering::SeqCst);
        counting.gate.notify_waiters();
        for answer in answers {
            assert_eq!(answer.await, Ok(admitted()));
        }
        assert_eq!(
            counting.decision_calls.load(Ordering::SeqCst),
            MAX_IN_FLIGHT + 1
        );
    }

    /// An idle owner gets each request at once: one call per request, nothing held back.
    #[tokio::test]
    async fn an_idle_owner_is_asked_at_once() {
        let (counting, pool) = one_owner();
        let batching = Batching::new(Arc::clone(&counting));
        for _ in 0..3 {
            let grant = batching.acquire("n1", request("b")).await.unwrap();
            let Grant::Granted { id, .. } = grant else {
                panic!("{grant:?}");
            };
            batching.release("n1", "b", id).await.unwrap();
        }
        assert_eq!(counting.lease_calls.load(Ordering::SeqCst), 3);
        // Releases go out on their own task; they land by the next batch at the latest.
        until("every release landed", || pool.in_use("b", 0) == 0).await;
    }

    /// A grant whose asker gave up waiting is given back rather than held until its TTL.
    #[tokio::test]
    async fn a_grant_nobody_waits_for_is_given_back() {
        let (counting, pool) = one_owner();
        counting.gated.store(true, Ordering::SeqCst);
        let batching = Batching::new(Arc::clone(&counting));
        let asked = batching.acquire("n1", request("b"));
        // The asker stops waiting (a timeout would drop it the same way)…
        let gave_up = tokio::time::timeout(std::time::Duration::ZERO, asked).await;
        assert!(gave_up.is_err());
        until("the call", || {
            counting.lease_calls.load(Ordering::SeqCst) >= 1
        })
        .await;
        // …then the owner grants it.
        counting.gated.store(false, Ordering::SeqCst);
        counting.gate.notify_waiters();
        until("the late grant given back", || {
            counting.release_calls.load(Ordering::SeqCst) >= 1 && pool.in_use("b", 0) == 0
        })
        .await;
    }

    /// A loan's growth whose asker gave up is given back unit by unit: the loan, which its
    /// holder goes on using, stays.
    #[tokio::test]
    async fn a_loans_growth_nobody_waits_for_gives_back_only_what_it_added() {
        let (counting, pool) = one_owner();
        let batching = Batching::new(Arc::clone(&counting));
        let first = LeaseRequest {
            units: 4,
            lend: true,
            ..request("b")
        };
        let Ok(Grant::Granted { units: 4, .. }) = batching.acquire("n1", first).await else {
            panic!("a loan of 4");
        };
        counting.gated.store(true, Ordering::SeqCst);
        let grow = LeaseRequest {
            units: 3,
            lend: true,
            ..request("b")
        };
        let gave_up =
            tokio::time::timeout(std::time::Duration::ZERO, batching.acquire("n1", grow)).await;
        assert!(gave_up.is_err());
        until("the call", || {
            counting.lease_calls.load(Ordering::SeqCst) >= 2
        })
        .await;
        counting.gated.store(false, Ordering::SeqCst);
        counting.gate.notify_waiters();
        until("the 3 added units given back", || pool.in_use("b", 0) == 4).await;
        assert_eq!(counting.release_calls.load(Ordering::SeqCst), 0);
    }

    /// An owner forgotten (it left) and asked again later gets fresh queues and tasks.
    #[tokio::test]
    async fn a_forgotten_owner_is_batched_afresh_when_asked_again() {
        let (counting, pool) = one_owner();
        let batching = Batching::new(Arc::clone(&counting));
        assert!(batching.acquire("n1", request("b")).await.is_ok());
        batching.retain_owners(|owner| owner != "n1");
        assert!(batching.owners.lock().unwrap().is_empty());
        assert!(batching.acquire("n1", request("b")).await.is_ok());
        assert_eq!(pool.in_use("b", 0), 2);
        assert_eq!(counting.lease_calls.load(Ordering::SeqCst), 2);
    }
}
