//! The rules tree, compiled for lookup, and the reference server's matching rules over it.
//!
//! A descriptor is an ordered list of entries (`key`, `value`). Walking it from the domain's top
//! level, each entry picks one node of the current level: the node for exactly its `key` and
//! `value` first, then the first node of its `key` whose pattern matches the value (`*` matches
//! any run of characters), then the node of its bare `key` (any value). No node: no rule. A
//! limit applies only where the descriptor *ends*: a node with a limit half-way down is passed
//! through, and a descriptor longer than the tree matches nothing. There is no backtracking: a
//! value that matched exactly never falls back to its key's any-value node deeper down.
//!
//! Lookup builds the counter's key and the names a rule's metrics may ask for as it walks; it
//! reads the tree without locks.

use crate::reserved::RLS_PREFIX;
use std::collections::HashMap;

use super::config::{DomainRules, Limit, Node, RulesConfig};

/// One rule: a node with a `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its domain.
    pub domain: String,
    /// Its path (`domain.key_value.key`): its name in metrics and, prefixed with `rls:`, its
    /// policy's name.
    pub path: String,
    /// Its limit.
    pub limit: Limit,
    /// Count, but always answer OK.
    pub shadow_mode: bool,
    /// Over alone, it does not make the request over (see [`super::config::Node::quota_mode`]).
    pub quota_mode: bool,
    /// Metrics name the descriptor's values.
    pub detailed_metric: bool,
}

impl Rule {
    /// The name of the policy that counts for this rule.
    pub fn policy_name(&self) -> String {
        format!("{RLS_PREFIX}{}", self.path)
    }
}

/// A level of a domain's tree: for each key, its nodes.
#[derive(Debug, Default)]
struct Level {
    keys: HashMap<String, KeyNodes>,
}

/// The nodes of one key at one level.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<String, Branch>,
    /// In the order they were written: the first match wins.
    patterns: Vec<(String, Branch)>,
    any: Option<Branch>,
}

#[derive(Debug, Default)]
struct Branch {
    /// Index into [`Tree::rules`].
    rule: Option<usize>,
    children: Level,
    share_threshold: bool,
    value_to_metric: bool,
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub struct Tree {
    domains: HashMap<String, Level>,
    rules: Vec<Rule>,
}

/// What a descriptor matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The domain has no rules.
    UnknownDomain,
    /// The domain has rules, none of them for this descriptor.
    NoRule,
    /// A rule.
    Rule(Matched),
}

/// A rule a descriptor matched, with the names it is counted and reported under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    /// Index of the rule in [`Tree::rules`].
    pub rule: usize,
    /// The counter's key within the rule: `key=value` per entry, `, `-separated (with `\`, `,`
    /// and `=` escaped), the pattern in place of the value where the node shares its threshold.
    pub key: String,
    /// The metric name where the rule asks for the request's values in it (`detailed_metric`,
    /// `value_to_metric`); `None`: the rule's path.
    pub metric: Option<String>,
}

impl Tree {
    /// Compiles `config`.
    pub fn new(config: &RulesConfig) -> Tree {
        let mut tree = Tree::default();
        for DomainRules {
            domain,
            descriptors,
            ..
        } in &config.domains
        {
            let level = tree.level(domain, descriptors);
            tree.domains.insert(domain.clone(), level);
        }
        tree
    }

    fn level(&mut self, domain: &str, nodes: &[Node]) -> Level {
        let mut level = Level::default();
        for node in nodes {
            let rule = node.limit.as_ref().map(|limit| {
                self.rules.push(Rule {
                    domain: domain.to_owned(),
                    path: node.path.clone(),
                    limit: limit.clone(),
                    shadow_mode: node.shadow_mode,
                    quota_mode: node.quota_mode,
                    detailed_metric: node.detailed_metric,
                });
                self.rules.len() - 1
            });
            let branch = Branch {
                rule,
                children: self.level(domain, &node.children),
                share_threshold: node.share_threshold,
                value_to_metric: node.value_to_metric,
            };
            let nodes = level.keys.entry(node.key.clone()).or_default();
            match &node.value {
                None => nodes.any = Some(branch),
                Some(value) if value.contains('*') => nodes.patterns.push((value.clone(), branch)),
                Some(value) => {
                    nodes.exact.insert(value.clone(), branch);
                }
            }
        }
        level
    }

    /// Every rule, in the order of the files and the tree.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule `entries` match in `domain`, by the reference server's rules (module docs).
    pub fn find<'e>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    ) -> Lookup {
        let Some(mut level) = self.domains.get(domain) else {
            return Lookup::UnknownDomain;
        };
        let last = entries.len().saturating_sub(1);
        let mut key_text = String::new();
        let mut metric_values = String::new();
        // The detailed name when a pattern shares its counter: that entry named by its
        // pattern, the others by their values (an empty value adds nothing).
        let mut metric_shared = String::new();
        let mut shares = false;
        let mut wants_values = false;
        let mut path_with_values = String::from(domain);
        for (i, (key, value)) in entries.enumerate() {
            let Some(nodes) = level.keys.get(key) else {
                return Lookup::NoRule;
            };
            let (branch, written) = if let Some(branch) = nodes.exact.get(value) {
                (branch, Written::Exact)
            } else if let Some((pattern, branch)) =
                nodes.patterns.iter().find(|(p, _)| matches(p, value))
            {
                (branch, Written::Pattern(pattern))
            } else if let Some(branch) = &nodes.any {
                (branch, Written::Any)
            } else {
                return Lookup::NoRule;
            };
            if i > 0 {
                key_text.push_str(", ");
            }
            push_escaped(&mut key_text, key);
            key_text.push('=');
            match written {
                Written::Pattern(pattern) if branch.share_threshold => {
                    push_escaped(&mut key_text, pattern)
                }
                _ => push_escaped(&mut key_text, value),
            }
            // The names metrics use: the request's values throughout (detailed_metric), or the
            // rule's path with the request's value where the node asks for it.
            metric_values.push('.');
            metric_values.push_str(key);
            metric_values.push('_');
            metric_values.push_str(value);
            metric_shared.push('.');
            metric_shared.push_str(key);
            match written {
                Written::Pattern(pattern) if branch.share_threshold => {
                    shares = true;
                    metric_shared.push('_');
                    metric_shared.push_str(pattern);
                }
                _ if !value.is_empty() => {
                    metric_shared.push('_');
                    metric_shared.push_str(value);
                }
                _ => {}
            }
            path_with_values.push('.');
            path_with_values.push_str(key);
            match written {
                Written::Pattern(pattern) if branch.share_threshold => {
                    path_with_values.push('_');
                    path_with_values.push_str(pattern);
                }
                Written::Pattern(_) | Written::Any if branch.value_to_metric => {
                    wants_values = true;
                    // An empty value names the key alone, as the reference server writes it.
                    if !value.is_empty() {
                        path_with_values.push('_');
                        path_with_values.push_str(value);
                    }
                }
                Written::Pattern(pattern) => {
                    path_with_values.push('_');
                    path_with_values.push_str(pattern);
                }
                Written::Exact => {
                    path_with_values.push('_');
                    path_with_values.push_str(value);
                }
                Written::Any => {}
            }
            if i == last {
                let Some(rule) = branch.rule else {
                    return Lookup::NoRule;
                };
                let metric = if self.rules[rule].detailed_metric {
                    // A shared pattern keeps one series for all its values, not one per value.
                    let values = if shares {
                        &metric_shared
                    } else {
                        &metric_values
                    };
                    Some(format!("{domain}{values}"))
                } else {
                    wants_values.then_some(path_with_values)
                };
                return Lookup::Rule(Matched {
                    rule,
                    key: key_text,
                    metric,
                });
            }
            level = &branch.children;
        }
        // No entries at all.
        Lookup::NoRule
    }
}

enum Written<'a> {
    Exact,
    Pattern(&'a str),
    Any,
}

/// The counter key of `entries` taken as they are (a limit sent with the request, for a
/// descriptor no rule matches): the same form as [`Matched::key`].
pub fn counter_key<'e>(entries: impl Iterator<Item = (&'e str, &'e str)>) -> String {
    let mut key = String::new();
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            key.push_str(", ");
        }
        push_escaped(&mut key, k);
        key.push('=');
        push_escaped(&mut key, v);
    }
    key
}

fn push_escaped(into: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '\\' | ',' | '=') {
            into.push('\\');
        }
        into.push(c);
    }
}

/// Whether `value` matches `pattern`, where each `*` matches any run of characters (none
/// included).
pub fn matches(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole value.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_any_run_where_a_star_is() {
        assert!(matches("foo*", "foo"));
        assert!(matches("foo*", "foobar"));
        assert!(!matches("foo*", "fo"));
        assert!(matches("/api/*/users", "/api/v1/users"));
        assert!(!matches("/api/*/users", "/api/v1/groups"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "a-b-b-c"));
        assert!(!matches("a*b*c", "a-c"));
        assert!(!matches("ab*ba", "aba")); // the prefix and suffix may not overlap
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
    }

    #[test]
    fn keys_escape_what_separates_them() {
        let mut key = String::new();
        push_escaped(&mut key, "a,b=c\\d");
        assert_eq!(key, "a\\,b\\=c\\\\d");
    }
}
