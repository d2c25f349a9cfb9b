//! An owner's side of the node-to-node protocol: its pool behind the ownership fence and the
//! decisions of the cluster-scoped rate buckets it owns, single and batched.

use super::wire::{
    Forwarded, ask_of, fence_of, outcome_only, request_of, wire_decision, wire_report_answer,
};
use super::{
    Arc, Clock, ClusterSecret, Duration, Grant, LeaseRequest, Outcome, Owner, RateOwner, Request,
    RequireToken, Response, Status, TransportError, duration_to_nanos, proto,
};

/// An owner's side of the protocol: its pool behind the ownership fence, on its own clock,
/// and the decisions of the cluster-scoped rate buckets it owns.
pub struct ClusterService<C: Clock> {
    owner: Arc<Owner>,
    clock: C,
    rates: Option<Arc<dyn RateOwner>>,
    census: Option<Arc<dyn crate::census::CensusAnswers>>,
}

impl<C: Clock> std::fmt::Debug for ClusterService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterService")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> ClusterService<C> {
    /// The service for `owner`, stamping leases with `clock`.
    pub fn new(owner: Arc<Owner>, clock: C) -> Self {
        ClusterService {
            owner,
            clock,
            rates: None,
            census: None,
        }
    }

    /// Answers new owners' census with `census` (without it, never ready: they wait out
    /// their tenure).
    pub fn with_census(mut self, census: Arc<dyn crate::census::CensusAnswers>) -> Self {
        self.census = Some(census);
        self
    }

    /// Decides forwarded requests of cluster-scoped rate policies with `rates` (without it
    /// they are answered `UNKNOWN_POLICY`).
    pub fn with_rates(mut self, rates: Arc<dyn RateOwner>) -> Self {
        self.rates = Some(rates);
        self
    }

    /// The tonic server for this service, refusing calls without `secret`'s token when the
    /// cluster has a secret.
    pub fn into_server(self, secret: Option<&ClusterSecret>) -> GuardedCluster<C> {
        proto::cluster_server::ClusterServer::with_interceptor(
            self,
            secret.map(ClusterSecret::require).unwrap_or_default(),
        )
    }
}

impl<C: Clock> ClusterService<C> {
    /// Ends a lease, gives some of a loan's units back, or takes note of a handoff.
    fn unlease_one(&self, request: &proto::UnleaseRequest) {
        match (request.moved_away, request.units) {
            (true, idle) => self.owner.moved_away(&request.bucket, request.id, idle),
            (false, 0) => self.owner.release(&request.bucket, request.id),
            (false, units) => self.owner.give_back(&request.bucket, request.id, units),
        }
    }

    /// Answers one lease request, stamping a grant with this node's clock.
    fn grant(&self, request: proto::LeaseRequest) -> proto::LeaseReply {
        let now = self.clock.now();
        let (ask, fence) = (ask_of(&request), fence_of(&request));
        let grant = self.owner.grant(&LeaseRequest {
            bucket: request.bucket,
            limit: request.limit,
            holder: request.holder,
            ttl: Duration::from_nanos(request.ttl_ns),
            now,
            ask,
            fence,
        });
        match grant {
            Ok(Grant::Granted {
                id,
                expires_at,
                units,
                keep,
            }) => proto::LeaseReply {
                outcome: Outcome::Granted as i32,
                id,
                expires_in_ns: expires_at.saturating_sub(now),
                units,
                keep,
                ..Default::default()
            },
            Ok(Grant::Renewed {
                id,
                expires_at,
                keep,
            }) => proto::LeaseReply {
                outcome: Outcome::Granted as i32,
                id,
                expires_in_ns: expires_at.saturating_sub(now),
                units: 0,
                keep,
                ..Default::default()
            },
            Ok(Grant::Full) => proto::LeaseReply {
                outcome: Outcome::Full as i32,
                ..Default::default()
            },
            Ok(Grant::TooManyBuckets) => proto::LeaseReply {
                outcome: Outcome::TooManyBuckets as i32,
                ..Default::default()
            },
            Err(TransportError::Settling { wait, .. }) => proto::LeaseReply {
                outcome: Outcome::Settling as i32,
                settles_in_ns: duration_to_nanos(wait),
                ..Default::default()
            },
            Err(TransportError::NoMajority { heard, known, .. }) => proto::LeaseReply {
                outcome: Outcome::NoMajority as i32,
                heard: heard as u64,
                known: known as u64,
                ..Default::default()
            },
            Err(_) => proto::LeaseReply {
                outcome: Outcome::NotOwner as i32,
                ..Default::default()
            },
        }
    }
}

impl<C: Clock> ClusterService<C> {
    /// Answers one forwarded request with the server's [`RateOwner`]: a decision, a handover
    /// taken on (answered admitted, as the wire always has), or a report.
    async fn decide_one(&self, request: proto::DecideRequest) -> proto::DecideReply {
        use proto::decide_reply::Outcome as Wire;
        let Some(rates) = &self.rates else {
            return outcome_only(Wire::UnknownPolicy);
        };
        match request_of(request) {
            Forwarded::Ask(ask) => wire_decision(rates.decide(ask).await),
            Forwarded::HandOver(handover) => {
                rates.take_on(handover);
                outcome_only(Wire::Admitted)
            }
            Forwarded::Report(report) => wire_report_answer(rates.report(report)),
        }
    }
}

#[tonic::async_trait]
impl<C: Clock> proto::cluster_server::Cluster for ClusterService<C> {
    async fn lease(
        &self,
        request: Request<proto::LeaseRequest>,
    ) -> Result<Response<proto::LeaseReply>, Status> {
        Ok(Response::new(self.grant(request.into_inner())))
    }

    async fn lease_batch(
        &self,
        request: Request<proto::LeaseBatchRequest>,
    ) -> Result<Response<proto::LeaseBatchReply>, Status> {
        let replies = request
            .into_inner()
            .requests
            .into_iter()
            .map(|request| self.grant(request))
            .collect();
        Ok(Response::new(proto::LeaseBatchReply { replies }))
    }

    async fn unlease_batch(
        &self,
        request: Request<proto::UnleaseBatchRequest>,
    ) -> Result<Response<proto::UnleaseReply>, Status> {
        for lease in request.into_inner().leases {
            self.unlease_one(&lease);
        }
        Ok(Response::new(proto::UnleaseReply {}))
    }

    async fn decide(
        &self,
        request: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideReply>, Status> {
        Ok(Response::new(self.decide_one(request.into_inner()).await))
    }

    async fn decide_batch(
        &self,
        request: Request<proto::DecideBatchRequest>,
    ) -> Result<Response<proto::DecideBatchReply>, Status> {
        let mut replies = Vec::new();
        for mut request in request.into_inner().requests {
            // A batch is answered in one go: nothing in it waits.
            request.max_wait_ns = 0;
            replies.push(self.decide_one(request).await);
        }
        Ok(Response::new(proto::DecideBatchReply { replies }))
    }

    async fn unlease(
        &self,
        request: Request<proto::UnleaseRequest>,
    ) -> Result<Response<proto::UnleaseReply>, Status> {
        self.unlease_one(&request.into_inner());
        Ok(Response::new(proto::UnleaseReply {}))
    }

    async fn renew(
        &self,
        request: Request<proto::RenewRequest>,
    ) -> Result<Response<proto::RenewReply>, Status> {
        let request = request.into_inner();
        let renewed = self.owner.renew(
            &request.bucket,
            request.id,
            Duration::from_nanos(request.ttl_ns),
            self.clock.now(),
            request.fenced,
        );
        Ok(Response::new(proto::RenewReply { renewed }))
    }

    async fn census(
        &self,
        request: Request<proto::CensusRequest>,
    ) -> Result<Response<proto::CensusReply>, Status> {
        let request = request.into_inner();
        let answer = self
            .census
            .as_ref()
            .and_then(|census| census.answer(&request.owner, request.fingerprint));
        Ok(Response::new(super::census::wire_answer(answer)))
    }

    async fn adopt(
        &self,
        request: Request<proto::AdoptRequest>,
    ) -> Result<Response<proto::AdoptReply>, Status> {
        let request = request.into_inner();
        let expires_at = self.clock.now().saturating_add(request.expires_in_ns);
        let reply = match self.owner.adopt(
            &request.bucket,
            &request.holder,
            expires_at,
            request.units.max(1),
            request.lent,
        ) {
            Ok(id) => proto::AdoptReply { adopted: true, id },
            Err(_) => proto::AdoptReply {
                adopted: false,
                id: 0,
            },
        };
        Ok(Response::new(reply))
    }
}

/// A node's cluster service behind the secret's check.
pub type GuardedCluster<C> = tonic::service::interceptor::InterceptedService<
    proto::cluster_server::ClusterServer<ClusterService<C>>,
    RequireToken,
>;
