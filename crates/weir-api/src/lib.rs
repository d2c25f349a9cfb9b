//! # weir-api
//!
//! Weir's wire contract, in one place for the server that answers it and the clients that call
//! it (`weir bench`, `weir top`, tests):
//!
//! - [`grpc`]: the messages and services generated from `proto/weir/v1/weir.proto`;
//! - [`codec`]: their codec, which answers a request that does not decode `INVALID_ARGUMENT`;
//! - [`http`]: the HTTP API's JSON bodies, in and out.

pub mod codec;
pub mod http;

/// The gRPC types and services generated from `proto/weir/v1/weir.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod grpc {
    tonic::include_proto!("weir.v1");
}
