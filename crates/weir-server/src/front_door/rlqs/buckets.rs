//! The `[rlqs]` table: which Weir policy and key an RLQS bucket id is counted in.
//!
//! Envoy's `rate_limit_quota` filter names a bucket by a map of strings (its
//! `bucket_id_builder`), e.g. `{name: "per-tenant", tenant: "acme"}`. A `[[rlqs.bucket]]` rule
//! maps such ids to a policy and a key: the first rule, in file order, whose `domain` (if set)
//! is the stream's and whose `match` entries are all in the id with those values, and every
//! `{entry}` its `key` names is in the id. With no rule matching, an id that has a `policy`
//! and a `key` entry is taken as naming them directly; any other is not answered (Envoy keeps
//! its `no_assignment_behavior`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The `[rlqs]` table: Envoy's rate limit quota service on the gRPC port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlqsTable {
    /// `[[rlqs.bucket]]`: the rules, tried in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bucket: Vec<BucketRule>,
}

/// One `[[rlqs.bucket]]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketRule {
    /// Only for streams whose reports name this domain (the filter's `domain`); any if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Entries the bucket id must have, with these values.
    #[serde(default, rename = "match", skip_serializing_if = "BTreeMap::is_empty")]
    pub matches: BTreeMap<String, String>,
    /// The Weir policy its requests are counted in.
    pub policy: String,
    /// The key within the policy: text, with `{entry}` standing for the id's value of `entry`.
    pub key: String,
}

/// A piece of a key template.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Entry(&'a str),
}

/// `template` cut into text and `{entry}` pieces, or what is wrong with it.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(format!("has a `}}` with no `{{` before it: `{template}`"));
        }
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("has a `{{` that is not closed: `{template}`"));
        };
        let name = &rest[open + 1..open + close];
        if name.is_empty() || name.contains('{') {
            return Err(format!(
                "names an empty or nested entry (`{{}}` or `{{{{`): `{template}`"
            ));
        }
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        pieces.push(Piece::Entry(name));
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

impl BucketRule {
    /// The key for bucket id `id`, if this rule takes it (`domain` checked by the caller).
    fn key_of(&self, id: &BTreeMap<String, String>) -> Option<String> {
        if !self.matches.iter().all(|(k, v)| id.get(k) == Some(v)) {
            return None;
        }
        let mut key = String::new();
        for piece in pieces(&self.key).ok()? {
            match piece {
                Piece::Text(text) => key.push_str(text),
                Piece::Entry(name) => key.push_str(id.get(name)?),
            }
        }
        Some(key)
    }
}

impl RlqsTable {
    pub(crate) fn is_default(&self) -> bool {
        self.bucket.is_empty()
    }

    /// What is wrong with the rules, as (`bucket[i].field`, problem); `policies` are the
    /// names a rule may count in.
    pub fn problems(&self, policies: &[&str]) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (i, rule) in self.bucket.iter().enumerate() {
            if let Err(problem) = pieces(&rule.key) {
                problems.push((format!("bucket[{i}].key"), problem));
            }
            if !policies.contains(&rule.policy.as_str()) {
                problems.push((
                    format!("bucket[{i}].policy"),
                    format!(
                        "names `{}`, which is not a `[[policy]]` of this file",
                        rule.policy
                    ),
                ));
            }
        }
        problems
    }

    /// The policy and key bucket id `id` of a stream in `domain` is counted in, if any.
    pub fn map(&self, domain: &str, id: &BTreeMap<String, String>) -> Option<(String, String)> {
        for rule in &self.bucket {
            if rule.domain.as_deref().is_some_and(|d| d != domain) {
                continue;
            }
            if let Some(key) = rule.key_of(id) {
                return Some((rule.policy.clone(), key));
            }
        }
        match (id.get("policy"), id.get("key")) {
            (Some(policy), Some(key)) => Some((policy.clone(), key.clone())),
            _ => None,
        }
    }
}
