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
    /// Every unit, in declaration order (a unit's index is `unit as usize`).
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

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

/// Every domain's rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RulesConfig {
    /// The domains, in the order their files were read.
    pub domains: Vec<DomainRules>,
}
