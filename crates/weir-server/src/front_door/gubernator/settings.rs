//! `[gubernator]`: where Gubernator's gRPC service listens and how many buckets it keeps. A
//! leaf the config reads, importing nothing of the server but how addresses are read.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `[gubernator]`: Gubernator's API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GubernatorTable {
    /// Where its gRPC service listens (`--gubernator`, `WEIR_GUBERNATOR`); absent: it does not.
    /// The HTTP gateway is on the HTTP port either way.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::listen_address::serde::some"
    )]
    pub listen: Option<SocketAddr>,
    /// The most buckets kept at once (Gubernator's cache size, 50 000 by default); past it, the
    /// ended go first, then others (they start again whole).
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
}

fn default_max_keys() -> usize {
    50_000
}

impl Default for GubernatorTable {
    fn default() -> Self {
        GubernatorTable {
            listen: None,
            max_keys: default_max_keys(),
        }
    }
}

impl GubernatorTable {
    /// Whether nothing is set (the table is then left out of a config written back).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// What does not hold together, as `(field, problem)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.max_keys == 0 {
            problems.push(("max_keys", "must be at least 1".to_owned()));
        }
        problems
    }
}
