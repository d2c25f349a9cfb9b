//! The unit tests of `batch.rs`.

use super::*;
use crate::in_memory::InMemory;
use crate::messages::Ask;
use crate::owner::Owner;
use crate::pool::SharedPool;
use crate::rates::{Decided, RateAsk};
use crate::ring::{DEFAULT_VNODES, Member, Ring, SharedRing};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        match message {
            Message::AcquireBatch(requests) => {
                self.lease_calls.fetch_add(1, Ordering::SeqCst);
                let owner = owner.to_owned();
                Box::pin(async move {
                    if self.gated.load(Ordering::SeqCst) {
                        self.gate.notified().await;
                    }
                    Ok(Reply::Grants(
                        self.network.acquire_batch(&owner, requests).await,
                    ))
                })
            }
            Message::ReleaseBatch(leases) => {
                self.release_calls.fetch_add(1, Ordering::SeqCst);
                self.network.send(owner, Message::ReleaseBatch(leases))
            }
            Message::Decide(_) => {
                self.single_decisions.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(Reply::Decision(admitted())) })
            }
            Message::DecideBatch(requests) => {
                self.decision_calls.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if self.gated.load(Ordering::SeqCst) {
                        self.gate.notified().await;
                    }
                    Ok(Reply::Decisions(
                        requests.iter().map(|_| Ok(admitted())).collect(),
                    ))
                })
            }
            other => self.network.send(owner, other),
        }
    }
}

fn admitted() -> RateDecision {
    RateDecision::Decided(Decided::Admitted {
        waited: Duration::ZERO,
        would_throttle: false,
        quota: None,
    })
}

fn decision(max_wait: Duration) -> RateAsk {
    RateAsk {
        policy: "p".to_owned(),
        key: "k".to_owned(),
        kind: None,
        cost: 1,
        max_wait,
        relayed: false,
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
        ask: Ask::borrow(4),
        ..request("b")
    };
    let Ok(Grant::Granted { units: 4, .. }) = batching.acquire("n1", first).await else {
        panic!("a loan of 4");
    };
    counting.gated.store(true, Ordering::SeqCst);
    let grow = LeaseRequest {
        ask: Ask::borrow(3),
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
