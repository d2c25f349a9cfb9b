//! How a coordinator reaches a bucket's owner: one [`Message`] enum and its [`Reply`], sent
//! through the one-method [`Transport`] trait, which the gRPC transport ([`crate::grpc`]), the
//! in-memory one ([`crate::in_memory`]) and the batching wrapper ([`crate::batch`]) implement;
//! [`TransportExt`] gives each message a typed call. And the handover of rate buckets through
//! a transport after a ring change.

use std::sync::Arc;
use std::time::Duration;

use weir::Nanos;

use crate::census::Answer;
pub use crate::messages::{Ask, BoxFuture, Fence, LeaseRequest, TransportError};
use crate::pool::Grant;
use crate::rates::{Handover, RateAsk, RateDecision, RateOwner, Report, ReportAnswer, bucket_of};
use crate::ring::Ring;

/// What a coordinator says to a bucket's owner. A new kind of call is one more variant here,
/// its [`Reply`], and an arm in each transport that carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Grant a lease (or grow a loan): answered [`Reply::Grant`].
    Acquire(LeaseRequest),
    /// A lease is done: answered [`Reply::Done`].
    Release {
        /// The bucket.
        bucket: String,
        /// The lease.
        lease: u64,
    },
    /// Take on a live lease from the bucket's previous owner: answered [`Reply::Adopted`].
    Adopt(Adoption),
    /// Idle units of a loan given back, the loan going on with the rest: answered
    /// [`Reply::Done`].
    GiveBack {
        /// The bucket.
        bucket: String,
        /// The loan.
        lease: u64,
        /// Units given back.
        units: u64,
    },
    /// A lease (or loan) has been handed over to the bucket's new owner, and is done with here
    /// — unless the receiver still owns the bucket in its own ring (the holder's ring is
    /// ahead of it): then it may still grant, so what is in use stays counted until it
    /// expires, and only the `idle` units come back. Answered [`Reply::Done`].
    MovedAway {
        /// The bucket.
        bucket: String,
        /// The lease or loan, as the receiver knows it.
        lease: u64,
        /// Units of a loan that were not in use (0 for a plain lease): not handed over.
        idle: u64,
    },
    /// Extend a lease: answered [`Reply::Renewed`].
    Renew(Renewal),
    /// Decide a request of a cluster-scoped rate policy ([`crate::rates`]): answered
    /// [`Reply::Decision`].
    Decide(RateAsk),
    /// Take on buckets handed over by their previous owner: answered [`Reply::Done`].
    HandOver(Vec<Handover>),
    /// Holders' reports on buckets the receiver owns: answered [`Reply::Assignments`], one
    /// per report, in order.
    Report(Vec<Report>),
    /// A new owner's census: what the receiver holds for the buckets that `owner`, running
    /// the ring `fingerprint`, owns ([`crate::census`]): answered [`Reply::Census`].
    Census {
        /// The new owner asking.
        owner: String,
        /// Its ring's fingerprint.
        fingerprint: u64,
    },
    /// Several `Acquire`s at once: answered [`Reply::Grants`], one per request, in order.
    AcquireBatch(Vec<LeaseRequest>),
    /// Several `Release`s (bucket, lease) at once: answered [`Reply::Done`].
    ReleaseBatch(Vec<(String, u64)>),
    /// Several `Decide`s that do not wait: answered [`Reply::Decisions`], in order.
    DecideBatch(Vec<RateAsk>),
}

/// A live lease handed over to a bucket's new owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The bucket.
    pub bucket: String,
    /// Who holds it.
    pub holder: String,
    /// When it expires, on the caller's clock.
    pub expires_at: Nanos,
    /// Its units.
    pub units: u64,
    /// A loan, not a plain lease.
    pub lent: bool,
}

/// A lease to extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The bucket.
    pub bucket: String,
    /// The lease.
    pub lease: u64,
    /// How long from the owner's now.
    pub ttl: Duration,
    /// The time on the caller's clock (the simulation shares one clock).
    pub now: Nanos,
    /// Refuse unless the owner hears from a majority.
    pub fenced: bool,
}

/// An owner's answer to a [`Message`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// To `Acquire`.
    Grant(Grant),
    /// To `Release`, `GiveBack`, `MovedAway`, `ReleaseBatch` and `HandOver`.
    Done,
    /// To `Adopt`: the lease's id on the new owner.
    Adopted(u64),
    /// To `Renew`: false if the lease is gone there (or, fenced, the owner does not hear
    /// from a majority).
    Renewed(bool),
    /// To `Decide`.
    Decision(RateDecision),
    /// To `AcquireBatch`.
    Grants(Vec<Result<Grant, TransportError>>),
    /// To `DecideBatch`.
    Decisions(Vec<Result<RateDecision, TransportError>>),
    /// To `Report`.
    Assignments(Vec<Result<ReportAnswer, TransportError>>),
    /// To `Census`: `None` while the receiver cannot answer yet.
    Census(Option<Answer>),
}

/// A coordinator's way to an owner: one method, over one message enum, so that a wrapper (a
/// batching layer, a test's fault injector) is a few lines.
pub trait Transport: Send + Sync {
    /// Sends `message` to `owner`; its reply, or why the owner could not be asked.
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>>;
}

/// How a transport with no wire form for batches answers one: each item sent on its own,
/// through `transport`, in order. Any other message is sent as it is.
pub fn one_by_one<'a, T: Transport + ?Sized>(
    transport: &'a T,
    owner: &str,
    message: Message,
) -> BoxFuture<'a, Result<Reply, TransportError>> {
    let owner = owner.to_owned();
    match message {
        Message::AcquireBatch(requests) => Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(transport.acquire(&owner, request).await);
            }
            Ok(Reply::Grants(answers))
        }),
        Message::DecideBatch(requests) => Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(transport.decide(&owner, request).await);
            }
            Ok(Reply::Decisions(answers))
        }),
        Message::ReleaseBatch(leases) => Box::pin(async move {
            for (bucket, lease) in leases {
                transport.release(&owner, &bucket, lease).await?;
            }
            Ok(Reply::Done)
        }),
        single => transport.send(&owner, single),
    }
}

/// A typed call's answer as its [`Reply`]: how a transport made of typed calls answers
/// [`Transport::send`].
pub fn replied<'a, T: 'a>(
    call: BoxFuture<'a, Result<T, TransportError>>,
    reply: fn(T) -> Reply,
) -> BoxFuture<'a, Result<Reply, TransportError>> {
    Box::pin(async move { call.await.map(reply) })
}

/// A reply of the wrong kind for its message: a transport's bug, taken as the owner not
/// answering (the caller then does what it does when an owner cannot be asked).
fn mismatched<T>(owner: &str) -> Result<T, TransportError> {
    Err(TransportError::Unreachable(owner.to_owned()))
}

/// Each message as a typed call: what coordinators use.
pub trait TransportExt: Transport {
    /// Asks `owner` for a lease.
    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        let (sent, owner) = (
            self.send(owner, Message::Acquire(request)),
            owner.to_owned(),
        );
        Box::pin(async move {
            match sent.await? {
                Reply::Grant(grant) => Ok(grant),
                _ => mismatched(&owner),
            }
        })
    }

    /// Tells `owner` a lease is done.
    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let message = Message::Release {
            bucket: bucket.to_owned(),
            lease,
        };
        done(self.send(owner, message), owner)
    }

    /// Hands a live lease (a loan, if `adoption.lent`) over to the bucket's new `owner`;
    /// returns its id there.
    fn adopt(&self, owner: &str, adoption: Adoption) -> BoxFuture<'_, Result<u64, TransportError>> {
        let (sent, owner) = (self.send(owner, Message::Adopt(adoption)), owner.to_owned());
        Box::pin(async move {
            match sent.await? {
                Reply::Adopted(id) => Ok(id),
                _ => mismatched(&owner),
            }
        })
    }

    /// Gives `units` idle units of a loan back to `owner` (the loan goes on with the rest). A
    /// transport that cannot answers that the owner is unreachable: the units stay lent until
    /// the loan expires, which costs capacity, never the ceiling.
    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let message = Message::GiveBack {
            bucket: bucket.to_owned(),
            lease,
            units,
        };
        done(self.send(owner, message), owner)
    }

    /// Tells `owner`, the bucket's previous owner, that lease `lease` now lives with the new
    /// one (see [`Message::MovedAway`]).
    fn moved_away(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        idle: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let message = Message::MovedAway {
            bucket: bucket.to_owned(),
            lease,
            idle,
        };
        done(self.send(owner, message), owner)
    }

    /// Extends a lease on `owner`; false if it is gone there (or, fenced, if the owner does
    /// not hear from a majority).
    fn renew(&self, owner: &str, renewal: Renewal) -> BoxFuture<'_, Result<bool, TransportError>> {
        let (sent, owner) = (self.send(owner, Message::Renew(renewal)), owner.to_owned());
        Box::pin(async move {
            match sent.await? {
                Reply::Renewed(renewed) => Ok(renewed),
                _ => mismatched(&owner),
            }
        })
    }

    /// Asks `owner` to decide a request of a cluster-scoped rate policy ([`crate::rates`]).
    fn decide(
        &self,
        owner: &str,
        ask: RateAsk,
    ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
        let (sent, owner) = (self.send(owner, Message::Decide(ask)), owner.to_owned());
        Box::pin(async move {
            match sent.await? {
                Reply::Decision(decision) => Ok(decision),
                _ => mismatched(&owner),
            }
        })
    }

    /// Asks `owner` to decide several requests that do not wait; one answer per request, in
    /// order.
    fn decide_batch(
        &self,
        owner: &str,
        requests: Vec<RateAsk>,
    ) -> BoxFuture<'_, Vec<Result<RateDecision, TransportError>>> {
        let count = requests.len();
        let (sent, owner) = (
            self.send(owner, Message::DecideBatch(requests)),
            owner.to_owned(),
        );
        Box::pin(async move {
            match sent.await {
                Ok(Reply::Decisions(answers)) if answers.len() == count => answers,
                Ok(_) => vec![mismatched(&owner); count],
                Err(error) => vec![Err(error); count],
            }
        })
    }

    /// Hands `handovers` to `owner`, their new owner, in one call.
    fn hand_over_to(
        &self,
        owner: &str,
        handovers: Vec<Handover>,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        done(self.send(owner, Message::HandOver(handovers)), owner)
    }

    /// Sends holders' `reports` to `owner`; one answer per report, in order.
    fn report(
        &self,
        owner: &str,
        reports: Vec<Report>,
    ) -> BoxFuture<'_, Vec<Result<ReportAnswer, TransportError>>> {
        let count = reports.len();
        let (sent, owner) = (self.send(owner, Message::Report(reports)), owner.to_owned());
        Box::pin(async move {
            match sent.await {
                Ok(Reply::Assignments(answers)) if answers.len() == count => answers,
                Ok(_) => vec![mismatched(&owner); count],
                Err(error) => vec![Err(error); count],
            }
        })
    }

    /// Asks `member` for its census answer to `owner`, which runs the ring `fingerprint`:
    /// `None` if it cannot answer yet.
    fn census(
        &self,
        member: &str,
        owner: &str,
        fingerprint: u64,
    ) -> BoxFuture<'_, Result<Option<Answer>, TransportError>> {
        let message = Message::Census {
            owner: owner.to_owned(),
            fingerprint,
        };
        let (sent, member) = (self.send(member, message), member.to_owned());
        Box::pin(async move {
            match sent.await? {
                Reply::Census(answer) => Ok(answer),
                _ => mismatched(&member),
            }
        })
    }

    /// Asks `owner` for several leases; one answer per request, in order.
    fn acquire_batch(
        &self,
        owner: &str,
        requests: Vec<LeaseRequest>,
    ) -> BoxFuture<'_, Vec<Result<Grant, TransportError>>> {
        let count = requests.len();
        let (sent, owner) = (
            self.send(owner, Message::AcquireBatch(requests)),
            owner.to_owned(),
        );
        Box::pin(async move {
            match sent.await {
                Ok(Reply::Grants(answers)) if answers.len() == count => answers,
                Ok(_) => vec![mismatched(&owner); count],
                Err(error) => vec![Err(error); count],
            }
        })
    }

    /// Tells `owner` several leases (bucket, id) are done.
    fn release_batch(
        &self,
        owner: &str,
        leases: Vec<(String, u64)>,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        done(self.send(owner, Message::ReleaseBatch(leases)), owner)
    }
}

impl<T: Transport + ?Sized> TransportExt for T {}

/// A `Done` reply as `()`.
fn done<'a>(
    sent: BoxFuture<'a, Result<Reply, TransportError>>,
    owner: &str,
) -> BoxFuture<'a, Result<(), TransportError>> {
    let owner = owner.to_owned();
    Box::pin(async move {
        match sent.await? {
            Reply::Done => Ok(()),
            _ => mismatched(&owner),
        }
    })
}

/// The most handovers one call carries.
pub const HANDOVERS_PER_CALL: usize = 1_000;

/// Hands every cluster-scoped bucket that `before` named node `me` the owner of, and `after`
/// does not, to its owner in `after` — at most [`HANDOVERS_PER_CALL`] in one call per owner,
/// the calls all at once. Returns how many the new owners took. A bucket whose handover fails
/// starts on its new owner as that owner's own state has it (its policy's learning period
/// covers that case as it covers a crash).
pub async fn hand_over<T: Transport + 'static>(
    rates: &dyn RateOwner,
    transport: &Arc<T>,
    me: &str,
    before: &Ring,
    after: &Ring,
) -> usize {
    let handovers = rates.handovers(&mut |bucket| {
        before.owner_of(bucket) == Some(me) && after.owner_of(bucket).is_some_and(|o| o != me)
    });
    let mut by_owner: std::collections::HashMap<String, Vec<Handover>> =
        std::collections::HashMap::new();
    for handover in handovers {
        if let Some(owner) = after.owner_of(&bucket_of(&handover.policy, &handover.key)) {
            by_owner.entry(owner.to_owned()).or_default().push(handover);
        }
    }
    let mut sent = tokio::task::JoinSet::new();
    for (owner, mut handovers) in by_owner {
        while !handovers.is_empty() {
            let rest = handovers.split_off(handovers.len().min(HANDOVERS_PER_CALL));
            let call = std::mem::replace(&mut handovers, rest);
            let (owner, transport) = (owner.clone(), Arc::clone(transport));
            sent.spawn(async move {
                let count = call.len();
                let answered = transport.hand_over_to(&owner, call).await;
                if let Err(error) = &answered {
                    tracing::warn!(%owner, count, "rate buckets' handover failed: {error}");
                }
                if answered.is_ok() { count } else { 0 }
            });
        }
    }
    let mut taken = 0;
    while let Some(answered) = sent.join_next().await {
        taken += answered.unwrap_or(0);
    }
    taken
}
