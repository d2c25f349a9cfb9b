//! The rules a node answers `ShouldRateLimit` with now: read at start, their policies applied
//! to the node as a source of their own (`rls:` names), swapped whole when they reload.
//!
//! A request's rule buckets are each decided wherever the bucket lives, as every protocol's
//! are (`crate::decide`): this node, the bucket's owner in a cluster (a rule counts once for
//! the cluster), or Redis with `[redis] every_policy`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use weir::policy::{PolicySetError, Scope};

use super::answer::{Answer, Descriptor, RequestError};
use super::config::RulesConfig;
use super::decision::{Counted, Rls};
use super::policies::policies_of;
use super::settings::RlsSettings;
use crate::app::{App, Reloaded};
use crate::decide::Ask;
use crate::reserved::is_rule_policy;

/// The rules in force, shared by the service, the reload watcher and the metrics.
#[derive(Debug)]
pub struct LiveRules {
    current: ArcSwap<Rls>,
    /// Reloads by outcome (`weir_rls_reloads_total`).
    reloads: Family<ReloadLabel, Counter>,
}

/// `{outcome}` of a reload of the rules.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabel {
    /// `applied`, `unchanged` or `failed`.
    outcome: &'static str,
}

/// How a rule counts on `app`: once for the cluster in a cluster, else on this node.
fn scope_on(app: &App) -> Scope {
    match app.cluster_mode() {
        Some(_) => Scope::Cluster,
        None => Scope::Node,
    }
}

impl LiveRules {
    /// Applies `rules`' policies to `app` beside the config file's (checked together, as at
    /// a reload) and answers with them.
    pub async fn start(
        app: &App,
        rules: &RulesConfig,
        settings: RlsSettings,
    ) -> Result<Arc<LiveRules>, PolicySetError> {
        let wanted = policies_of(rules, &settings, scope_on(app));
        app.policy_admin()
            .converge_source(wanted, is_rule_policy, || {})
            .await?;
        let rls = Rls::new(rules, settings, app.policies(), weir::SystemClock::new());
        let reloads = Family::<ReloadLabel, Counter>::default();
        // Each outcome exported from the start, at zero: an alert on a rate needs the series
        // before the first event.
        for outcome in ["applied", "unchanged", "failed"] {
            let _ = reloads.get_or_create(&ReloadLabel { outcome });
        }
        app.metrics().register(
            "weir_rls_reloads",
            "RLS rule reloads, by outcome: applied, unchanged (forced by SIGHUP, the rules as running), failed (the running rules kept)",
            reloads.clone(),
        );
        Ok(Arc::new(LiveRules {
            current: ArcSwap::from_pointee(rls),
            reloads,
        }))
    }

    /// Counts a reload of the rules: `applied`, `unchanged` or `failed`.
    pub fn count_reload(&self, outcome: &'static str) {
        self.reloads.get_or_create(&ReloadLabel { outcome }).inc();
    }

    /// The rules now.
    pub fn load(&self) -> Arc<Rls> {
        self.current.load_full()
    }

    /// Answers `ShouldRateLimit`: `descriptors` in `domain`, each for its own hits or else
    /// `hits_addend` (0 = 1), every rule's bucket decided wherever it lives.
    pub async fn should_rate_limit(
        &self,
        app: &App,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Result<Answer, RequestError> {
        let rls = self.current.load();
        let prepared = rls.prepare(domain, descriptors, hits_addend)?;
        let mut decided = Vec::new();
        for (step, policy, key, hits) in rls.rule_decisions(&prepared) {
            let counted = match app
                .decider()
                .decide(policy, Ask::now(None, key, hits))
                .await
            {
                Ok(decision) => Counted {
                    over: decision.is_over(),
                    quota: decision.quota(),
                },
                // Not decided (a Redis policy on a node without one): over, nothing counted.
                Err(_) => Counted {
                    over: true,
                    quota: None,
                },
            };
            decided.push((step, counted));
        }
        Ok(rls.finish(prepared, decided))
    }

    /// Re-applies the rules, `rules` as just read: their policies converge as a config
    /// reload's do, and the rules answering `ShouldRateLimit` are swapped for the new ones —
    /// each rule that stays keeps its counters — before the policies of rules gone are
    /// removed.
    pub async fn reload(&self, app: &App, rules: &RulesConfig) -> Result<Reloaded, PolicySetError> {
        let running = self.current.load_full();
        let wanted = policies_of(rules, running.settings(), scope_on(app));
        app.policy_admin()
            .converge_source(wanted, is_rule_policy, || {
                self.current
                    .store(Arc::new(running.reloaded(rules, app.policies())));
            })
            .await
    }
}
