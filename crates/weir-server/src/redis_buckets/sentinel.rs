//! `[redis.sentinel]`: a Redis that Sentinel watches, reached through the sentinels — their
//! URLs (a sentinel's own password in its URL), the master's name, and the master's login.
//! Over TLS when `[redis.tls]` is given: the sentinels' URLs are then `rediss://`, and the
//! master they name (and after a failover, the promoted replica) is reached over TLS too,
//! verified by the same CA and shown the same client certificate.

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult, TlsCertificates, TlsMode};
use serde::{Deserialize, Serialize};

/// `[redis.sentinel]`: a master Redis Sentinel watches and fails over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelSettings {
    /// The master's name, as the sentinels know it (`sentinel monitor NAME …`).
    pub master: String,
    /// Some of the sentinels: `redis://host:port` each (`rediss://` with `[redis.tls]`; a
    /// sentinel's own password in its URL).
    pub nodes: Vec<String>,
    /// The ACL user the master (and a promoted replica) is logged in as; absent: the default
    /// user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The master's password (`requirepass`, or the ACL user's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl SentinelSettings {
    /// A client that asks the sentinels for the master, logged in as the settings say, over
    /// TLS with `certificates` when given. Connects to nothing yet.
    pub(super) fn client(
        &self,
        certificates: Option<&TlsCertificates>,
    ) -> RedisResult<SentinelClient> {
        let sentinels = self
            .nodes
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(
            sentinels.iter().map(|sentinel| sentinel.addr.clone()),
            self.master.clone(),
            SentinelServerType::Master,
        )?;
        // The builder takes one login for every sentinel: the first URL's that names one.
        if let Some(user) = sentinels.iter().find_map(|s| s.redis.username.clone()) {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = sentinels.iter().find_map(|s| s.redis.password.clone()) {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user.clone());
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password.clone());
        }
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone());
        }
        builder.build()
    }
}
