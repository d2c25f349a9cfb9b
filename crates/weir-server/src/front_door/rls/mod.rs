//! Envoy's rate limit service (RLS v3): its rules, its wire, its counters.
//!
//! Every Envoy-based proxy (Envoy's HTTP and network rate limit filters, Istio,
//! Contour, Emissary) asks one question for global rate limits: `ShouldRateLimit(domain,
//! descriptors)`. Weir answers it on its gRPC port from the reference server's YAML rules, read
//! unchanged. Each rule with a rate becomes a Weir policy named `rls:<domain>.<path>`, counting
//! per descriptor value: a fixed window as the reference server counts (the default), or the
//! Weir limiter a rule or a domain names, e.g. `weir_algorithm: token_bucket`.
//!
//! | file | job |
//! |---|---|
//! | `service.rs` | the gRPC service: requests and answers translated to and from the core's |
//! | `settings.rs` | the config file's `[rls]` table |
//! | `config.rs` | the rules as read: domains, descriptor trees, limits, mistakes named by place |
//! | `files.rs` | the rules files read and parsed whole, a directory's too, domains merged or refused |
//! | `yaml.rs` | the YAML files, checked, each mistake named by file, line and rule |
//! | `yaml_tree.rs` | YAML text to a tree of placed values, anchors, aliases and `<<` merges resolved |
//! | `rules.rs` | the compiled tree and the matching rules |
//! | `policies.rs` | the Weir policy each rule with a rate counts through |
//! | `reload.rs` | the rules watched and reloaded live |
//! | `metrics.rs` | the reference server's per-rule counters on `/metrics` |
//!
//! What a request is answered is decided in [`crate::app::rls`]. Rules are read at start and
//! again whenever they change (`reload.rs`); their policies are read-only over the API (the
//! YAML is their source).

pub mod config;
mod files;
mod metrics;
pub mod policies;
pub mod reload;
pub mod rules;
mod service;
pub mod settings;
mod yaml;
mod yaml_tree;

pub use config::{RuleError, RulesConfig, Unit};
pub use files::SameDomain;
pub(crate) use metrics::RlsCollector;
pub use policies::policies_of;
pub use service::RlsService;
pub use settings::{RlsSettings, RlsTable};
