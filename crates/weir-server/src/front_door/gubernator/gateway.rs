//! Gubernator's HTTP gateway on Weir's HTTP port: `POST /v1/GetRateLimits`,
//! `GET /v1/HealthCheck`, `GET /v1/LiveCheck`, in the JSON its gateway writes.
//!
//! That JSON is protobuf's JSON mapping as Gubernator configures it: field names as in the
//! `.proto` file (`unique_key`, `reset_time`), every field written even when zero, 64-bit
//! integers as strings, enums by name. Requests are read the way that mapping reads them:
//! either field spelling (`unique_key` or `uniqueKey`), integers as numbers or strings, enums
//! by name or number; an unknown field is an error, as it is there; the body is JSON whatever
//! its content type says, as there. Errors are the gateway's
//! `{"code", "message", "details"}` with the HTTP status it maps each gRPC code to.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use tonic::Code;

use super::Gubernator;
use super::wire::{self, GetRateLimitsReq, RateLimitReq, RateLimitResp};
use crate::front_door::http::OtherRoutes;

/// The gateway's paths.
const PATHS: &[&str] = &["/v1/GetRateLimits", "/v1/HealthCheck", "/v1/LiveCheck"];

/// The gateway's routes over `door`, for Weir's HTTP port.
pub fn routes(door: Arc<Gubernator>) -> OtherRoutes {
    OtherRoutes {
        router: Router::new()
            .route(PATHS[0], post(get_rate_limits))
            .route(PATHS[1], get(health_check))
            .route(PATHS[2], get(live_check))
            .with_state(door),
        paths: PATHS.to_vec(),
    }
}

/// The largest body the gateway reads: gRPC's default message size, which a batch of 1 000
/// requests stays well within.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

async fn get_rate_limits(
    State(door): State<Arc<Gubernator>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let text = |name| headers.get(name).and_then(|value| value.to_str().ok());
    if let Err(refused) = door
        .app
        .access()
        .check_data(text(header::AUTHORIZATION), text(header::HOST))
    {
        let status = tonic::Status::from(refused);
        return error(status.code(), status.message());
    }
    // Read as JSON whatever the content type says, as Gubernator's gateway reads it (`curl -d`
    // sends a form's type); within the server's body timeout, as Weir's own API is.
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    let bytes = match tokio::time::timeout(door.app.body_timeout(), read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return error(
                Code::InvalidArgument,
                "the request body could not be read in full, or is over 4 MiB",
            );
        }
        Err(_) => {
            return error(
                Code::DeadlineExceeded,
                "the request body did not arrive in full within `server.body_timeout`",
            );
        }
    };
    let requests: JsonRequests = match serde_json::from_slice(&bytes) {
        Ok(requests) => requests,
        Err(why) => return error(Code::InvalidArgument, &why.to_string()),
    };
    let requests = GetRateLimitsReq {
        requests: requests
            .requests
            .into_iter()
            .map(RateLimitReq::from)
            .collect(),
    };
    match door.get_rate_limits(&requests) {
        Ok(answered) => Json(JsonResponses {
            responses: answered.responses.iter().map(JsonResponse::from).collect(),
        })
        .into_response(),
        Err(status) => error(status.code(), status.message()),
    }
}

async fn health_check(State(door): State<Arc<Gubernator>>) -> Response {
    let health = door.health_check();
    if health.status != super::HEALTHY {
        return error(Code::Unavailable, &health.message);
    }
    let peers = |peers: &[wire::PeerHealthResp]| {
        peers
            .iter()
            .map(|peer| JsonPeer {
                grpc_address: peer.grpc_address.clone(),
                data_center: peer.data_center.clone(),
            })
            .collect()
    };
    Json(JsonHealth {
        status: health.status.clone(),
        message: health.message.clone(),
        peer_count: health.peer_count,
        advertise_address: health.advertise_address.clone(),
        local_peers: peers(&health.local_peers),
        region_peers: peers(&health.region_peers),
    })
    .into_response()
}

async fn live_check() -> Response {
    Json(serde_json::json!({})).into_response()
}

/// The gateway's error: `{"code", "message", "details"}`, under the HTTP status grpc-gateway
/// gives `code`.
fn error(code: Code, message: &str) -> Response {
    let status = match code {
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = serde_json::json!({ "code": code as i32, "message": message, "details": [] });
    (status, Json(body)).into_response()
}

/// `GetRateLimitsReq` as JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequests {
    #[serde(default)]
    requests: Vec<JsonRequest>,
}

/// `RateLimitReq` as JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct JsonRequest {
    name: String,
    #[serde(alias = "uniqueKey")]
    unique_key: String,
    #[serde(deserialize_with = "int64")]
    hits: i64,
    #[serde(deserialize_with = "int64")]
    limit: i64,
    #[serde(deserialize_with = "int64")]
    duration: i64,
    #[serde(deserialize_with = "algorithm")]
    algorithm: i32,
    #[serde(deserialize_with = "behavior")]
    behavior: i32,
    #[serde(deserialize_with = "int64")]
    burst: i64,
    metadata: HashMap<String, String>,
    #[serde(alias = "createdAt", deserialize_with = "optional_int64")]
    created_at: Option<i64>,
}

impl From<JsonRequest> for RateLimitReq {
    fn from(json: JsonRequest) -> Self {
        RateLimitReq {
            name: json.name,
            unique_key: json.unique_key,
            hits: json.hits,
            limit: json.limit,
            duration: json.duration,
            algorithm: json.algorithm,
            behavior: json.behavior,
            burst: json.burst,
            metadata: json.metadata,
            created_at: json.created_at,
        }
    }
}

/// A 64-bit integer as protobuf's JSON writes it (a string) or as people do (a number).
#[derive(Deserialize)]
#[serde(untagged)]
enum Int64 {
    Number(i64),
    Text(String),
}

fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    match Int64::deserialize(deserializer)? {
        Int64::Number(number) => Ok(number),
        Int64::Text(text) => text
            .parse()
            .map_err(|_| de::Error::custom(format!("`{text}` is not a 64-bit integer"))),
    }
}

fn optional_int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    int64(deserializer).map(Some)
}

/// An enum by name or by number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Named {
    Number(i32),
    Name(String),
}

fn algorithm<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    match Named::deserialize(deserializer)? {
        Named::Number(number) => Ok(number),
        Named::Name(name) => match name.as_str() {
            "TOKEN_BUCKET" => Ok(wire::Algorithm::TokenBucket as i32),
            "LEAKY_BUCKET" => Ok(wire::Algorithm::LeakyBucket as i32),
            _ => Err(de::Error::custom(format!("no algorithm `{name}`"))),
        },
    }
}

fn behavior<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    use super::hit::Behaviors;
    match Named::deserialize(deserializer)? {
        Named::Number(number) => Ok(number),
        Named::Name(name) => match name.as_str() {
            "BATCHING" => Ok(0),
            "NO_BATCHING" => Ok(Behaviors::NO_BATCHING),
            "GLOBAL" => Ok(Behaviors::GLOBAL),
            "DURATION_IS_GREGORIAN" => Ok(Behaviors::DURATION_IS_GREGORIAN),
            "RESET_REMAINING" => Ok(Behaviors::RESET_REMAINING),
            "MULTI_REGION" => Ok(Behaviors::MULTI_REGION),
            "DRAIN_OVER_LIMIT" => Ok(Behaviors::DRAIN_OVER_LIMIT),
            _ => Err(de::Error::custom(format!("no behavior `{name}`"))),
        },
    }
}

/// `GetRateLimitsResp` as JSON.
#[derive(Debug, Serialize)]
struct JsonResponses {
    responses: Vec<JsonResponse>,
}

/// `RateLimitResp` as JSON: every field, 64-bit integers as strings, the status by name.
#[derive(Debug, Serialize)]
struct JsonResponse {
    status: &'static str,
    limit: String,
    remaining: String,
    reset_time: String,
    error: String,
    metadata: HashMap<String, String>,
}

impl From<&RateLimitResp> for JsonResponse {
    fn from(answer: &RateLimitResp) -> Self {
        JsonResponse {
            status: match wire::Status::try_from(answer.status) {
                Ok(wire::Status::OverLimit) => "OVER_LIMIT",
                _ => "UNDER_LIMIT",
            },
            limit: answer.limit.to_string(),
            remaining: answer.remaining.to_string(),
            reset_time: answer.reset_time.to_string(),
            error: answer.error.clone(),
            metadata: answer.metadata.clone(),
        }
    }
}

/// `HealthCheckResp` as JSON.
#[derive(Debug, Serialize)]
struct JsonHealth {
    status: String,
    message: String,
    peer_count: i32,
    advertise_address: String,
    local_peers: Vec<JsonPeer>,
    region_peers: Vec<JsonPeer>,
}

/// `PeerHealthResp` as JSON.
#[derive(Debug, Serialize)]
struct JsonPeer {
    grpc_address: String,
    data_center: String,
}
