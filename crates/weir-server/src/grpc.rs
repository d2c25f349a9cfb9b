//! The gRPC API (tonic): the same operations as HTTP, and a bidirectional acquire stream.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::app::{AcquireInput, AcquireOutcome, App, ThrottleQuery};
use crate::error::ApiError;
use crate::proto::weir_server::Weir;
use crate::proto::{
    AcquireRequest, AcquireResponse, BusyRequest, BusyResponse, ReleaseRequest, ReleaseResponse,
    RenewRequest, RenewResponse, ThrottleRow, ThrottlesRequest, ThrottlesResponse,
};

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Self {
        let message = error.detail;
        match error.status {
            400 | 413 => Status::invalid_argument(message),
            401 => Status::unauthenticated(message),
            403 => Status::permission_denied(message),
            404 => Status::not_found(message),
            409 | 412 => Status::failed_precondition(message),
            503 => Status::unavailable(message),
            _ => Status::internal(message),
        }
    }
}

/// The gRPC service over an [`App`].
#[derive(Debug, Clone)]
pub struct WeirService {
    app: Arc<App>,
}

impl WeirService {
    /// The service for `app`.
    pub fn new(app: Arc<App>) -> Self {
        WeirService { app }
    }

    fn observe<T>(&self, method: &str, start: Instant, result: &Result<T, Status>) {
        let code = match result {
            Ok(_) => "0".to_owned(),
            Err(status) => (status.code() as i32).to_string(),
        };
        self.app
            .metrics()
            .observe("grpc", method, &code, start.elapsed());
    }
}

fn input(request: AcquireRequest) -> AcquireInput {
    AcquireInput {
        policy: request.policy,
        key: request.key,
        kind: request.kind,
        cost: (request.cost > 0).then_some(request.cost),
        max_wait_ms: request.max_wait_ms,
    }
}

fn answer(outcome: AcquireOutcome, id: u64) -> AcquireResponse {
    match outcome {
        AcquireOutcome::Admitted {
            waited,
            lease,
            would_throttle,
            tier,
            ..
        } => AcquireResponse {
            admitted: true,
            waited_ms: waited.as_millis() as u64,
            lease: lease.map(|(id, _)| id).unwrap_or_default(),
            tier: tier.into(),
            id,
            would_throttle,
            ..Default::default()
        },
        AcquireOutcome::Refused {
            retry_after,
            reason,
            ..
        } => AcquireResponse {
            admitted: false,
            retry_after_ms: retry_after.map(|r| r.as_millis() as u64),
            reason,
            id,
            ..Default::default()
        },
    }
}

type AcquireStream = Pin<Box<dyn Stream<Item = Result<AcquireResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Weir for WeirService {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let start = Instant::now();
        let request = request.into_inner();
        let id = request.id;
        let result = self
            .app
            .acquire(input(request))
            .await
            .map(|outcome| Response::new(answer(outcome, id)))
            .map_err(Status::from);
        self.observe("Acquire", start, &result);
        result
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let start = Instant::now();
        let result = self
            .app
            .release(&request.into_inner().lease)
            .map(|()| Response::new(ReleaseResponse { released: true }))
            .map_err(Status::from);
        self.observe("Release", start, &result);
        result
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let start = Instant::now();
        let request = request.into_inner();
        let result = self
            .app
            .renew(&request.lease, request.ttl_ms)
            .await
            .map(|left| {
                Response::new(RenewResponse {
                    expires_in_ms: left.as_millis() as u64,
                })
            })
            .map_err(Status::from);
        self.observe("Renew", start, &result);
        result
    }

    async fn busy(&self, request: Request<BusyRequest>) -> Result<Response<BusyResponse>, Status> {
        let start = Instant::now();
        let result = self
            .app
            .busy(&request.into_inner().policy)
            .map(|tightened| Response::new(BusyResponse { tightened }))
            .map_err(Status::from);
        self.observe("Busy", start, &result);
        result
    }

    async fn throttles(
        &self,
        request: Request<ThrottlesRequest>,
    ) -> Result<Response<ThrottlesResponse>, Status> {
        let start = Instant::now();
        let request = request.into_inner();
        let query = ThrottleQuery {
            policy: (!request.policy.is_empty()).then_some(request.policy),
            limit: (request.limit > 0).then_some(request.limit as usize),
            ..ThrottleQuery::default()
        };
        let result = self
            .app
            .throttles(&query)
            .map(|rows| {
                Response::new(ThrottlesResponse {
                    rows: rows
                        .into_iter()
                        .map(|r| ThrottleRow {
                            node_id: r.node_id,
                            policy: r.row.policy,
                            key: r.row.key,
                            kind: r.row.kind,
                            qps_limit: r.row.qps_limit,
                            current_qps: r.row.current_qps,
                            in_flight: r.row.in_flight,
                            waiters: r.row.waiters,
                        })
                        .collect(),
                })
            })
            .map_err(Status::from);
        self.observe("Throttles", start, &result);
        result
    }

    type AcquireStreamStream = AcquireStream;

    /// Each request is decided on its own task, so one that waits does not hold up the others;
    /// answers carry the request's `id`. An invalid request is answered in-band (`error`) so the
    /// stream goes on.
    async fn acquire_stream(
        &self,
        request: Request<Streaming<AcquireRequest>>,
    ) -> Result<Response<Self::AcquireStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<AcquireResponse, Status>>(1024);
        let app = Arc::clone(&self.app);
        tokio::spawn(async move {
            while let Some(next) = incoming.next().await {
                let Ok(request) = next else {
                    break;
                };
                let id = request.id;
                let app = Arc::clone(&app);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let start = Instant::now();
                    let answer = match app.acquire(input(request)).await {
                        Ok(outcome) => answer(outcome, id),
                        Err(error) => AcquireResponse {
                            id,
                            error: error.to_string(),
                            ..Default::default()
                        },
                    };
                    app.metrics()
                        .observe("grpc", "AcquireStream", "0", start.elapsed());
                    let _ = tx.send(Ok(answer)).await;
                });
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}
