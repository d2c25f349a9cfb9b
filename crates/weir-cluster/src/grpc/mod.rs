//! The node-to-node gRPC protocol (`proto/weir/cluster/v1/cluster.proto`): the owner's service
//! and the coordinator's [`Transport`] over it.
//!
//! Times cross the wire as durations, never instants: each node's clock has its own origin.
//! The owner stamps a lease with its own clock; the coordinator turns the remaining time back
//! into an instant on its clock.

mod census;
mod server;
mod wire;

pub use server::{ClusterService, GuardedCluster};
use wire::{
    decision_of, grant_of, report_answer_of, wire_ask, wire_handover, wire_report, wire_request,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use weir::clock::duration_to_nanos;
use weir::limiter::Quota;
use weir::{Clock, Nanos};

use crate::owner::Owner;
use crate::pool::Grant;
use crate::rates::{
    Assignment, Decided, Handover, Lent, RateAsk, RateDecision, RateOwner, RateReport, Report,
    ReportAnswer,
};
use crate::secret::{AttachToken, ClusterSecret, RequireToken};
use crate::transport::{
    Adoption, Ask, BoxFuture, Fence, LeaseRequest, Message, Renewal, Reply, Transport,
    TransportError, replied,
};

/// The generated types and services.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("weir.cluster.v1");
}

use proto::cluster_client::ClusterClient;
use proto::lease_reply::Outcome;

/// How a transport opens a channel to an address: lazily over TCP by default; a simulation
/// brings its own network.
pub type Connect = Box<dyn Fn(&str) -> Option<Channel> + Send + Sync>;

/// How often an idle or busy connection to an owner is pinged…
pub const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// …and how long an unanswered ping takes to close it.
pub const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long opening a connection to an owner may take (the TCP connect, and the TLS
/// handshake where there is one) before the owner counts as unreachable.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The endpoint of an owner at `address` (`http://host:port`). HTTP/2 pings find a connection
/// that died without a word (a partition drops packets; nothing says the peer is gone): it is
/// closed after [`KEEP_ALIVE_TIMEOUT`] and the next call opens a fresh one. Without them, a
/// coordinator kept failing open on a dead connection long after the network healed. A
/// connection that cannot be opened within [`CONNECT_TIMEOUT`] fails, rather than stalling
/// the calls queued on it.
pub fn endpoint(address: &str) -> Option<Endpoint> {
    Some(
        Endpoint::from_shared(address.to_owned())
            .ok()?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true),
    )
}

/// A coordinator's way to owners over gRPC: one lazily connected channel per owner, addresses
/// from membership.
pub struct GrpcTransport<C: Clock> {
    addresses: ArcSwap<HashMap<String, String>>,
    clients: Mutex<HashMap<String, Client>>,
    connect: Connect,
    clock: C,
    token: AttachToken,
}

/// A client of another node, carrying the secret's token.
type Client = ClusterClient<tonic::service::interceptor::InterceptedService<Channel, AttachToken>>;

impl<C: Clock> std::fmt::Debug for GrpcTransport<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcTransport")
            .field("addresses", &self.addresses.load())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> GrpcTransport<C> {
    /// A transport with no owners known yet; `clock` turns lease lifetimes into instants.
    pub fn new(clock: C) -> Self {
        GrpcTransport::with_connect(
            clock,
            Box::new(|address| Some(endpoint(address)?.connect_lazy())),
        )
    }

    /// Like [`new`](Self::new), opening channels with `connect`.
    pub fn with_connect(clock: C, connect: Connect) -> Self {
        GrpcTransport {
            addresses: ArcSwap::from_pointee(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            connect,
            clock,
            token: AttachToken::default(),
        }
    }

    /// Calls carry `secret`'s token (when the cluster has a secret).
    pub fn with_secret(mut self, secret: Option<&ClusterSecret>) -> Self {
        self.token = secret.map(ClusterSecret::attach).unwrap_or_default();
        self
    }

    /// Sets the gRPC address (`http://host:port`) of every known node.
    pub fn set_addresses(&self, addresses: HashMap<String, String>) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        // A node gone, or back at another address (a restart), gets a new channel.
        let old = self.addresses.load();
        clients.retain(|node, _| addresses.get(node) == old.get(node));
        self.addresses.store(Arc::new(addresses));
    }

    /// One `Unlease` call: `units` of lease `lease` back (0: the whole lease); `moved_away`:
    /// the lease went to the bucket's new owner (see [`Message::MovedAway`]).
    fn unlease(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
        moved_away: bool,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let client = self.client(owner);
        let (owner, bucket) = (owner.to_owned(), bucket.to_owned());
        Box::pin(async move {
            client?
                .unlease(proto::UnleaseRequest {
                    bucket,
                    id: lease,
                    units,
                    moved_away,
                })
                .await
                .map(|_| ())
                .map_err(|_| TransportError::Unreachable(owner))
        })
    }

    fn client(&self, owner: &str) -> Result<Client, TransportError> {
        let unreachable = || TransportError::Unreachable(owner.to_owned());
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(owner) {
            return Ok(client.clone());
        }
        let address = self
            .addresses
            .load()
            .get(owner)
            .cloned()
            .ok_or_else(unreachable)?;
        let channel = (self.connect)(&address).ok_or_else(unreachable)?;
        let client = ClusterClient::with_interceptor(channel, self.token.clone());
        clients.insert(owner.to_owned(), client.clone());
        Ok(client)
    }
}

/// How long a forwarded decision may take beyond its own `max_wait` before its owner counts
/// as unreachable.
pub const FORWARD_TIMEOUT: Duration = Duration::from_millis(200);

/// Runs `call` to `owner` in a span for traces (target `weir::cluster`, level TRACE: enabled
/// only by a trace exporter, and then free of cost otherwise), recording whether the owner was
/// reached.
fn traced<'a, T: Send + 'a>(
    owner: &str,
    call: &'static str,
    requests: usize,
    reached: fn(&T) -> bool,
    future: impl Future<Output = T> + Send + 'a,
) -> BoxFuture<'a, T> {
    let span = tracing::trace_span!(
        target: "weir::cluster",
        "owner_call",
        owner,
        call,
        requests,
        reached = tracing::field::Empty,
    );
    if span.is_disabled() {
        return Box::pin(future);
    }
    Box::pin(async move {
        let outcome = tracing::Instrument::instrument(future, span.clone()).await;
        span.record("reached", reached(&outcome));
        outcome
    })
}

fn reached_one<T>(outcome: &Result<T, TransportError>) -> bool {
    !matches!(outcome, Err(TransportError::Unreachable(_)))
}

// A `&Vec`, not a slice: it is `traced`'s `fn(&T)` for a batch's answers, `T` being the `Vec`.
#[allow(clippy::ptr_arg)]
fn reached_all<T>(outcomes: &Vec<Result<T, TransportError>>) -> bool {
    outcomes.iter().all(reached_one)
}

impl<C: Clock> GrpcTransport<C> {
    /// One unary call, given the request's `max_wait` and [`FORWARD_TIMEOUT`] more; past that
    /// the owner is unreachable.
    fn call_decide(
        &self,
        owner: &str,
        ask: RateAsk,
    ) -> BoxFuture<'_, Result<RateDecision, TransportError>> {
        let client = self.client(owner);
        let asked = owner;
        let owner = owner.to_owned();
        traced(asked, "decide", 1, reached_one, async move {
            let timeout = ask.max_wait.saturating_add(FORWARD_TIMEOUT);
            let mut call = Request::new(wire_ask(ask));
            call.set_timeout(timeout);
            let reply = client?
                .decide(call)
                .await
                .map_err(|_| TransportError::Unreachable(owner))?;
            Ok(decision_of(reply.into_inner()))
        })
    }

    /// One `DecideBatch` call carrying `requests` (decisions that do not wait, handovers or
    /// reports, as the wire carries them all), each reply read by `read`; one answer per
    /// request, in order.
    fn call_decide_batch<T: Clone + Send + 'static>(
        &self,
        owner: &str,
        what: &'static str,
        requests: Vec<proto::DecideRequest>,
        read: fn(proto::DecideReply) -> T,
    ) -> BoxFuture<'_, Vec<Result<T, TransportError>>> {
        let client = self.client(owner);
        let asked = owner;
        let owner = owner.to_owned();
        traced(asked, what, requests.len(), reached_all, async move {
            let count = requests.len();
            let unreachable = || vec![Err(TransportError::Unreachable(owner.clone())); count];
            let Ok(mut client) = client else {
                return unreachable();
            };
            let mut call = Request::new(proto::DecideBatchRequest { requests });
            call.set_timeout(FORWARD_TIMEOUT);
            match client.decide_batch(call).await {
                Ok(reply) => {
                    let mut answers: Vec<_> = reply
                        .into_inner()
                        .replies
                        .into_iter()
                        .map(|reply| Ok(read(reply)))
                        .collect();
                    // A short reply leaves the rest unanswered: their askers decide alone.
                    answers.resize(count, Err(TransportError::Unreachable(owner.clone())));
                    answers
                }
                Err(_) => unreachable(),
            }
        })
    }

    /// Asks `member` for its census answer to `owner`, which runs the ring `fingerprint`:
    /// `None` if it is not ready yet.
    fn call_census(
        &self,
        member: &str,
        owner: String,
        fingerprint: u64,
    ) -> BoxFuture<'_, Result<Option<crate::census::Answer>, TransportError>> {
        let client = self.client(member);
        let member = member.to_owned();
        Box::pin(async move {
            let reply = client?
                .census(proto::CensusRequest { owner, fingerprint })
                .await
                .map_err(|_| TransportError::Unreachable(member))?;
            Ok(census::answer_of(reply.into_inner()))
        })
    }

    fn call_acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        let client = self.client(owner);
        let asked = owner;
        let owner = owner.to_owned();
        traced(asked, "lease", 1, reached_one, async move {
            let now = request.now;
            let reply = client?
                .lease(wire_request(request))
                .await
                .map_err(|_| TransportError::Unreachable(owner.clone()))?
                .into_inner();
            grant_of(&reply, now, &owner)
        })
    }

    fn call_acquire_batch(
        &self,
        owner: &str,
        requests: Vec<LeaseRequest>,
    ) -> BoxFuture<'_, Vec<Result<Grant, TransportError>>> {
        let client = self.client(owner);
        let asked = owner;
        let owner = owner.to_owned();
        traced(
            asked,
            "lease_batch",
            requests.len(),
            reached_all,
            async move {
                let unreachable =
                    |n: usize| vec![Err(TransportError::Unreachable(owner.clone())); n];
                let count = requests.len();
                let Ok(mut client) = client else {
                    return unreachable(count);
                };
                let nows: Vec<Nanos> = requests.iter().map(|r| r.now).collect();
                let batch = proto::LeaseBatchRequest {
                    requests: requests.into_iter().map(wire_request).collect(),
                };
                match client.lease_batch(batch).await {
                    Ok(reply) => reply
                        .into_inner()
                        .replies
                        .iter()
                        .zip(nows)
                        .map(|(reply, now)| grant_of(reply, now, &owner))
                        .collect(),
                    Err(_) => unreachable(count),
                }
            },
        )
    }

    fn call_release_batch(
        &self,
        owner: &str,
        leases: Vec<(String, u64)>,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let client = self.client(owner);
        let asked = owner;
        let owner = owner.to_owned();
        traced(
            asked,
            "unlease_batch",
            leases.len(),
            reached_one,
            async move {
                let leases = leases
                    .into_iter()
                    .map(|(bucket, id)| proto::UnleaseRequest {
                        bucket,
                        id,
                        units: 0,
                        moved_away: false,
                    })
                    .collect();
                client?
                    .unlease_batch(proto::UnleaseBatchRequest { leases })
                    .await
                    .map(|_| ())
                    .map_err(|_| TransportError::Unreachable(owner))
            },
        )
    }

    fn call_release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.unlease(owner, bucket, lease, 0, false)
    }

    fn call_give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.unlease(owner, bucket, lease, units.max(1), false)
    }

    fn call_adopt(
        &self,
        owner: &str,
        adoption: Adoption,
    ) -> BoxFuture<'_, Result<u64, TransportError>> {
        let client = self.client(owner);
        let expires_in_ns = adoption.expires_at.saturating_sub(self.clock.now());
        let owner = owner.to_owned();
        Box::pin(async move {
            let reply = client?
                .adopt(proto::AdoptRequest {
                    bucket: adoption.bucket,
                    holder: adoption.holder,
                    expires_in_ns,
                    units: adoption.units,
                    lent: adoption.lent,
                })
                .await
                .map_err(|_| TransportError::Unreachable(owner.clone()))?
                .into_inner();
            if reply.adopted {
                Ok(reply.id)
            } else {
                Err(TransportError::NotOwner(owner))
            }
        })
    }

    fn call_renew(
        &self,
        owner: &str,
        renewal: Renewal,
    ) -> BoxFuture<'_, Result<bool, TransportError>> {
        let client = self.client(owner);
        let owner = owner.to_owned();
        Box::pin(async move {
            client?
                .renew(proto::RenewRequest {
                    bucket: renewal.bucket,
                    id: renewal.lease,
                    ttl_ns: duration_to_nanos(renewal.ttl),
                    fenced: renewal.fenced,
                })
                .await
                .map(|reply| reply.into_inner().renewed)
                .map_err(|_| TransportError::Unreachable(owner))
        })
    }
}

impl<C: Clock> Transport for GrpcTransport<C> {
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        match message {
            Message::Acquire(request) => replied(self.call_acquire(owner, request), Reply::Grant),
            Message::Release { bucket, lease } => {
                replied(self.call_release(owner, &bucket, lease), |()| Reply::Done)
            }
            Message::Adopt(adoption) => replied(self.call_adopt(owner, adoption), Reply::Adopted),
            Message::GiveBack {
                bucket,
                lease,
                units,
            } => replied(self.call_give_back(owner, &bucket, lease, units), |()| {
                Reply::Done
            }),
            Message::MovedAway {
                bucket,
                lease,
                idle,
            } => replied(self.unlease(owner, &bucket, lease, idle, true), |()| {
                Reply::Done
            }),
            Message::Renew(renewal) => replied(self.call_renew(owner, renewal), Reply::Renewed),
            Message::Decide(request) => replied(self.call_decide(owner, request), Reply::Decision),
            Message::AcquireBatch(requests) => {
                let answers = self.call_acquire_batch(owner, requests);
                Box::pin(async move { Ok(Reply::Grants(answers.await)) })
            }
            Message::ReleaseBatch(leases) => {
                replied(self.call_release_batch(owner, leases), |()| Reply::Done)
            }
            Message::DecideBatch(asks) => {
                let requests = asks.into_iter().map(wire_ask).collect();
                let answers = self.call_decide_batch(owner, "decide_batch", requests, decision_of);
                Box::pin(async move { Ok(Reply::Decisions(answers.await)) })
            }
            Message::HandOver(handovers) => {
                let requests = handovers.into_iter().map(wire_handover).collect();
                // Any reply is the owner's: a handover is taken on whatever its ring says.
                let answers = self.call_decide_batch(owner, "hand_over", requests, |_| ());
                let owner = owner.to_owned();
                Box::pin(async move {
                    match answers.await.into_iter().all(|answer| answer.is_ok()) {
                        true => Ok(Reply::Done),
                        false => Err(TransportError::Unreachable(owner)),
                    }
                })
            }
            Message::Report(reports) => {
                let requests = reports.into_iter().map(wire_report).collect();
                let answers = self.call_decide_batch(owner, "report", requests, report_answer_of);
                Box::pin(async move { Ok(Reply::Assignments(answers.await)) })
            }
            Message::Census {
                owner: asker,
                fingerprint,
            } => replied(self.call_census(owner, asker, fingerprint), Reply::Census),
        }
    }
}
