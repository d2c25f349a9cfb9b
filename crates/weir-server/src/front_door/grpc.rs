//! The gRPC API (tonic): the same operations as HTTP, and a bidirectional acquire stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use std::time::Instant;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::app::{AcquireInput, AcquireOutcome, App, ThrottleQuery};
use crate::error::{ApiError, ErrorKind};
use crate::proto::weir_server::Weir;
use crate::proto::{
    AcquireRequest, AcquireResponse, BusyRequest, BusyResponse, ReleaseRequest, ReleaseResponse,
    RenewRequest, RenewResponse, StatsRequest, StatsResponse, ThrottleRow, ThrottlesRequest,
    ThrottlesResponse,
};

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Self {
        let kind = error.kind();
        let message = error.into_detail();
        match kind {
            ErrorKind::InvalidRequest | ErrorKind::TooLarge => Status::invalid_argument(message),
            ErrorKind::Unauthenticated => Status::unauthenticated(message),
            ErrorKind::Forbidden | ErrorKind::HostNotAllowed => Status::permission_denied(message),
            ErrorKind::NotFound | ErrorKind::UnknownPolicy | ErrorKind::UnknownLease => {
                Status::not_found(message)
            }
            ErrorKind::Conflict | ErrorKind::PreconditionFailed => {
                Status::failed_precondition(message)
            }
            ErrorKind::NotReady | ErrorKind::ShuttingDown | ErrorKind::NoQuorum => {
                Status::unavailable(message)
            }
            // gRPC's word for "it may have happened".
            ErrorKind::OutcomeUnknown => Status::deadline_exceeded(message),
            ErrorKind::MethodNotAllowed | ErrorKind::BodyTimeout | ErrorKind::Internal => {
                Status::internal(message)
            }
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

/// An acquire request as the core takes it, and the id its answer carries.
struct Asked {
    input: AcquireInput,
    id: u64,
}

fn input(request: AcquireRequest) -> Asked {
    Asked {
        id: request.id,
        input: AcquireInput {
            policy: request.policy,
            key: request.key,
            // proto3's empty string is no kind.
            kind: (!request.kind.is_empty()).then_some(request.kind),
            cost: (request.cost > 0).then_some(request.cost),
            max_wait_ms: request.max_wait_ms,
        },
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
            tier: tier.name().into(),
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

/// The most acquires one `AcquireStream` may have waiting at once.
pub const MAX_PENDING_PER_STREAM: usize = 1024;

type AcquireStream = Pin<Box<dyn Stream<Item = Result<AcquireResponse, Status>> + Send + 'static>>;

impl WeirService {
    /// Checks a data-plane call's `authorization` metadata against the data token.
    fn check_data<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check_data_token(&self.app, request)
    }
}

/// Checks a gRPC data-plane call (Weir's API, Envoy's rate limit service) for the data token in
/// its `authorization` metadata (`Bearer <token>`), when one is configured.
pub(super) fn check_data_token<T>(app: &App, request: &Request<T>) -> Result<(), Status> {
    // gRPC is not reachable from a web page (no host to check), so without a data token there
    // is nothing to look at.
    if !app.access().needs_data_token() {
        return Ok(());
    }
    let authorization = request
        .metadata()
        .get("authorization")
        .and_then(|value| value.to_str().ok());
    app.access()
        .check_data(authorization, None)
        .map_err(Status::from)
}

#[tonic::async_trait]
impl Weir for WeirService {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let start = Instant::now();
        if let Err(refused) = self.check_data(&request) {
            let refused = Err(refused);
            self.observe("Acquire", start, &refused);
            return refused;
        }
        let request = input(request.into_inner());
        let id = request.id;
        let result = self
            .app
            .acquire(&request.input)
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
            .check_data(&request)
            .and_then(|()| {
                self.app
                    .release(&request.get_ref().lease)
                    .map_err(Status::from)
            })
            .map(|()| Response::new(ReleaseResponse { released: true }));
        self.observe("Release", start, &result);
        result
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let start = Instant::now();
        let result = match self.check_data(&request) {
            Err(refused) => Err(refused),
            Ok(()) => {
                let request = request.into_inner();
                self.app
                    .renew(&request.lease, request.ttl_ms)
                    .await
                    .map(|left| {
                        Response::new(RenewResponse {
                            expires_in_ms: left.as_millis() as u64,
                        })
                    })
                    .map_err(Status::from)
            }
        };
        self.observe("Renew", start, &result);
        result
    }

    async fn busy(&self, request: Request<BusyRequest>) -> Result<Response<BusyResponse>, Status> {
        let start = Instant::now();
        let result = self
            .check_data(&request)
            .and_then(|()| {
                self.app
                    .policy_admin()
                    .busy(&request.get_ref().policy)
                    .map_err(Status::from)
            })
            .map(|tightened| Response::new(BusyResponse { tightened }));
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
                            throttled_qps: r.row.throttled_qps,
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

    async fn stats(
        &self,
        request: Request<StatsRequest>,
    ) -> Result<Response<StatsResponse>, Status> {
        let start = Instant::now();
        let admin = self.app.policy_admin();
        let stats = self.app.stats();
        let result = Ok(Response::new(StatsResponse {
            node_id: stats.node_id,
            at_ms: stats.at_ms,
            config_version: admin.config_version(),
            policies: stats.policies.into_iter().map(Into::into).collect(),
            versions: match request.get_ref().with_versions {
                true => admin.policy_versions(),
                false => Vec::new(),
            },
        }));
        self.observe("Stats", start, &result);
        result
    }

    type AcquireStreamStream = AcquireStream;

    /// A request decided at once is answered at once; one that has to wait waits beside the
    /// stream, so it does not hold up the others. Answers carry the request's `id`. An invalid
    /// request is answered in-band (`error`) so the stream goes on. See `Answers`.
    async fn acquire_stream(
        &self,
        request: Request<Streaming<AcquireRequest>>,
    ) -> Result<Response<Self::AcquireStreamStream>, Status> {
        self.check_data(&request)?;
        Ok(Response::new(Box::pin(Answers {
            app: Arc::clone(&self.app),
            incoming: request.into_inner(),
            waiting: FuturesUnordered::new(),
            ended: false,
        })))
    }
}

/// An acquire of a stream being decided.
type Deciding = Pin<Box<dyn Future<Output = AcquireResponse> + Send>>;

/// The answers of one `AcquireStream`, decided as the stream is asked for them.
///
/// The stream itself reads the caller's requests and decides them: no task and no channel
/// between the two (they cost a measurable share of a decision against a bare tonic stream:
/// `docs/benchmarks.md`). Acquires that have to wait are kept here until decided, at most
/// [`MAX_PENDING_PER_STREAM`] at a time (past that, an in-band error, before any deciding),
/// and end with the stream: when the caller cancels or goes away, each is given up, and none
/// is admitted later for nobody. (An answer already handed to the transport when the caller
/// vanishes is lost with it; a lease it carried is held until its TTL.)
struct Answers {
    app: Arc<App>,
    incoming: Streaming<AcquireRequest>,
    /// Acquires that had to wait, answered as they are decided.
    waiting: FuturesUnordered<Deciding>,
    /// The caller has sent its last request.
    ended: bool,
}

/// Decides `request` for a stream, and counts it.
fn decide(app: Arc<App>, request: AcquireRequest) -> Deciding {
    Box::pin(async move {
        let start = Instant::now();
        let asked = input(request);
        let answered = match app.acquire(&asked.input).await {
            Ok(outcome) => answer(outcome, asked.id),
            Err(error) => AcquireResponse {
                id: asked.id,
                error: error.to_string(),
                ..Default::default()
            },
        };
        app.metrics()
            .observe("grpc", "AcquireStream", "0", start.elapsed());
        answered
    })
}

impl Stream for Answers {
    type Item = Result<AcquireResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(Some(answer)) = this.waiting.poll_next_unpin(cx) {
            return Poll::Ready(Some(Ok(answer)));
        }
        while !this.ended {
            match this.incoming.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    if this.waiting.len() >= MAX_PENDING_PER_STREAM {
                        // Refused before any of it is decided (in cluster mode, before the
                        // bucket's owner is asked).
                        return Poll::Ready(Some(Ok(AcquireResponse {
                            id: request.id,
                            error: format!(
                                "this stream already has {MAX_PENDING_PER_STREAM} acquires pending, the most one stream may; wait for answers before asking more, or open another stream"
                            ),
                            ..Default::default()
                        })));
                    }
                    let mut deciding = decide(Arc::clone(&this.app), request);
                    if let Poll::Ready(answer) = deciding.as_mut().poll(cx) {
                        return Poll::Ready(Some(Ok(answer)));
                    }
                    this.waiting.push(deciding);
                }
                // The caller has sent its last request (or its stream broke): the answers end
                // once the waiting acquires are answered.
                Poll::Ready(Some(Err(_)) | None) => this.ended = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match this.waiting.poll_next_unpin(cx) {
            Poll::Ready(Some(answer)) => Poll::Ready(Some(Ok(answer))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
