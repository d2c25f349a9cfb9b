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

    fn observe<T>(&self, method: &'static str, start: Instant, result: &Result<T, Status>) {
        let code = match result {
            Ok(_) => "0",
            Err(status) => grpc_code(status.code()),
        };
        self.app
            .metrics()
            .observe("grpc", method, code, start.elapsed());
    }
}

/// A gRPC status code as its number, the label `code` shows.
pub(super) fn grpc_code(code: tonic::Code) -> &'static str {
    const CODES: [&str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];
    CODES.get(code as usize).copied().unwrap_or("2")
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

/// The most acquires one `AcquireStream` may have pending (waiting or being decided) at once.
pub const MAX_PENDING_PER_STREAM: usize = 1024;

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
    ///
    /// The acquires a stream has pending end with it: at most [`MAX_PENDING_PER_STREAM`] at a
    /// time (past that, an in-band error), each given up the moment the caller cancels or goes
    /// away, and one admitted in the instant the caller left is released at once, not held by
    /// nobody until its lease expires.
    async fn acquire_stream(
        &self,
        request: Request<Streaming<AcquireRequest>>,
    ) -> Result<Response<Self::AcquireStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<AcquireResponse, Status>>(1024);
        let app = Arc::clone(&self.app);
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_PER_STREAM));
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = incoming.next() => next,
                    // The caller cancelled or hung up: read no more.
                    () = tx.closed() => break,
                };
                let Some(Ok(request)) = next else {
                    break;
                };
                let id = request.id;
                let Ok(slot) = Arc::clone(&pending).try_acquire_owned() else {
                    let refusal = AcquireResponse {
                        id,
                        error: format!(
                            "this stream already has {MAX_PENDING_PER_STREAM} acquires pending, the most one stream may; wait for answers before asking more, or open another stream"
                        ),
                        ..Default::default()
                    };
                    if tx.send(Ok(refusal)).await.is_err() {
                        break;
                    }
                    continue;
                };
                let app = Arc::clone(&app);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let start = Instant::now();
                    let decided = tokio::select! {
                        biased;
                        // Dropping a waiting acquire gives its place back.
                        () = tx.closed() => return,
                        decided = app.acquire(input(request)) => decided,
                    };
                    let answer = match decided {
                        Ok(outcome) => answer(outcome, id),
                        Err(error) => AcquireResponse {
                            id,
                            error: error.to_string(),
                            ..Default::default()
                        },
                    };
                    app.metrics()
                        .observe("grpc", "AcquireStream", "0", start.elapsed());
                    let lease = answer.lease.clone();
                    if tx.send(Ok(answer)).await.is_err() && !lease.is_empty() {
                        // Admitted for a caller that has gone: nobody would ever release it.
                        let _ = app.release(&lease);
                    }
                });
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}
