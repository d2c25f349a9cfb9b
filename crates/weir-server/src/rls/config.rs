//! The reference Envoy rate limit server's YAML, read unchanged, every mistake named with its
//! file, line and rule.
//!
//! A file holds one `domain` and a tree of `descriptors`: each node has a `key`, an optional
//! `value` (exact, or a pattern with `*`), an optional `rate_limit` and nested `descriptors`.
//! Loading checks what the reference server checks (units, duplicate paths, `unlimited` with a
//! unit, `replaces`, `share_threshold` only on patterns) and what it lets through but Weir
//! refuses, so that nothing a user wrote is silently ignored:
//!
//! ```yaml
//! domain: messaging
//! descriptors:
//!   - key: message_type
//!     value: marketing
//!     descriptors:
//!       - key: to_number
//!         rate_limit: { unit: day, requests_per_unit: 5 }
//!   - key: to_number
//!     rate_limit: { unit: day, requests_per_unit: 100 }
//! ```
//!
//! Weir adds one field, `weir_algorithm` (`fixed_window`, the default, or `token_bucket`), on a
//! node or at the top of a file for the whole domain.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use marked_yaml::Spanned;
use serde::Deserialize;

/// The unit of a rule's `requests_per_unit`: the length of its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (86 400 s; windows start at midnight UTC).
    Day,
    /// One week (7 days; windows count from the Unix epoch, a Thursday).
    Week,
    /// 30 days, as the reference server counts a month.
    Month,
    /// 365 days, as the reference server counts a year.
    Year,
}

impl Unit {
    /// The unit named `name`, in any case (`minute`, `MINUTE`).
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The window's length.
    pub fn window(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The unit's name as the reference server's YAML and Envoy's enum spell it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// How a rule counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// The reference server's: hits per calendar-aligned window (default).
    #[default]
    FixedWindow,
    /// Weir's token bucket: `requests_per_unit` spread evenly over the unit, bursts up to
    /// `requests_per_unit` — no double burst at a window's edge.
    TokenBucket,
}

/// Where something was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub file: PathBuf,
    /// Its line (1-based; 0 if unknown).
    pub line: usize,
    /// Its column (1-based; 0 if unknown).
    pub column: usize,
}

impl Place {
    fn file(file: &Path) -> Place {
        Place {
            file: file.to_owned(),
            line: 0,
            column: 0,
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        Ok(())
    }
}

/// A mistake in a rules file: where, which rule, what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {}{problem}", rule.as_ref().map(|r| format!("rule `{r}`: ")).unwrap_or_default())]
pub struct RuleError {
    /// Where.
    pub place: Place,
    /// The rule's path (`domain.key_value.key`), when the mistake is in one.
    pub rule: Option<String>,
    /// What is wrong.
    pub problem: String,
}

/// A node of a domain's descriptor tree, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The entry's key.
    pub key: String,
    /// The entry's value: `None` matches any value; a value with `*` is a pattern.
    pub value: Option<String>,
    /// The rule's path, as the reference server names it in its stats
    /// (`domain.key_value.key`).
    pub path: String,
    /// Where the node starts.
    pub place: Place,
    /// What a descriptor ending here is limited by.
    pub limit: Option<Limit>,
    /// Count, but always answer OK.
    pub shadow_mode: bool,
    /// Metrics name the descriptor's own values, not the rule's path.
    pub detailed_metric: bool,
    /// Metrics put the request's value where this node has none or a pattern.
    pub value_to_metric: bool,
    /// Every value matching this node's pattern shares one counter.
    pub share_threshold: bool,
    /// Deeper entries.
    pub children: Vec<Node>,
}

/// A node's `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// `unlimited: true`: always OK, never counted.
    Unlimited {
        /// The limit's `name`.
        name: Option<String>,
        /// The names of the limits it replaces.
        replaces: Vec<String>,
    },
    /// `requests_per_unit` per `unit`.
    Rate {
        /// Hits per unit; 0 refuses every hit without counting it.
        requests_per_unit: u32,
        /// The unit.
        unit: Unit,
        /// The limit's `name` (answered in `current_limit.name`, used by `replaces`).
        name: Option<String>,
        /// The names of the limits it replaces.
        replaces: Vec<String>,
        /// How it counts.
        algorithm: Algorithm,
    },
}

impl Limit {
    /// The limit's name.
    pub fn name(&self) -> Option<&str> {
        match self {
            Limit::Unlimited { name, .. } | Limit::Rate { name, .. } => name.as_deref(),
        }
    }

    /// The names it replaces.
    pub fn replaces(&self) -> &[String] {
        match self {
            Limit::Unlimited { replaces, .. } | Limit::Rate { replaces, .. } => replaces,
        }
    }
}

/// One domain's rules, from one file.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainRules {
    /// The domain Envoy's filter names.
    pub domain: String,
    /// The file it came from.
    pub file: PathBuf,
    /// The descriptor tree's top level.
    pub descriptors: Vec<Node>,
}

/// Every domain's rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RulesConfig {
    /// The domains, in the order their files were read.
    pub domains: Vec<DomainRules>,
}

impl RulesConfig {
    /// Reads `path`: a YAML file, or a directory whose `.yaml` and `.yml` files (not its
    /// subdirectories) are read in name order. Every mistake of every file is returned.
    pub fn load(path: &Path) -> Result<RulesConfig, Vec<RuleError>> {
        let at_path = |problem: String| {
            vec![RuleError {
                place: Place::file(path),
                rule: None,
                problem,
            }]
        };
        let files = if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| at_path(format!("cannot read the directory: {e}")))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(at_path(
                    "holds no .yaml or .yml file: there are no rules to load".to_owned(),
                ));
            }
            files
        } else {
            vec![path.to_owned()]
        };
        let mut texts = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| {
                vec![RuleError {
                    place: Place::file(&file),
                    rule: None,
                    problem: format!("cannot be read: {e}"),
                }]
            })?;
            texts.push((file, text));
        }
        RulesConfig::parse(texts.iter().map(|(f, t)| (f.as_path(), t.as_str())))
    }

    /// Parses files given as (name, text). Every mistake of every file is returned.
    pub fn parse<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<RulesConfig, Vec<RuleError>> {
        let mut errors = Vec::new();
        let mut domains: Vec<DomainRules> = Vec::new();
        for (file, text) in files {
            let Some(rules) = parse_file(file, text, &mut errors) else {
                continue;
            };
            if let Some(first) = domains.iter().find(|d| d.domain == rules.domain) {
                errors.push(RuleError {
                    place: Place::file(file),
                    rule: None,
                    problem: format!(
                        "domain `{}` is already defined in {}: one file per domain",
                        rules.domain,
                        first.file.display()
                    ),
                });
                continue;
            }
            domains.push(rules);
        }
        // A path names a rule's policy: two rules may not share one, whatever levels or
        // domains they come from (`b.c` at the top, or `b` then `c`).
        let mut paths: std::collections::HashMap<&str, &Place> = std::collections::HashMap::new();
        let mut stack: Vec<&Node> = domains.iter().flat_map(|d| &d.descriptors).collect();
        while let Some(node) = stack.pop() {
            stack.extend(&node.children);
            if node.limit.is_none() {
                continue;
            }
            if let Some(first) = paths.insert(&node.path, &node.place) {
                let (first, again) = if (first.file.as_path(), first.line)
                    <= (node.place.file.as_path(), node.place.line)
                {
                    (first, &node.place)
                } else {
                    (&node.place, first)
                };
                errors.push(RuleError {
                    place: again.clone(),
                    rule: Some(node.path.clone()),
                    problem: format!(
                        "has the same path as the rule at {first}: two rules would count as one policy (rename a key or a domain)"
                    ),
                });
            }
        }
        if errors.is_empty() {
            Ok(RulesConfig { domains })
        } else {
            Err(errors)
        }
    }
}

/// A file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<NodeYaml>,
    #[serde(default)]
    weir_algorithm: Option<Spanned<String>>,
}

/// A descriptor node as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeYaml {
    key: Spanned<String>,
    #[serde(default)]
    value: Option<Spanned<String>>,
    #[serde(default)]
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Vec<NodeYaml>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    quota_mode: Option<Spanned<bool>>,
    /// Read and not used: Weir does not answer `dynamic_metadata`.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    weir_algorithm: Option<Spanned<String>>,
}

/// A `rate_limit` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    #[serde(default)]
    unit: Option<Spanned<String>>,
    #[serde(default)]
    requests_per_unit: Option<Spanned<String>>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplaceYaml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceYaml {
    #[serde(default)]
    name: Option<Spanned<String>>,
}

fn place_of<T>(file: &Path, spanned: &Spanned<T>) -> Place {
    place_at(file, spanned.span().start())
}

/// The place of a YAML mark in `file` (line and column 0 when there is none).
fn place_at(file: &Path, mark: Option<&marked_yaml::Marker>) -> Place {
    let (line, column) = mark.map_or((0, 0), |m| (m.line(), m.column()));
    Place {
        file: file.to_owned(),
        line,
        column,
    }
}

fn parse_algorithm(
    file: &Path,
    written: &Option<Spanned<String>>,
    rule: Option<&str>,
    errors: &mut Vec<RuleError>,
) -> Option<Algorithm> {
    let written = written.as_ref()?;
    match written.as_str() {
        "fixed_window" => Some(Algorithm::FixedWindow),
        "token_bucket" => Some(Algorithm::TokenBucket),
        other => {
            errors.push(RuleError {
                place: place_of(file, written),
                rule: rule.map(str::to_owned),
                problem: format!(
                    "`weir_algorithm` must be `fixed_window` or `token_bucket`, got `{other}`"
                ),
            });
            None
        }
    }
}

/// The fields each level of a rules file may have: a file, a descriptor node, a `rate_limit`,
/// one of its `replaces`.
const FILE_FIELDS: &[&str] = &["domain", "descriptors", "weir_algorithm"];
const NODE_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    "weir_algorithm",
];
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];
const REPLACE_FIELDS: &[&str] = &["name"];

/// Every field of `node` (a mapping at a level whose fields are `known`) that is not one, at
/// its line and column and with the nearest field meant when one is close; then the same in
/// the levels below. serde would stop at the first, and without a place.
fn unknown_fields(
    file: &Path,
    node: &marked_yaml::Node,
    known: &[&str],
    errors: &mut Vec<RuleError>,
) {
    let Some(mapping) = node.as_mapping() else {
        return;
    };
    for (key, value) in mapping.iter() {
        let name = key.as_str();
        if !known.contains(&name) {
            let meant = crate::config::nearest_name(name, known.iter().copied())
                .map_or(String::new(), |field| format!(" (did you mean `{field}`?)"));
            errors.push(RuleError {
                place: place_at(file, key.span().start()),
                rule: None,
                problem: format!(
                    "unknown field `{name}`{meant}; a {} has {}",
                    match known {
                        k if k == FILE_FIELDS => "file",
                        k if k == NODE_FIELDS => "descriptor",
                        k if k == RATE_LIMIT_FIELDS => "rate_limit",
                        _ => "replaces entry",
                    },
                    known
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
            continue;
        }
        let (below, each) = match name {
            "descriptors" => (NODE_FIELDS, true),
            "rate_limit" => (RATE_LIMIT_FIELDS, false),
            "replaces" => (REPLACE_FIELDS, true),
            _ => continue,
        };
        match (each, value.as_sequence()) {
            (true, Some(items)) => {
                for item in items.iter() {
                    unknown_fields(file, item, below, errors);
                }
            }
            _ => unknown_fields(file, value, below, errors),
        }
    }
}

fn parse_file(file: &Path, text: &str, errors: &mut Vec<RuleError>) -> Option<DomainRules> {
    // Every unknown field first, each at its place: a file with any is not read further.
    if let Ok(tree) = marked_yaml::parse_yaml(0, text) {
        let before = errors.len();
        unknown_fields(file, &tree, FILE_FIELDS, errors);
        if errors.len() > before {
            return None;
        }
    }
    let parsed: FileYaml = match marked_yaml::from_yaml(0, text) {
        Ok(parsed) => parsed,
        Err(error) => {
            let mark = match &error {
                marked_yaml::FromYamlError::FromNode(e) => e.start_mark(),
                marked_yaml::FromYamlError::ParseYaml(_) => None,
            };
            errors.push(RuleError {
                place: place_at(file, mark.as_ref()),
                rule: None,
                problem: format!("is not a valid rules file: {error}"),
            });
            return None;
        }
    };
    let domain = parsed.domain.as_str().to_owned();
    if domain.is_empty() {
        errors.push(RuleError {
            place: place_of(file, &parsed.domain),
            rule: None,
            problem: "`domain` must not be empty".to_owned(),
        });
        return None;
    }
    let before = errors.len();
    let algorithm = parse_algorithm(file, &parsed.weir_algorithm, None, errors).unwrap_or_default();
    let mut context = Context {
        file,
        algorithm,
        errors,
    };
    let descriptors = context.level(&domain, parsed.descriptors);
    (errors.len() == before).then_some(DomainRules {
        domain,
        file: file.to_owned(),
        descriptors,
    })
}

struct Context<'a> {
    file: &'a Path,
    algorithm: Algorithm,
    errors: &'a mut Vec<RuleError>,
}

impl Context<'_> {
    fn error(&mut self, place: Place, rule: &str, problem: impl Into<String>) {
        self.errors.push(RuleError {
            place,
            rule: Some(rule.to_owned()),
            problem: problem.into(),
        });
    }

    /// The nodes of one level under `parent` (a path), checked.
    fn level(&mut self, parent: &str, written: Vec<NodeYaml>) -> Vec<Node> {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut nodes = Vec::new();
        for node in written {
            let place = place_of(self.file, &node.key);
            let key = node.key.as_str().to_owned();
            // An empty value is no value, as the reference server reads it: any value.
            let value = node
                .value
                .as_ref()
                .map(|v| v.as_str().to_owned())
                .filter(|v| !v.is_empty());
            let step = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.clone(),
            };
            let path = format!("{parent}.{step}");
            if key.is_empty() {
                self.error(place.clone(), &path, "`key` must not be empty");
            }
            if !seen.insert(step) {
                self.error(
                    place.clone(),
                    &path,
                    "is defined twice at this level: each key (and value) may appear once",
                );
            }
            let is_pattern = value.as_deref().is_some_and(|v| v.contains('*'));
            if node.share_threshold && !is_pattern {
                self.error(
                    place.clone(),
                    &path,
                    "`share_threshold` needs a `value` with `*`: it makes every value the pattern matches share one counter",
                );
            }
            if let Some(quota) = &node.quota_mode
                && **quota
            {
                let at = place_of(self.file, quota);
                self.error(
                        at,
                        &path,
                        "`quota_mode` is not supported by Weir: remove it (the rule then answers OVER_LIMIT as any other)",
                    );
            }
            let algorithm =
                parse_algorithm(self.file, &node.weir_algorithm, Some(&path), self.errors)
                    .unwrap_or(self.algorithm);
            let limit = node
                .rate_limit
                .and_then(|written| self.limit(&path, &place, written, algorithm));
            let children = self.level(&path, node.descriptors);
            nodes.push(Node {
                key,
                value,
                path,
                place,
                limit,
                shadow_mode: node.shadow_mode,
                detailed_metric: node.detailed_metric,
                value_to_metric: node.value_to_metric,
                share_threshold: node.share_threshold,
                children,
            });
        }
        nodes
    }

    fn limit(
        &mut self,
        path: &str,
        place: &Place,
        written: RateLimitYaml,
        algorithm: Algorithm,
    ) -> Option<Limit> {
        let mut replaces = Vec::new();
        for replace in written.replaces {
            match replace.name {
                Some(name) if !name.is_empty() => {
                    if written.name.as_deref() == Some(name.as_str()) {
                        let at = place_of(self.file, &name);
                        self.error(at, path, "`replaces` names the rule's own limit");
                    }
                    replaces.push(name.as_str().to_owned());
                }
                _ => self.error(place.clone(), path, "a `replaces` entry must have a `name`"),
            }
        }
        let unit = written.unit.as_ref().map(|u| (Unit::parse(u), u));
        if written.unlimited {
            if let Some((Some(_), spanned)) = &unit {
                let at = place_of(self.file, spanned);
                self.error(at, path, "`unit` must not be given with `unlimited: true`");
                return None;
            }
            return Some(Limit::Unlimited {
                name: written.name,
                replaces,
            });
        }
        let unit = match unit {
            Some((Some(unit), _)) => unit,
            Some((None, spanned)) => {
                let at = place_of(self.file, spanned);
                self.error(
                    at,
                    path,
                    format!(
                        "`unit` must be second, minute, hour, day, week, month or year, got `{}`",
                        spanned.as_str()
                    ),
                );
                return None;
            }
            None => {
                self.error(
                    place.clone(),
                    path,
                    "`rate_limit` needs a `unit` (or `unlimited: true`)",
                );
                return None;
            }
        };
        let Some(count) = written.requests_per_unit else {
            self.error(
                place.clone(),
                path,
                "`rate_limit` needs `requests_per_unit` (0 refuses every request)",
            );
            return None;
        };
        let requests_per_unit = match count.trim().parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let at = place_of(self.file, &count);
                self.error(
                    at,
                    path,
                    format!(
                        "`requests_per_unit` must be a whole number from 0 (refuse every request) to {}, got `{}`",
                        u32::MAX,
                        count.as_str()
                    ),
                );
                return None;
            }
        };
        Some(Limit::Rate {
            requests_per_unit,
            unit,
            name: written.name,
            replaces,
            algorithm,
        })
    }
}
