//! Bucket keys from a workload group and a principal, the way a search cluster's workload
//! groups key their throttles.
//!
//! A search cluster throttles per workload group, or per user or role within a group. The
//! caller's identity arrives as a *principal string*: tokens separated by U+001F (the ASCII unit
//! separator), each `dimension|value`. A bucket key is `<group>:<dimension>:<value>`:
//!
//! - dimension `group`: the value is the group itself — one bucket per group;
//! - dimension `username` or `role`: the value comes from the principal. Tokens are trimmed and
//!   empty ones ignored; when several tokens carry the dimension (a user with several roles),
//!   the lexicographically smallest value is chosen, so the same principal always lands in the
//!   same bucket whatever the order of its roles.
//!
//! No value for the dimension means the request has no bucket: it is not throttled (and a
//! policy counts it as such).
//!
//! ```
//! use weir::policy::principal::{Dimension, bucket_key};
//!
//! let principal = "username|alice\u{1f}role|writer\u{1f}role|admin";
//! assert_eq!(bucket_key("analytics", Dimension::Role, principal).as_deref(), Some("analytics:role:admin"));
//! assert_eq!(bucket_key("analytics", Dimension::Group, principal).as_deref(), Some("analytics:group:analytics"));
//! assert_eq!(bucket_key("analytics", Dimension::Username, "role|admin"), None);
//! ```

use std::fmt;

/// Separates the tokens of a principal string.
pub const TOKEN_SEPARATOR: char = '\u{1f}';

/// What a bucket key is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// One bucket per workload group.
    Group,
    /// One bucket per user within a group.
    Username,
    /// One bucket per role within a group.
    Role,
}

impl Dimension {
    /// The dimension's name, as it appears in principal tokens and bucket keys.
    pub fn as_str(&self) -> &'static str {
        match self {
            Dimension::Group => "group",
            Dimension::Username => "username",
            Dimension::Role => "role",
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value a principal gives `dimension`: the smallest non-empty one, trimmed.
pub fn principal_value<'a>(principal: &'a str, dimension: &str) -> Option<&'a str> {
    principal
        .split(TOKEN_SEPARATOR)
        .filter_map(|token| {
            let (dim, value) = token.trim().split_once('|')?;
            let value = value.trim();
            (dim.trim() == dimension && !value.is_empty()).then_some(value)
        })
        .min()
}

/// The bucket key `<group>:<dimension>:<value>`, or `None` if the principal has no value for
/// the dimension (the request is then not throttled).
pub fn bucket_key(group: &str, dimension: Dimension, principal: &str) -> Option<String> {
    let value = match dimension {
        Dimension::Group => Some(group),
        Dimension::Username | Dimension::Role => principal_value(principal, dimension.as_str()),
    }?;
    Some(format!("{group}:{dimension}:{value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: char = TOKEN_SEPARATOR;

    #[test]
    fn the_smallest_of_several_roles_wins_whatever_their_order() {
        let a = format!("role|reader{US}role|admin{US}role|writer");
        let b = format!("role|writer{US}role|reader{US}role|admin");
        assert_eq!(
            bucket_key("g", Dimension::Role, &a).as_deref(),
            Some("g:role:admin")
        );
        assert_eq!(
            bucket_key("g", Dimension::Role, &b),
            bucket_key("g", Dimension::Role, &a)
        );
    }

    #[test]
    fn tokens_are_trimmed_and_blanks_ignored() {
        let principal = format!("  {US}username|  bob  {US}{US} role| {US}role|ops ");
        assert_eq!(
            bucket_key("g", Dimension::Username, &principal).as_deref(),
            Some("g:username:bob")
        );
        // `role| ` has an empty value and is ignored; `role|ops ` is trimmed.
        assert_eq!(
            bucket_key("g", Dimension::Role, &principal).as_deref(),
            Some("g:role:ops")
        );
    }

    #[test]
    fn a_missing_value_means_no_bucket() {
        assert_eq!(bucket_key("g", Dimension::Username, ""), None);
        assert_eq!(bucket_key("g", Dimension::Username, "role|admin"), None);
        assert_eq!(
            bucket_key("g", Dimension::Role, &format!("role|{US}role|  ")),
            None
        );
        // Tokens without a separator are not values.
        assert_eq!(bucket_key("g", Dimension::Username, "username"), None);
    }

    #[test]
    fn group_buckets_need_no_principal() {
        assert_eq!(
            bucket_key("etl", Dimension::Group, "").as_deref(),
            Some("etl:group:etl")
        );
    }

    #[test]
    fn dimensions_do_not_leak_into_each_other() {
        let principal = format!("username|zed{US}role|alpha");
        assert_eq!(principal_value(&principal, "username"), Some("zed"));
        assert_eq!(principal_value(&principal, "role"), Some("alpha"));
        assert_eq!(principal_value(&principal, "group"), None);
    }
}
