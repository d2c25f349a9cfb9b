//! The reference rate limit server's counters of each rule on `/metrics`
//! (`weir_rls_hits`, `_over_limit`, `_near_limit`, `_within_limit`, `_shadow_mode`), labelled
//! `{domain, rule}`.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use super::live::LiveRules;
use crate::metrics::family;

/// Envoy rate limit rules' counters, read at scrape time from the rules then in force.
#[derive(Debug)]
pub(crate) struct RlsCollector {
    rls: Arc<LiveRules>,
}

impl RlsCollector {
    /// The collector of `rls`'s counters, whatever rules it reloads.
    pub(crate) fn new(rls: Arc<LiveRules>) -> Self {
        RlsCollector { rls }
    }
}

/// `{domain, rule}`: the rule's path, or the name its metrics ask for (`detailed_metric`,
/// `value_to_metric`). Limits sent with requests count under `rule="override"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

impl Collector for RlsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut rows: Vec<(RuleLabels, [u64; 5])> = Vec::new();
        let rls = self.rls.load();
        for (domain, path, counts) in rls.counts() {
            rows.push((
                RuleLabels {
                    domain: domain.to_owned(),
                    rule: path.to_owned(),
                },
                counts.rule.read(),
            ));
            let named = counts.named.lock().unwrap_or_else(|p| p.into_inner());
            for (name, counts) in named.iter() {
                rows.push((
                    RuleLabels {
                        domain: domain.to_owned(),
                        rule: name.clone(),
                    },
                    counts.read(),
                ));
            }
        }
        for (domain, counts) in rls.override_counts() {
            let read = counts.read();
            if read[0] > 0 {
                rows.push((
                    RuleLabels {
                        domain: domain.to_owned(),
                        rule: "override".to_owned(),
                    },
                    read,
                ));
            }
        }
        let families = [
            (
                "weir_rls_hits",
                "Hits asked of an RLS rule (hits_addend summed)",
            ),
            ("weir_rls_over_limit", "Hits past an RLS rule's limit"),
            (
                "weir_rls_near_limit",
                "Hits between an RLS rule's near-limit mark (`[rls] near_limit_ratio`) and its limit",
            ),
            ("weir_rls_within_limit", "Hits within an RLS rule's limit"),
            (
                "weir_rls_shadow_mode",
                "Hits past the limit of an RLS rule in shadow mode, answered OK",
            ),
        ];
        for (i, (name, help)) in families.into_iter().enumerate() {
            family(
                &mut encoder,
                name,
                help,
                MetricType::Counter,
                rows.iter()
                    .map(|(labels, read)| (labels.clone(), ConstCounter::new(read[i]))),
            )?;
        }
        Ok(())
    }
}
