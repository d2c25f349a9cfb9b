//! Envoy's rate limit service as a target: `ShouldRateLimit` over gRPC, as Envoy calls it, and
//! the reference server's Redis data path beside it.
//!
//! A run's descriptors are templates: `{key}` in a value is replaced by the request's key, so
//! `user={key}` spreads the load over `--keys` users as `--zipf` or the uniform draw says.

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;
use weir_api::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use weir_api::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use weir_api::envoy::service::ratelimit::v3::RateLimitRequest;
use weir_api::envoy::service::ratelimit::v3::rate_limit_response::Code;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use weir_api::http::AcquireBody;
use weir_server::rls::Limit;
use weir_server::rls::RulesConfig;
use weir_server::rls::{Lookup, Tree};

use super::{Answer, Target};
use crate::report::RequestOutcome;

/// What every request of an RLS run asks: a domain and descriptor templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsLoad {
    /// The domain.
    pub domain: String,
    /// The descriptors, each its ordered (key, value template) entries.
    pub descriptors: Vec<Vec<(String, String)>>,
}

impl RlsLoad {
    /// Parses descriptors written `key=value,key=value` (one per string).
    pub fn parse(domain: &str, descriptors: &[String]) -> anyhow::Result<RlsLoad> {
        anyhow::ensure!(!domain.is_empty(), "an RLS run needs --domain");
        anyhow::ensure!(
            !descriptors.is_empty(),
            "an RLS run needs at least one --descriptor (e.g. `user={{key}}`)"
        );
        let descriptors = descriptors
            .iter()
            .map(|text| {
                text.split(',')
                    .map(|entry| {
                        entry
                            .split_once('=')
                            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                            .filter(|(k, _)| !k.is_empty())
                            .with_context(|| {
                                format!("descriptor entry {entry:?} is not `key=value`")
                            })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(RlsLoad {
            domain: domain.to_owned(),
            descriptors,
        })
    }

    /// The descriptors of a request for `key`.
    fn entries<'a>(&'a self, key: &'a str) -> impl Iterator<Item = Vec<(String, String)>> + 'a {
        self.descriptors.iter().map(move |entries| {
            entries
                .iter()
                .map(|(k, v)| (k.clone(), v.replace("{key}", key)))
                .collect()
        })
    }
}

/// `ShouldRateLimit` on one server, unary, as Envoy's filter calls it.
#[derive(Clone)]
pub struct Rls {
    client: RateLimitServiceClient<Channel>,
    load: std::sync::Arc<RlsLoad>,
}

impl Rls {
    /// A client of the server at `base` (`http://host:port`).
    pub async fn connect(base: &str, load: RlsLoad) -> anyhow::Result<Self> {
        let client = RateLimitServiceClient::connect(base.to_owned())
            .await
            .with_context(|| format!("connecting to {base}"))?;
        Ok(Rls {
            client,
            load: std::sync::Arc::new(load),
        })
    }
}

impl Target for Rls {
    async fn acquire(&mut self, body: AcquireBody) -> Answer {
        let request = RateLimitRequest {
            domain: self.load.domain.clone(),
            descriptors: self
                .load
                .entries(&body.key)
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect(),
                    limit: None,
                    hits_addend: None,
                })
                .collect(),
            hits_addend: u32::try_from(body.cost.unwrap_or(1)).unwrap_or(u32::MAX),
        };
        match self.client.should_rate_limit(request).await {
            Ok(reply) => match Code::try_from(reply.into_inner().overall_code) {
                Ok(Code::Ok) => Ok((RequestOutcome::Admitted, None)),
                Ok(Code::OverLimit) => Ok((RequestOutcome::Refused, None)),
                _ => Err("RLS answered UNKNOWN".to_owned()),
            },
            Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
        }
    }

    async fn release(&mut self, _lease: String) {}
}

/// The reference server's data path: for every descriptor with a rule, `INCRBY` its window's
/// key and `EXPIRE` it, pipelined in one round trip, then over if a count passed its limit.
#[derive(Clone)]
pub struct RedisFixedWindow {
    connection: MultiplexedConnection,
    tree: std::sync::Arc<Tree>,
    load: std::sync::Arc<RlsLoad>,
}

impl RedisFixedWindow {
    /// Connects to `url`, deciding by `rules` (the same YAML Weir reads).
    pub async fn connect(url: &str, rules: &RulesConfig, load: RlsLoad) -> anyhow::Result<Self> {
        let connection = redis::Client::open(url)
            .with_context(|| format!("the redis address {url:?}"))?
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to {url}"))?;
        Ok(RedisFixedWindow {
            connection,
            tree: std::sync::Arc::new(Tree::new(rules)),
            load: std::sync::Arc::new(load),
        })
    }
}

impl Target for RedisFixedWindow {
    async fn acquire(&mut self, body: AcquireBody) -> Answer {
        let hits = body.cost.unwrap_or(1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut pipe = redis::pipe();
        let mut limits = Vec::new();
        for entries in self.load.entries(&body.key) {
            let found = self.tree.find(
                &self.load.domain,
                entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
            let Lookup::Rule(matched) = found else {
                continue;
            };
            let Limit::Rate {
                requests_per_unit,
                unit,
                ..
            } = &self.tree.rules()[matched.rule].limit
            else {
                continue;
            };
            let window = unit.window().as_secs();
            // The reference server's key: prefix, domain, every key_value_, the window start.
            let mut key = format!("rl_{}_", self.load.domain);
            for (k, v) in &entries {
                key.push_str(&format!("{k}_{v}_"));
            }
            key.push_str(&(now / window * window).to_string());
            pipe.cmd("INCRBY").arg(&key).arg(hits);
            pipe.cmd("EXPIRE").arg(&key).arg(window).ignore();
            limits.push(u64::from(*requests_per_unit));
        }
        if limits.is_empty() {
            return Ok((RequestOutcome::Admitted, None));
        }
        let counts: Vec<u64> = match pipe.query_async(&mut self.connection).await {
            Ok(counts) => counts,
            Err(error) => return Err(format!("redis: {error}")),
        };
        let over = counts
            .iter()
            .zip(&limits)
            .any(|(count, limit)| count > limit);
        Ok((
            if over {
                RequestOutcome::Refused
            } else {
                RequestOutcome::Admitted
            },
            None,
        ))
    }

    async fn release(&mut self, _lease: String) {}
}
