//! The gRPC service: one task per Envoy stream, which keeps the stream's buckets, reports them
//! to their owners as a holder of its own, and pushes what it is assigned.
//!
//! Envoy reports every bucket every 5 s (fixed in 1.40), and a new bucket at once. The stream
//! asks each bucket's owner every [`ASK_EVERY`], as a node reports its own demand, with the
//! demand Envoy last reported — so a re-balance reaches Envoy within a quarter of a second, not
//! five — and pushes a bucket's action when it changed, or when it last pushed it
//! [`PUSH_EVERY`] ago: Envoy re-arms an assignment's TTL on every push, and keeps the tokens of
//! a token bucket pushed again unchanged.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use weir_api::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use weir_api::envoy::r#type::v3::RateLimitStrategy;
use weir_cluster::assignment::RateReport;

use super::action::{Demand, strategy_of};
use super::buckets::RlqsTable;
use crate::app::{App, NoQuota};

/// How often a stream asks its buckets' owners again: a node's own report period.
pub const ASK_EVERY: Duration = weir_cluster::assignment::REPORT_EVERY;

/// How often an unchanged action is pushed again, to renew its TTL in Envoy.
pub const PUSH_EVERY: Duration = Duration::from_secs(1);

/// How long Envoy runs an assignment without hearing again (whole seconds, as Envoy reads
/// it): two renewals may be lost before it falls back to its `no_assignment_behavior`.
pub const ENVOY_TTL: Duration = Duration::from_secs(3);

/// How long the owner counts a stream's share after a report: Envoy's TTL and a second for
/// the push to reach it, so no share is lent twice while Envoy may still run it.
pub const OWNER_TTL: Duration = Duration::from_secs(4);

/// Reports in a row without a request (5 s each) before a bucket is abandoned: Envoy forgets
/// it, stops reporting it, and its share goes back; its next request starts it again.
pub const ABANDON_AFTER: u32 = 2;

/// The rate limit quota service, over an [`App`].
#[derive(Debug)]
pub struct RlqsService {
    app: Arc<App>,
    table: Arc<RlqsTable>,
    streams: AtomicU64,
}

impl RlqsService {
    /// The service, mapping bucket ids by `table`.
    pub fn new(app: Arc<App>, table: RlqsTable) -> Self {
        RlqsService {
            app,
            table: Arc::new(table),
            streams: AtomicU64::new(0),
        }
    }
}

type Pushes = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Pushes;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Pushes>, Status> {
        // A stream's reports claim shares of the buckets they name: without the data token
        // anyone could take a tenant's whole rate. Envoy sends it as the stream's
        // `initial_metadata`, as it does for the rate limit service.
        let start = std::time::Instant::now();
        if let Err(refused) = crate::front_door::grpc::check_data_token(&self.app, &request) {
            let code = crate::front_door::grpc::grpc_code(refused.code());
            self.app
                .metrics()
                .observe("grpc", "StreamRateLimitQuotas", code, start.elapsed());
            return Err(refused);
        }
        self.app
            .metrics()
            .observe("grpc", "StreamRateLimitQuotas", "0", start.elapsed());
        let n = self.streams.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(16);
        let stream = QuotaStream {
            holder: format!("{}/rlqs/{n}", self.app.node_id()),
            app: Arc::clone(&self.app),
            table: Arc::clone(&self.table),
            buckets: HashMap::new(),
            domain: String::new(),
        };
        tokio::spawn(stream.run(request.into_inner(), tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// One bucket a stream reports.
#[derive(Debug)]
struct Tracked {
    id: BucketId,
    /// Where it is counted; `None`: not answered (no rule maps it, or its policy cannot be
    /// assigned).
    counted_in: Option<(String, String)>,
    demand: Demand,
    last_report: Instant,
    /// The shares pushed last: what Envoy runs now.
    running: u64,
    /// The strategy pushed last, and when.
    pushed: Option<(RateLimitStrategy, Instant)>,
}

/// One Envoy's stream.
struct QuotaStream {
    holder: String,
    app: Arc<App>,
    table: Arc<RlqsTable>,
    buckets: HashMap<Vec<(String, String)>, Tracked>,
    domain: String,
}

type Pusher = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

impl QuotaStream {
    async fn run(mut self, mut reports: Streaming<RateLimitQuotaUsageReports>, tx: Pusher) {
        let mut every = tokio::time::interval(ASK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            let response = tokio::select! {
                report = reports.message() => match report {
                    Ok(Some(report)) => self.reported(report).await,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(holder = %self.holder, "RLQS stream ended: {status}");
                        break;
                    }
                },
                _ = every.tick() => self.ask_all().await,
                () = tx.closed() => break,
                () = self.app.health().shutting_down() => break,
            };
            if !response.bucket_action.is_empty() && tx.send(Ok(response)).await.is_err() {
                break;
            }
        }
        tracing::debug!(holder = %self.holder, "RLQS stream closed; its shares run out at their TTL");
    }

    /// Takes a usage report: new buckets are asked for at once; idle ones are abandoned.
    async fn reported(&mut self, report: RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        self.domain = report.domain;
        let now = Instant::now();
        let mut actions = Vec::new();
        let mut fresh = Vec::new();
        for usage in report.bucket_quota_usages {
            let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
            let Some(id) = usage.bucket_id else { continue };
            let name = sorted(&id.bucket);
            let count = allowed.saturating_add(denied);
            match self.buckets.get_mut(&name) {
                Some(tracked) => {
                    tracked
                        .demand
                        .reported(count, Some(now - tracked.last_report));
                    tracked.last_report = now;
                    if tracked.demand.idle_reports >= ABANDON_AFTER {
                        let tracked = self.buckets.remove(&name).expect("present");
                        actions.push(BucketAction {
                            bucket_id: Some(tracked.id),
                            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                        });
                    }
                }
                None => {
                    let map: BTreeMap<String, String> = id.bucket.clone().into_iter().collect();
                    let counted_in = self.table.map(&self.domain, &map);
                    if counted_in.is_none()
                        && let Some(unlogged) = self.app.decider().lent().unmapped.pass()
                    {
                        tracing::warn!(
                            domain = %self.domain,
                            bucket = %shown(&map),
                            unlogged,
                            "RLQS bucket id matches no [[rlqs.bucket]] rule and names no `policy` and `key`: not answered (logged at most once a minute; see weir_rlqs_unmapped_buckets_total)"
                        );
                    }
                    let mut demand = Demand::default();
                    demand.reported(count, None);
                    self.buckets.insert(
                        name.clone(),
                        Tracked {
                            id,
                            counted_in,
                            demand,
                            last_report: now,
                            running: 0,
                            pushed: None,
                        },
                    );
                    fresh.push(name.clone());
                }
            }
            self.count_envoys_decisions(&name, allowed, denied);
        }
        for name in fresh {
            if let Some(action) = self.ask(&name).await {
                actions.push(action);
            }
        }
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// Counts what Envoy reports it decided for bucket `name` in the policy it maps to, as
    /// decisions of its own (`weir_decisions_total{decided="envoy_assigned"}`).
    fn count_envoys_decisions(&self, name: &[(String, String)], allowed: u64, denied: u64) {
        let counted_in = self.buckets.get(name).and_then(|t| t.counted_in.as_ref());
        if let Some(policy) = counted_in.and_then(|(policy, _)| self.app.policies().get(policy)) {
            let place = crate::decide::Place::EnvoyAssigned.index();
            policy.count_reported(None, allowed, denied, place);
        }
    }

    /// Asks every bucket's owner again.
    async fn ask_all(&mut self) -> RateLimitQuotaResponse {
        let names: Vec<_> = self.buckets.keys().cloned().collect();
        let mut actions = Vec::with_capacity(names.len());
        for name in names {
            if let Some(action) = self.ask(&name).await {
                actions.push(action);
            }
        }
        self.app.decider().lent().sweep();
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// Asks the owner of bucket `name` for this stream's share: the action to push, if any.
    async fn ask(&mut self, name: &[(String, String)]) -> Option<BucketAction> {
        let tracked = self.buckets.get(name)?;
        let (policy, key) = tracked.counted_in.clone()?;
        let whole_rate = self.app.decider().rate_of(&policy).unwrap_or(0);
        let report = RateReport {
            policy,
            key,
            demand: tracked.demand.to_report(whole_rate),
            running: tracked.running,
            ttl: OWNER_TTL,
            decides_all: true,
        };
        let answered = self.app.decider().assign_quota(&self.holder, report).await;
        let tracked = self.buckets.get_mut(name)?;
        let (assignment, whole) = match answered {
            Ok(answered) => answered,
            Err(NoQuota::OwnerUnreachable(why)) => {
                // Asked again at the next round; Envoy runs what it has until its TTL.
                tracing::debug!(holder = %self.holder, "RLQS bucket's owner did not answer: {why}");
                return None;
            }
            Err(why) => {
                tracing::warn!(holder = %self.holder, "RLQS bucket not answered: {why}");
                // Not asked again until Envoy reports it anew (a new stream).
                tracked.counted_in = None;
                return None;
            }
        };
        tracked.running = assignment.shares;
        let strategy = strategy_of(assignment.shares, whole);
        let now = Instant::now();
        let unchanged = tracked.pushed.as_ref().is_some_and(|(pushed, at)| {
            *pushed == strategy && now.duration_since(*at) < PUSH_EVERY
        });
        if unchanged {
            return None;
        }
        tracked.pushed = Some((strategy, now));
        Some(BucketAction {
            bucket_id: Some(tracked.id.clone()),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(prost_types::Duration {
                    seconds: ENVOY_TTL.as_secs() as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(strategy),
            })),
        })
    }
}

/// A bucket id for a log line, cut short: a client chooses its size.
fn shown(id: &BTreeMap<String, String>) -> String {
    const AT_MOST: usize = 200;
    let mut shown = format!("{id:?}");
    if shown.len() > AT_MOST {
        let cut = (0..=AT_MOST)
            .rev()
            .find(|&at| shown.is_char_boundary(at))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    shown
}

/// A bucket id's entries in one order: what identifies it in the stream.
fn sorted(id: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut entries: Vec<_> = id.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    entries.sort();
    entries
}
