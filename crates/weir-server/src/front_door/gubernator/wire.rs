//! Gubernator's v1 messages (`gubernator.proto`, package `pb.gubernator`), field for field:
//! same numbers and types, so its clients and generated stubs talk to Weir unchanged.
//!
//! Written with prost's derives rather than generated from the file: the service is three
//! unary calls, and the folder stays the protocol's only place.

#![allow(missing_docs)]

use std::collections::HashMap;

/// `pb.gubernator.Algorithm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Algorithm {
    TokenBucket = 0,
    LeakyBucket = 1,
}

/// `pb.gubernator.Status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Status {
    UnderLimit = 0,
    OverLimit = 1,
}

/// `GetRateLimitsReq`: at most 1 000 requests.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRateLimitsReq {
    #[prost(message, repeated, tag = "1")]
    pub requests: Vec<RateLimitReq>,
}

/// `GetRateLimitsResp`: one response per request, in order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRateLimitsResp {
    #[prost(message, repeated, tag = "1")]
    pub responses: Vec<RateLimitResp>,
}

/// `RateLimitReq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReq {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub unique_key: String,
    #[prost(int64, tag = "3")]
    pub hits: i64,
    #[prost(int64, tag = "4")]
    pub limit: i64,
    #[prost(int64, tag = "5")]
    pub duration: i64,
    #[prost(enumeration = "Algorithm", tag = "6")]
    pub algorithm: i32,
    /// `Behavior` flags, or-ed.
    #[prost(int32, tag = "7")]
    pub behavior: i32,
    #[prost(int64, tag = "8")]
    pub burst: i64,
    #[prost(map = "string, string", tag = "9")]
    pub metadata: HashMap<String, String>,
    #[prost(int64, optional, tag = "10")]
    pub created_at: Option<i64>,
}

/// `RateLimitResp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResp {
    #[prost(enumeration = "Status", tag = "1")]
    pub status: i32,
    #[prost(int64, tag = "2")]
    pub limit: i64,
    #[prost(int64, tag = "3")]
    pub remaining: i64,
    #[prost(int64, tag = "4")]
    pub reset_time: i64,
    #[prost(string, tag = "5")]
    pub error: String,
    #[prost(map = "string, string", tag = "6")]
    pub metadata: HashMap<String, String>,
}

/// `HealthCheckReq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckReq {}

/// `PeerHealthResp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerHealthResp {
    #[prost(string, tag = "1")]
    pub grpc_address: String,
    #[prost(string, tag = "2")]
    pub data_center: String,
}

/// `HealthCheckResp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResp {
    #[prost(string, tag = "1")]
    pub status: String,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub peer_count: i32,
    #[prost(string, tag = "4")]
    pub advertise_address: String,
    #[prost(message, repeated, tag = "5")]
    pub local_peers: Vec<PeerHealthResp>,
    #[prost(message, repeated, tag = "6")]
    pub region_peers: Vec<PeerHealthResp>,
}

/// `LiveCheckReq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LiveCheckReq {}

/// `LiveCheckResp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LiveCheckResp {}
