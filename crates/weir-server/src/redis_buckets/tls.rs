//! `[redis.tls]`: how a Redis reached by `rediss://` is verified, and the certificate this node
//! shows it when it asks for one — the same three files `[server.tls]` takes. Read once when
//! the node starts, so that a missing or damaged file stops the start, named, rather than
//! failing every decision.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// `[redis.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsSettings {
    /// The CA Redis's certificate is verified by (PEM); absent: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// This node's client certificate chain (PEM), for a Redis that asks for one
    /// (`tls-auth-clients yes`); with `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); with `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// A `[redis.tls]` file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("[redis.tls] `{field}`: reading {}: {source}", path.display())]
pub struct RedisTlsError {
    /// The setting that names it.
    pub field: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Why it could not be read.
    pub source: std::io::Error,
}

impl RedisTlsSettings {
    /// What does not hold together, without reading a file.
    pub fn problems(&self) -> Vec<String> {
        match (&self.cert, &self.key) {
            (Some(_), None) | (None, Some(_)) => {
                vec!["`cert` and `key` go together: give both, or neither".to_owned()]
            }
            _ => Vec::new(),
        }
    }

    /// The files' contents, as the Redis client takes them.
    pub fn load(&self) -> Result<redis::TlsCertificates, RedisTlsError> {
        let read = |field: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| RedisTlsError {
                field,
                path: path.to_owned(),
                source,
            })
        };
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("cert", cert)?,
                client_key: read("key", key)?,
            }),
            _ => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert: self.ca.as_deref().map(|ca| read("ca", ca)).transpose()?,
        })
    }
}
