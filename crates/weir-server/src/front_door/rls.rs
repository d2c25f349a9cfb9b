//! Envoy's rate limit service on the gRPC port: `ShouldRateLimit` translated to and from
//! [`crate::rls`], which decides.
//!
//! Answers never wait (Envoy gives the call 20 ms by default): a rule's policy decides at once,
//! whatever its `on_exhausted`. In cluster mode each rule bucket is decided by its owner on the
//! ring, so a rule counts once for the whole cluster. A malformed request is `INVALID_ARGUMENT` with what is wrong;
//! the reference server answers such requests `UNKNOWN`, which Envoy treats alike (an error,
//! then `failure_mode_deny` decides).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};
use weir_api::envoy::config::core::v3::HeaderValue;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit,
};
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use weir_api::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use weir_api::envoy::r#type::v3::RateLimitUnit;

use crate::app::App;
use crate::rls::decision::{Counted, Prepared};
use crate::rls::{Answer, Code, Descriptor, Rls, Unit};
use weir_cluster::rates::{RateDecision, RateRequest};

/// The RLS v3 service over an [`App`] that offers it.
#[derive(Debug, Clone)]
pub struct RlsService {
    app: Arc<App>,
}

impl RlsService {
    /// The service for `app` (which must have been built with RLS rules).
    pub fn new(app: Arc<App>) -> Self {
        RlsService { app }
    }
}

/// The unit of a limit sent with a request.
fn override_unit(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

fn proto_code(code: Code) -> i32 {
    match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    }
    .into()
}

fn response(answer: Answer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: proto_code(answer.overall),
        statuses: answer
            .statuses
            .into_iter()
            .map(|status| DescriptorStatus {
                code: proto_code(status.code),
                current_limit: status.current_limit.map(|limit| RateLimit {
                    name: limit.name.unwrap_or_default(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: proto_unit(limit.unit).into(),
                }),
                limit_remaining: status.limit_remaining,
                duration_until_reset: status.reset_after.map(|d| prost_types::Duration {
                    seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        request_headers_to_add: Vec::new(),
    }
}

impl RlsService {
    /// In cluster mode, the rule decisions whose buckets other nodes own, decided by those
    /// owners (a descriptor after another). One that its owner could not decide is left out:
    /// it is decided here, and counted as such in `/v1/cluster`.
    async fn decided_by_owners(&self, rls: &Rls, prepared: &Prepared) -> Vec<(usize, Counted)> {
        let Some(cluster) = self.app.cluster_mode() else {
            return Vec::new();
        };
        let mut decided = Vec::new();
        for (step, policy, key, hits) in rls.rule_decisions(prepared) {
            let Some(owner) = cluster.rate_owner(&policy, &key) else {
                continue;
            };
            let request = RateRequest {
                policy,
                key,
                kind: String::new(),
                cost: hits,
                max_wait: Duration::ZERO,
                handed: None,
            };
            let counted = match cluster.forward(&owner, request).await {
                Ok(RateDecision::Admitted {
                    would_throttle,
                    quota,
                    ..
                }) => Counted {
                    over: would_throttle,
                    quota,
                },
                Ok(RateDecision::Refused { quota, .. }) => Counted { over: true, quota },
                _ => continue,
            };
            decided.push((step, counted));
        }
        decided
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let start = Instant::now();
        // Envoy sends it as the rate limit service's `initial_metadata`.
        if let Err(refused) = super::grpc::check_data_token(&self.app, &request) {
            let code = super::grpc::grpc_code(refused.code());
            self.app
                .metrics()
                .observe("grpc", "ShouldRateLimit", code, start.elapsed());
            return Err(refused);
        }
        let request = request.into_inner();
        let span = tracing::trace_span!(
            target: "weir::admission",
            "rls_decision",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            decision = tracing::field::Empty,
        );
        let answered = match self.app.rls() {
            None => Err(Status::unimplemented(
                "this node has no RLS rules: start it with --rls-config PATH",
            )),
            Some(rls) => {
                let descriptors: Vec<Descriptor<'_>> = request
                    .descriptors
                    .iter()
                    .map(|d| Descriptor {
                        entries: d
                            .entries
                            .iter()
                            .map(|e| (e.key.as_str(), e.value.as_str()))
                            .collect(),
                        limit: d
                            .limit
                            .as_ref()
                            .map(|l| (l.requests_per_unit, override_unit(l.unit))),
                        hits: d.hits_addend,
                    })
                    .collect();
                match rls.prepare(&request.domain, &descriptors, request.hits_addend) {
                    Err(error) => Err(Status::invalid_argument(error.to_string())),
                    Ok(prepared) => {
                        let owners = self.decided_by_owners(rls, &prepared);
                        let elsewhere = if span.is_disabled() {
                            owners.await
                        } else {
                            tracing::Instrument::instrument(owners, span.clone()).await
                        };
                        Ok(response(rls.finish(prepared, elsewhere)))
                    }
                }
            }
        };
        let code = match &answered {
            Ok(_) => "0",
            Err(status) => super::grpc::grpc_code(status.code()),
        };
        if !span.is_disabled() {
            let decision = match &answered {
                Ok(answer) if answer.overall_code == ProtoCode::OverLimit as i32 => "refused",
                Ok(_) => "admitted",
                Err(_) => "error",
            };
            span.record("decision", decision);
        }
        self.app
            .metrics()
            .observe("grpc", "ShouldRateLimit", code, start.elapsed());
        answered.map(Response::new)
    }
}
