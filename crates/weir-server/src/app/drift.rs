//! What differs between this node's policies and another member's, named policy by policy.
//!
//! Members compare one version of all their policies in gossip (`config_differs` in
//! `/v1/cluster`, `weir_cluster_config_drift`): cheap, but it says only *that* two members
//! differ. When they do, each differing member is asked for its policies (the `Stats` call,
//! which carries each policy's entity tag and config; a second to answer) and the two sets are
//! compared: a policy missing on one side, or the settings that differ with both values. For
//! `/v1/cluster`'s `config_drift`, the page, and a log line when drift starts and ends.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_api::http::PolicyDrift;

use super::App;
use crate::proto::PolicyVersion;

/// How long a member has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

impl App {
    /// Each policy that differs between this node and a member whose config version is not
    /// this node's (none outside a cluster, or when every version agrees). A member that does
    /// not answer within a second is left out.
    pub async fn config_drift(&self) -> Vec<PolicyDrift> {
        let Some(cluster) = &self.cluster else {
            return Vec::new();
        };
        let differing = cluster.config_versions().differing();
        if differing.is_empty() {
            return Vec::new();
        }
        let mine = self.admin.policy_versions();
        let mut asking = tokio::task::JoinSet::new();
        for (peer, channel) in cluster.peers() {
            if !differing.contains(&peer) {
                continue;
            }
            asking.spawn(async move {
                let mut client = crate::proto::weir_client::WeirClient::new(channel);
                let asked = client.stats(crate::proto::StatsRequest {
                    with_versions: true,
                });
                (peer, tokio::time::timeout(ANSWER_WITHIN, asked).await)
            });
        }
        let mut drift = Vec::new();
        while let Some(answered) = asking.join_next().await {
            if let Ok((peer, Ok(Ok(answer)))) = answered {
                drift.extend(drift_between(&peer, &mine, &answer.into_inner().versions));
            }
        }
        drift.sort_by(|a, b| (&a.member, &a.policy).cmp(&(&b.member, &b.policy)));
        drift
    }
}

/// How long members must differ before the drift is logged: a change made over the API reaches
/// every member in well under a second, and is no drift.
const LOGGED_AFTER: Duration = Duration::from_secs(5);

/// How often a drift already logged is asked again, to log what changed in it.
const ASKED_EVERY: Duration = Duration::from_secs(10);

/// The drift last logged, for a line when it starts, changes and ends (see the module docs).
#[derive(Debug, Default)]
pub(super) struct DriftLog {
    /// Since when members have differed, if they do.
    since: Option<Instant>,
    /// When they were last asked.
    asked: Option<Instant>,
    /// What was last logged, while drift lasts.
    logged: Option<Vec<PolicyDrift>>,
}

impl DriftLog {
    /// Logs drift that has lasted `LOGGED_AFTER` (naming each policy), again when what differs
    /// changes, and once when it ends.
    pub(super) async fn observe(&mut self, app: &App, now: Instant) {
        let differing = app
            .cluster
            .as_ref()
            .map(|cluster| cluster.config_versions().differing())
            .unwrap_or_default();
        if differing.is_empty() {
            self.since = None;
            if self.logged.take().is_some() {
                // At the start's level: a log kept to warnings shows both.
                tracing::warn!(
                    "config drift ended: every live member runs this node's policies again"
                );
            }
            return;
        }
        let since = *self.since.get_or_insert(now);
        let due = self
            .asked
            .is_none_or(|asked| now.duration_since(asked) >= ASKED_EVERY);
        if now.duration_since(since) < LOGGED_AFTER || !due {
            return;
        }
        self.asked = Some(now);
        let drift = app.config_drift().await;
        if drift.is_empty() || self.logged.as_ref() == Some(&drift) {
            return;
        }
        let named: Vec<String> = drift
            .iter()
            .map(|d| format!("{} on {}: {}", d.policy, d.member, d.how))
            .collect();
        tracing::warn!(
            members = ?differing,
            differs = %named.join(" | "),
            "config drift: members run other policies than this node (a config file or RLS rules that differ, or a change not yet applied)"
        );
        self.logged = Some(drift);
    }
}

/// What differs between this node's policies (`mine`) and member `member`'s (`theirs`).
pub(super) fn drift_between(
    member: &str,
    mine: &[PolicyVersion],
    theirs: &[PolicyVersion],
) -> Vec<PolicyDrift> {
    let by_name = |versions: &[PolicyVersion]| -> BTreeMap<String, PolicyVersion> {
        versions
            .iter()
            .map(|v| (v.name.clone(), v.clone()))
            .collect()
    };
    let (mine, theirs) = (by_name(mine), by_name(theirs));
    let mut names: Vec<&String> = mine.keys().chain(theirs.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let how = match (mine.get(name), theirs.get(name)) {
                (Some(_), None) => "missing there".to_owned(),
                (None, Some(_)) => "missing here".to_owned(),
                (Some(here), Some(there)) if here.etag != there.etag => {
                    settings_that_differ(&here.config_json, &there.config_json)
                }
                _ => return None,
            };
            Some(PolicyDrift {
                member: member.to_owned(),
                policy: name.clone(),
                how,
            })
        })
        .collect()
}

/// The top-level settings of two policy configs (JSON) that differ, each with both values.
fn settings_that_differ(here: &str, there: &str) -> String {
    let parse = |text: &str| match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    let (here, there) = (parse(here), parse(there));
    let mut keys: Vec<&String> = here.keys().chain(there.keys()).collect();
    keys.sort();
    keys.dedup();
    let shown = |value: Option<&Value>| value.map_or_else(|| "unset".to_owned(), Value::to_string);
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|key| here.get(*key) != there.get(*key))
        .map(|key| {
            format!(
                "{key}: {} here, {} there",
                shown(here.get(key)),
                shown(there.get(key))
            )
        })
        .collect();
    if differ.is_empty() {
        // Tags differ over the same settings: written by two versions of Weir.
        "the same settings, written differently".to_owned()
    } else {
        differ.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, config: &str) -> PolicyVersion {
        PolicyVersion {
            name: name.to_owned(),
            etag: format!(
                "{:x}",
                config.len() * 31 + config.bytes().map(usize::from).sum::<usize>()
            ),
            config_json: config.to_owned(),
        }
    }

    #[test]
    fn each_policy_that_differs_is_named_with_how() {
        let mine = [
            version(
                "a",
                r#"{"mode":"enforce","token_bucket":{"rate":10,"burst":5}}"#,
            ),
            version("b", r#"{"mode":"enforce"}"#),
            version("same", r#"{"mode":"monitor"}"#),
        ];
        let theirs = [
            version(
                "a",
                r#"{"mode":"enforce","token_bucket":{"rate":20,"burst":5}}"#,
            ),
            version("c", r#"{"mode":"enforce"}"#),
            version("same", r#"{"mode":"monitor"}"#),
        ];
        let drift = drift_between("n2", &mine, &theirs);
        let found: Vec<(&str, &str, &str)> = drift
            .iter()
            .map(|d| (d.member.as_str(), d.policy.as_str(), d.how.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "n2",
                    "a",
                    r#"token_bucket: {"burst":5,"rate":10} here, {"burst":5,"rate":20} there"#
                ),
                ("n2", "b", "missing there"),
                ("n2", "c", "missing here"),
            ]
        );
    }
}
