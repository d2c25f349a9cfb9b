//! `[gubernator]`: where Gubernator's gRPC service listens and how many buckets it keeps, read
//! from the table the config keeps for this door. A leaf, importing nothing of the server but
//! how addresses are read.

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
    /// The table as the config file gives it (an absent one is empty), or what is wrong with
    /// it.
    pub fn read(table: &toml::Table) -> Result<Self, String> {
        let settings: GubernatorTable = table
            .clone()
            .try_into()
            .map_err(|error: toml::de::Error| format!("[gubernator]: {}", error.message()))?;
        let problems = settings.problems();
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(problems.join("; "))
        }
    }

    /// What does not hold together, each naming its setting.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.max_keys == 0 {
            problems.push("`gubernator.max_keys` must be at least 1".to_owned());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_host_names_and_names_its_mistakes() {
        let table: toml::Table = toml::from_str("listen = \"localhost:1051\"\n").unwrap();
        let settings = GubernatorTable::read(&table).unwrap();
        assert_eq!(settings.listen, Some("127.0.0.1:1051".parse().unwrap()));
        assert_eq!(settings.max_keys, 50_000);
        let table: toml::Table = toml::from_str("max_keys = 0\n").unwrap();
        assert_eq!(
            GubernatorTable::read(&table).unwrap_err(),
            "`gubernator.max_keys` must be at least 1"
        );
        let table: toml::Table = toml::from_str("lisen = \"127.0.0.1:1\"\n").unwrap();
        let wrong = GubernatorTable::read(&table).unwrap_err();
        assert!(
            wrong.starts_with("[gubernator]: unknown field `lisen`"),
            "{wrong}"
        );
    }
}
