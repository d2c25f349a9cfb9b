//! The `[rls]` table of the config file, and the settings the service answers with.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::files::SameDomain;

/// How the service answers, from the config file's `[rls]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsSettings {
    /// Keys each rule tracks at once (its policy's `max_keys`).
    pub max_keys: usize,
    /// A hit that takes a key past this share of its limit counts as "near limit".
    pub near_limit_ratio: f64,
    /// Answer the RateLimit header fields (`RateLimit-Limit`, `-Remaining`, `-Reset`) for
    /// Envoy to add to the client's response.
    pub response_headers: bool,
    /// The most descriptors one call may carry.
    pub max_descriptors: usize,
    /// Every descriptor's limit in quota mode, as if each rule said `quota_mode: true`.
    pub quota_mode: bool,
}

impl Default for RlsSettings {
    fn default() -> Self {
        RlsSettings {
            max_keys: 100_000,
            near_limit_ratio: 0.8,
            response_headers: false,
            max_descriptors: 64,
            quota_mode: false,
        }
    }
}

/// The `[rls]` table: Envoy's rate limit service on the gRPC port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsTable {
    /// The reference server's YAML rules: a file, or a directory of `.yaml`/`.yml` files
    /// (also `--rls-config`). Absent: the service is not offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
    /// Keys each rule tracks at once (default 100 000); past it, idle keys are dropped, and
    /// if none is idle new keys share one counter.
    #[serde(default = "default_rls_max_keys")]
    pub max_keys: usize,
    /// The share of a limit past which hits count as "near limit" (default 0.8).
    #[serde(default = "default_near_limit_ratio")]
    pub near_limit_ratio: f64,
    /// Answer the RateLimit header fields for Envoy to add to responses (default false).
    #[serde(default)]
    pub response_headers: bool,
    /// The most descriptors one `ShouldRateLimit` call may carry (default 64); a call with
    /// more is refused with `INVALID_ARGUMENT`, counting nothing. Envoy sends one descriptor
    /// per matching rate limit action: a handful.
    #[serde(default = "default_max_descriptors")]
    pub max_descriptors: usize,
    /// Every limit in quota mode (the reference server's `QUOTA_MODE`; default false): a
    /// request is over only if a descriptor not in quota mode is, or every one in it is.
    #[serde(default)]
    pub quota_mode: bool,
    /// Let several files add rules to one domain (the reference server's
    /// `MERGE_DOMAIN_CONFIG`; default false: a domain defined twice is a mistake).
    #[serde(default)]
    pub merge_domains: bool,
}

fn default_rls_max_keys() -> usize {
    RlsSettings::default().max_keys
}
fn default_near_limit_ratio() -> f64 {
    RlsSettings::default().near_limit_ratio
}
fn default_max_descriptors() -> usize {
    RlsSettings::default().max_descriptors
}

impl Default for RlsTable {
    fn default() -> Self {
        RlsTable {
            config: None,
            max_keys: default_rls_max_keys(),
            near_limit_ratio: default_near_limit_ratio(),
            response_headers: false,
            max_descriptors: default_max_descriptors(),
            quota_mode: false,
            merge_domains: false,
        }
    }
}

impl RlsTable {
    pub(crate) fn is_default(&self) -> bool {
        *self == RlsTable::default()
    }

    /// What two files defining one domain mean.
    pub fn same_domain(&self) -> SameDomain {
        if self.merge_domains {
            SameDomain::Merged
        } else {
            SameDomain::Refused
        }
    }

    /// The service's settings.
    pub fn settings(&self) -> RlsSettings {
        RlsSettings {
            max_keys: self.max_keys,
            near_limit_ratio: self.near_limit_ratio,
            response_headers: self.response_headers,
            max_descriptors: self.max_descriptors,
            quota_mode: self.quota_mode,
        }
    }
}
