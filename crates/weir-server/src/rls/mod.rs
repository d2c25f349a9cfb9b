//! Envoy's rate limit service (RLS v3), answered by Weir policies.
//!
//! Every Envoy-based proxy (Envoy's HTTP and network rate limit filters, Istio,
//! Contour, Emissary) asks one question for global rate limits: `ShouldRateLimit(domain,
//! descriptors)`. Weir answers it on its gRPC port from the reference server's YAML rules, read
//! unchanged. Each rule with a rate becomes a Weir policy named `rls:<domain>.<path>`, counting
//! per descriptor value: a fixed window as the reference server counts (the default), or
//! Weir's token bucket where a rule or a domain says `weir_algorithm: token_bucket`.
//!
//! | file | job |
//! |---|---|
//! | `config.rs` | the YAML files, checked, mistakes named by file, line and rule |
//! | `rules.rs` | the compiled tree and the matching rules |
//! | `decision.rs` | answering a request: plans, counting, statuses, header fields, counters |
//!
//! The gRPC shell is `front_door::rls`. Rules are read at start; their policies are read-only
//! over the API (the YAML is their source).

pub mod config;
pub mod decision;
pub mod rules;

pub use config::{Algorithm, RuleError, RulesConfig, Unit};
pub use decision::{Answer, Code, Descriptor, RequestError, Rls, RlsSettings, Status};
pub use rules::POLICY_PREFIX;
