//! Envoy's rate limit service on the gRPC port: `ShouldRateLimit` translated to and from
//! [`LiveRules::should_rate_limit`], which decides.
//!
//! Answers never wait (Envoy gives the call 20 ms by default): a rule's policy decides at once,
//! whatever its `on_exhausted`. In cluster mode each rule bucket is decided by its owner on the
//! ring, so a rule counts once for the whole cluster. A malformed request is `INVALID_ARGUMENT` with what is wrong;
//! the reference server answers such requests `UNKNOWN`, which Envoy treats alike (an error,
//! then `failure_mode_deny` decides).

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};
use weir_api::envoy::config::core::v3::HeaderValue;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit,
};
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use weir_api::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use weir_api::envoy::r#type::v3::RateLimitUnit;

use super::answer::{Answer, Code, Descriptor};
use super::config::Unit;
use super::live::LiveRules;
use crate::app::App;

/// The RLS v3 service over an [`App`], answering with the rules in force.
#[derive(Debug, Clone)]
pub struct RlsService {
    app: Arc<App>,
    rules: Arc<LiveRules>,
}

impl RlsService {
    /// The service for `app`, answering with `rules`.
    pub fn new(app: Arc<App>, rules: Arc<LiveRules>) -> Self {
        RlsService { app, rules }
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

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let start = Instant::now();
        // Envoy sends it as the rate limit service's `initial_metadata`.
        if let Err(refused) = crate::front_door::grpc::check_data_token(&self.app, &request) {
            let code = crate::front_door::grpc::grpc_code(refused.code());
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
        let decided = self.rules.should_rate_limit(
            &self.app,
            &request.domain,
            &descriptors,
            request.hits_addend,
        );
        let decided = if span.is_disabled() {
            decided.await
        } else {
            tracing::Instrument::instrument(decided, span.clone()).await
        };
        let answered = match decided {
            Err(error) => Err(Status::invalid_argument(error.to_string())),
            Ok(answer) => Ok(response(answer)),
        };
        let code = match &answered {
            Ok(_) => "0",
            Err(status) => crate::front_door::grpc::grpc_code(status.code()),
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
