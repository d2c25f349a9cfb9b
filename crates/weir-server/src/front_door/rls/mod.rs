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
//! | `live.rs` | the rules in force: their policies applied as a source of the node's, swapped whole at a reload, each request's rule buckets decided wherever they live |
//! | `decision.rs` | `Rls`: a request checked whole, matched, counted, answered |
//! | `answer.rs` | a request's descriptors and its answer: statuses, header fields; why a request is refused whole |
//! | `counts.rs` | the reference server's own counters of each rule |
//! | `sent.rs` | limits sent with requests: where their hits count, and their answer |
//! | `metrics.rs` | the reference server's per-rule counters on `/metrics` |
//!
//! Rules are read at start and again whenever they change (`reload.rs`); their policies are
//! read-only over the API (the YAML is their source).

mod answer;
pub mod config;
mod counts;
mod decision;
mod files;
mod live;
mod metrics;
pub mod policies;
pub mod reload;
pub mod rules;
mod sent;
mod service;
pub mod settings;
mod yaml;
mod yaml_tree;

pub use answer::{Code, CurrentLimit, Descriptor, RequestError};
pub use config::{RulesConfig, Unit};
pub use decision::Rls;
pub use files::SameDomain;
pub use live::LiveRules;
pub use policies::policies_of;
pub use service::RlsService;
pub use settings::{RlsSettings, RlsTable};

/// Starts Envoy's rate limit service on `app` when `config` names rules: their policies
/// applied beside the config file's, their counters on `/metrics`, the rules watched for
/// changes (`hangups`: SIGHUP). `None` without rules.
pub async fn start(
    app: &std::sync::Arc<crate::app::App>,
    config: &crate::config::ConfigFile,
    hangups: Option<tokio::signal::unix::Signal>,
) -> anyhow::Result<Option<std::sync::Arc<LiveRules>>> {
    let Some(rules) = reload::read_at_start(config)? else {
        return Ok(None);
    };
    let live = LiveRules::start(app, &rules, config.rls.settings())
        .await
        .map_err(|error| anyhow::anyhow!("the RLS rules' policies are not valid: {error}"))?;
    app.metrics()
        .register_collector(Box::new(metrics::RlsCollector::new(std::sync::Arc::clone(
            &live,
        ))));
    if let (Some(path), Some(hangups)) = (&config.rls.config, hangups) {
        reload::watch(
            std::sync::Arc::clone(app),
            std::sync::Arc::clone(&live),
            path.clone(),
            config.rls.same_domain(),
            rules,
            hangups,
        );
    }
    Ok(Some(live))
}
