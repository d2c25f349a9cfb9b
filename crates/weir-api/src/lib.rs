//! # weir-api
//!
//! Weir's wire contract, in one place for the server that answers it and the clients that call
//! it (`weir bench`, `weir top`, tests):
//!
//! - [`grpc`]: the messages and services generated from `proto/weir/v1/weir.proto`;
//! - [`envoy`]: Envoy's rate limit service v3 (`ShouldRateLimit`) and rate limit quota
//!   service v3 (`StreamRateLimitQuotas`), from trimmed copies of Envoy's own `.proto` files;
//! - [`codec`]: the codec of both, which answers a request that does not decode
//!   `INVALID_ARGUMENT`;
//! - [`http`]: the HTTP API's JSON bodies, in and out.

pub mod codec;
pub mod http;

/// The gRPC types and services generated from `proto/weir/v1/weir.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod grpc {
    tonic::include_proto!("weir.v1");
}

/// Envoy's rate limit service v3, as Envoy, Istio, Contour and Emissary call it.
/// The packages mirror Envoy's, so the gRPC path is
/// `/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod envoy {
    /// `envoy.service.ratelimit.v3` and `envoy.service.rate_limit_quota.v3`: the services and
    /// their messages.
    pub mod service {
        /// The rate limit service.
        pub mod ratelimit {
            /// Version 3.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        /// The rate limit quota service (RLQS): usage reports in, quota assignments out.
        pub mod rate_limit_quota {
            /// Version 3.
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
    /// `envoy.extensions.common.ratelimit.v3`: the descriptor.
    pub mod extensions {
        /// Common extension messages.
        pub mod common {
            /// Rate limit messages.
            pub mod ratelimit {
                /// Version 3.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.config.core.v3`: the header value.
    pub mod config {
        /// Core messages.
        pub mod core {
            /// Version 3.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.type.v3`: the override's unit, and a quota assignment's strategy.
    pub mod r#type {
        /// Version 3.
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}
