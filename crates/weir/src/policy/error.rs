//! A policy's problem, named with the policy and the field's path.

use std::fmt;

use crate::error::ConfigError;

/// A policy config that does not hold together. Names the policy and the field.
///
/// Shown as ``policy `NAME`: `FIELD` PROBLEM``; a policy without a name yet (the body of an API
/// call, named by its URL) is shown as ```FIELD` PROBLEM``.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyError {
    /// The policy's name.
    pub policy: String,
    /// The field's path, e.g. `token_bucket.rate`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.policy.is_empty() {
            write!(f, "policy `{}`: ", self.policy)?;
        }
        write!(f, "`{}` {}", self.field, self.problem)
    }
}

impl std::error::Error for PolicyError {}

impl PolicyError {
    pub(super) fn new(policy: &str, field: impl Into<String>, problem: impl Into<String>) -> Self {
        // The error is printed for an operator: a name's control codes are shown escaped.
        let policy = if policy.chars().any(char::is_control) {
            policy.escape_debug().to_string()
        } else {
            policy.to_owned()
        };
        PolicyError {
            policy,
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(super) fn from_limiter(policy: &str, table: &str, err: &ConfigError) -> Self {
        PolicyError::new(policy, format!("{table}.{}", err.field()), err.problem())
    }

    /// An adaptive table's problem, named as `adaptive.FIELD` of `policy`.
    pub(crate) fn from_adaptive(policy: &str, err: crate::backpressure::AdaptiveError) -> Self {
        PolicyError::new(policy, format!("adaptive.{}", err.field), err.problem)
    }
}
