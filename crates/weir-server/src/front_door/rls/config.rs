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
//! Weir adds one field, `weir_algorithm`, on a node or at the top of a file for the whole
//! domain: the table of any Weir limiter that counts so many hits per window (`fixed_window`,
//! the default, every other window limiter, or `token_bucket`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir::policy::KeyedSpec;

use super::yaml::parse_file;

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

/// How a rule counts: the table of the Weir limiter that counts its `requests_per_unit` per
/// unit ([`KeyedSpec::per_window`]), as `weir_algorithm` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algorithm {
    table: &'static str,
    /// Read once here rather than for every answer.
    counts_refused: bool,
}

impl Default for Algorithm {
    /// The reference server's: hits per calendar-aligned window.
    fn default() -> Self {
        let count = weir::limiter::fixed_window::COUNT;
        Algorithm {
            table: count.name(),
            counts_refused: count.counts_refused(),
        }
    }
}

impl Algorithm {
    /// The algorithm `name` names, if a limiter counts per window by that name.
    pub fn named(name: &str) -> Option<Algorithm> {
        let table = Algorithm::names().find(|n| *n == name)?;
        let spec = KeyedSpec::per_window(table, 1, Duration::from_secs(1))?;
        Some(Algorithm {
            table,
            counts_refused: spec.counts_refused(),
        })
    }

    /// Every name `weir_algorithm` takes.
    pub fn names() -> impl Iterator<Item = &'static str> {
        KeyedSpec::per_window_tables()
    }

    /// The limiter that counts `requests` per `window` this way.
    pub fn spec(self, requests: u64, window: Duration) -> Option<KeyedSpec> {
        KeyedSpec::per_window(self.table, requests, window)
    }

    /// Whether the limiter counts a refused hit itself (a fixed window does; a bucket takes
    /// nothing it refuses).
    pub fn counts_refused(self) -> bool {
        self.counts_refused
    }
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
    pub(super) fn file(file: &Path) -> Place {
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
    /// Over its limit, the descriptor says so, but the request is over only if a descriptor
    /// not in quota mode is, or every one in quota mode is.
    pub quota_mode: bool,
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

/// How deep subdirectories are followed: a symlink back up the tree ends here.
const MAX_DEPTH: usize = 16;

/// Every file under `dir`, in its subdirectories too, but for names starting with `.`.
fn rules_files(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    walk(dir, files, 0)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "{} is more than {MAX_DEPTH} directories deep (a symlink loop?)",
            dir.display()
        )));
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if path.is_dir() {
            walk(&path, files, depth + 1)?;
        } else if path.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

/// What two files that define one domain mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameDomain {
    /// A mistake, named (the reference server's default).
    #[default]
    Refused,
    /// The later file's descriptors join the domain's (`[rls] merge_domains`, the reference
    /// server's `MERGE_DOMAIN_CONFIG`); one key and value defined in both is a mistake.
    Merged,
}

/// Adds `more`'s descriptors to `domain`'s, each one whose key and value `domain` already
/// has named as a mistake where `more` writes it.
fn merge(domain: &mut DomainRules, more: DomainRules, errors: &mut Vec<RuleError>) {
    for node in more.descriptors {
        let same = |d: &&Node| d.key == node.key && d.value == node.value;
        if let Some(first) = domain.descriptors.iter().find(same) {
            errors.push(RuleError {
                place: node.place.clone(),
                rule: Some(node.path.clone()),
                problem: format!(
                    "the domain's files define this key and value twice (first at {})",
                    first.place
                ),
            });
            continue;
        }
        domain.descriptors.push(node);
    }
}

/// Every domain's rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RulesConfig {
    /// The domains, in the order their files were read.
    pub domains: Vec<DomainRules>,
}

impl RulesConfig {
    /// Reads `path`: a rules file, or a directory whose every file is one, in its
    /// subdirectories too, whatever their names, as the reference server loads its directory
    /// (several ConfigMaps mounted side by side). Names starting with `.` are skipped: a
    /// mounted ConfigMap keeps its files' real copies in `..data` and dated `..` directories
    /// beside the links to them, which would otherwise be read twice. Files are read in path
    /// order; `same_domain` says what two files defining one domain mean. Every mistake of
    /// every file is returned.
    pub fn load(path: &Path, same_domain: SameDomain) -> Result<RulesConfig, Vec<RuleError>> {
        let at_path = |problem: String| {
            vec![RuleError {
                place: Place::file(path),
                rule: None,
                problem,
            }]
        };
        let files = if path.is_dir() {
            let mut files = Vec::new();
            rules_files(path, &mut files)
                .map_err(|e| at_path(format!("cannot read the directory: {e}")))?;
            files.sort();
            if files.is_empty() {
                return Err(at_path(
                    "holds no file (names starting with `.` are skipped): there are no rules to load"
                        .to_owned(),
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
        RulesConfig::parse_with(
            texts.iter().map(|(f, t)| (f.as_path(), t.as_str())),
            same_domain,
        )
    }

    /// Parses files given as (name, text), one domain to a file. Every mistake of every file
    /// is returned.
    pub fn parse<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<RulesConfig, Vec<RuleError>> {
        RulesConfig::parse_with(files, SameDomain::Refused)
    }

    /// Parses files given as (name, text), `same_domain` saying what two files defining one
    /// domain mean. Every mistake of every file is returned.
    pub fn parse_with<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
        same_domain: SameDomain,
    ) -> Result<RulesConfig, Vec<RuleError>> {
        let mut errors = Vec::new();
        let mut domains: Vec<DomainRules> = Vec::new();
        for (file, text) in files {
            let Some(rules) = parse_file(file, text, &mut errors) else {
                continue;
            };
            match (
                domains.iter_mut().find(|d| d.domain == rules.domain),
                same_domain,
            ) {
                (Some(first), SameDomain::Merged) => merge(first, rules, &mut errors),
                (Some(first), SameDomain::Refused) => errors.push(RuleError {
                    place: Place::file(file),
                    rule: None,
                    problem: format!(
                        "domain `{}` is already defined in {}: one file per domain (or `merge_domains = true` in [rls])",
                        rules.domain,
                        first.file.display()
                    ),
                }),
                (None, _) => domains.push(rules),
            }
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
