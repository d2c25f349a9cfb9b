//! The Redis baseline: the same policy done the way many teams do it today, as a Lua script in
//! Redis — a token bucket in a hash, or an in-flight limit as a sorted set of leases scored by
//! their expiry — so `weir bench --target redis` can put Weir's numbers beside Redis's.
//!
//! Both scripts read the time from Redis itself (`TIME`), as such scripts must when several
//! clients with their own clocks share a bucket.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use weir::policy::{KeyedSpec, Limiter, PolicyConfig};

/// A token bucket: `KEYS[1]` a hash {tokens, at}; `ARGV` rate/s, burst, cost. 1 if admitted.
const TOKEN_BUCKET: &str = r"
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local admitted = 0
if tokens >= cost then
  tokens = tokens - cost
  admitted = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return admitted
";

/// A lease semaphore: `KEYS[1]` a sorted set of lease ids scored by expiry (ms); `ARGV` limit,
/// ttl ms, lease id. Expired leases (inclusive) are dropped first. 1 if the lease was taken.
const LEASE: &str = r"
local limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
";

/// What the Redis script enforces, taken from a Weir policy.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisLimiter {
    /// `token_bucket = { rate, burst }`.
    TokenBucket {
        /// Tokens per second.
        rate: f64,
        /// Capacity.
        burst: u64,
    },
    /// `concurrency = { node_limit, lease_ttl }`.
    Lease {
        /// Leases held at once per key.
        limit: u64,
        /// Lease lifetime, milliseconds.
        ttl_ms: u64,
    },
}

impl RedisLimiter {
    /// The script for `policy`'s limiter; only token buckets and concurrency limits have one.
    pub fn of(policy: &PolicyConfig) -> anyhow::Result<Self> {
        if let Limiter::Keyed(KeyedSpec::TokenBucket(bucket)) = &policy.limiter {
            return Ok(RedisLimiter::TokenBucket {
                rate: bucket.rate,
                burst: bucket
                    .burst
                    .unwrap_or_else(|| bucket.rate.ceil().max(1.0) as u64),
            });
        }
        if let Some(concurrency) = policy.concurrency() {
            return Ok(RedisLimiter::Lease {
                limit: concurrency.node_limit,
                ttl_ms: concurrency.lease_ttl.as_millis() as u64,
            });
        }
        anyhow::bail!(
            "policy `{}`: the redis target runs token_bucket and concurrency policies only",
            policy.name
        )
    }
}

/// One client's connection to Redis and the script it runs.
#[derive(Clone)]
pub struct RedisTarget {
    connection: MultiplexedConnection,
    limiter: RedisLimiter,
    script: redis::Script,
    /// The policy's name, prefixed to every key.
    policy: String,
}

/// Lease ids, unique across every client of the run.
static NEXT_LEASE: AtomicU64 = AtomicU64::new(0);

impl RedisTarget {
    /// Connects to `url` (`redis://host:port`).
    pub async fn connect(url: &str, policy: &PolicyConfig) -> anyhow::Result<Self> {
        let limiter = RedisLimiter::of(policy)?;
        let connection = redis::Client::open(url)
            .with_context(|| format!("the redis address {url:?}"))?
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to {url}"))?;
        let script = redis::Script::new(match limiter {
            RedisLimiter::TokenBucket { .. } => TOKEN_BUCKET,
            RedisLimiter::Lease { .. } => LEASE,
        });
        Ok(RedisTarget {
            connection,
            limiter,
            script,
            policy: policy.name.clone(),
        })
    }

    /// Asks for `cost` of `key`; the lease id to give back when a lease was taken.
    pub async fn acquire(
        &mut self,
        key: &str,
        cost: u64,
    ) -> redis::RedisResult<(bool, Option<String>)> {
        let key = format!("{}:{key}", self.policy);
        let mut invocation = self.script.key(&key);
        let lease = match self.limiter {
            RedisLimiter::TokenBucket { rate, burst } => {
                invocation.arg(rate).arg(burst).arg(cost);
                None
            }
            RedisLimiter::Lease { limit, ttl_ms } => {
                let id = NEXT_LEASE.fetch_add(1, Ordering::Relaxed).to_string();
                invocation.arg(limit).arg(ttl_ms).arg(&id);
                Some(id)
            }
        };
        let admitted: i64 = invocation.invoke_async(&mut self.connection).await?;
        Ok((
            admitted == 1,
            lease
                .filter(|_| admitted == 1)
                .map(|id| format!("{key}\n{id}")),
        ))
    }

    /// Gives a lease back (`ZREM`); an unknown or expired one is a no-op, as in Weir.
    pub async fn release(&mut self, lease: &str) -> redis::RedisResult<()> {
        let Some((key, id)) = lease.split_once('\n') else {
            return Ok(());
        };
        redis::cmd("ZREM")
            .arg(key)
            .arg(id)
            .query_async::<()>(&mut self.connection)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_server::ConfigFile;

    fn policy(toml: &str) -> PolicyConfig {
        ConfigFile::parse(toml).unwrap().policy.remove(0)
    }

    #[test]
    fn a_policy_names_its_script_or_says_why_it_has_none() {
        let bucket = policy(
            "[[policy]]\nname = \"b\"\non_exhausted = \"reject\"\ntoken_bucket = { rate = 50 }\n",
        );
        assert_eq!(
            RedisLimiter::of(&bucket).unwrap(),
            RedisLimiter::TokenBucket {
                rate: 50.0,
                burst: 50
            }
        );
        let leases = policy(
            "[[policy]]\nname = \"c\"\non_exhausted = \"reject\"\nconcurrency = { node_limit = 4, lease_ttl = \"2s\" }\n",
        );
        assert_eq!(
            RedisLimiter::of(&leases).unwrap(),
            RedisLimiter::Lease {
                limit: 4,
                ttl_ms: 2000
            }
        );
        let strict = policy("[[policy]]\nname = \"s\"\nstrict = { qps = 5 }\n");
        let error = RedisLimiter::of(&strict).unwrap_err().to_string();
        assert!(error.contains("policy `s`"), "{error}");
    }
}
