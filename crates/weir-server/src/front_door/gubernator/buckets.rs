//! The buckets Gubernator's requests make: one per `name` and `unique_key`, created by the
//! first request that names it, of the algorithm, limit and duration that request sends.
//!
//! Each is kept until it ends (a token bucket's duration, a leaky bucket's idle time), in a
//! table of bounded size: when a shard is full its ended buckets go first, then one that has
//! not ended (Gubernator's cache evicts the least recently used; the effect for a client is the
//! same — a bucket evicted starts again whole). The table is locked by shard, and a decision
//! holds one shard's lock for the few comparisons it takes.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::gregorian::GregorianError;
use super::hit::{Answer, Behaviors, Hit, Status};
use super::leaky_bucket::LeakyBucket;
use super::token_bucket::TokenBucket;
use super::wire::{self, Algorithm, RateLimitReq, RateLimitResp};

/// Shards of the table: enough that two cores rarely meet on one lock.
const SHARDS: usize = 64;

/// One key's bucket, of either algorithm.
#[derive(Debug, Clone, PartialEq)]
enum Bucket {
    Token(TokenBucket),
    Leaky(LeakyBucket),
}

impl Bucket {
    fn expired(&self, now: i64) -> bool {
        match self {
            Bucket::Token(bucket) => bucket.expired(now),
            Bucket::Leaky(bucket) => bucket.expired(now),
        }
    }
}

/// What the table has answered, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counts {
    /// Decisions by algorithm (token, leaky) and status (under, over).
    pub decided: [[AtomicU64; 2]; 2],
    /// Requests answered with an error (a missing field, an unknown algorithm or interval).
    pub errors: AtomicU64,
    /// Buckets dropped before they ended, to keep the table within its size.
    pub evicted: AtomicU64,
}

/// Every bucket Gubernator's requests have made on this node.
#[derive(Debug)]
pub struct Buckets {
    shards: Box<[Mutex<HashMap<String, Bucket>>]>,
    per_shard: usize,
    hasher: foldhash::fast::FixedState,
    /// What has been answered.
    pub counts: Counts,
}

impl Buckets {
    /// A table of at most about `max_keys` buckets.
    pub fn new(max_keys: usize) -> Self {
        Buckets {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            hasher: foldhash::fast::FixedState::default(),
            counts: Counts::default(),
        }
    }

    /// The buckets held now (ended ones included until they are next met).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    /// Answers one request; `server_now` (epoch milliseconds) stands for a missing or zero
    /// `created_at`.
    pub fn answer(&self, request: &RateLimitReq, server_now: i64) -> RateLimitResp {
        // Gubernator's own sentences, which its clients may match on.
        if request.unique_key.is_empty() {
            return self.error("field 'unique_key' cannot be empty".to_owned());
        }
        if request.name.is_empty() {
            return self.error("field 'namespace' cannot be empty".to_owned());
        }
        let key = format!("{}_{}", request.name, request.unique_key);
        let Ok(algorithm) = Algorithm::try_from(request.algorithm) else {
            return self.error(format!(
                "Error while apply rate limit for '{key}': Invalid rate limit algorithm '{}'",
                request.algorithm
            ));
        };
        let hit = Hit {
            hits: request.hits,
            limit: request.limit,
            duration: request.duration,
            burst: request.burst,
            behaviors: Behaviors::new(request.behavior),
            now: request
                .created_at
                .filter(|&at| at != 0)
                .unwrap_or(server_now),
        };
        match self.decide(&key, algorithm, &hit) {
            Ok(answer) => {
                let status = usize::from(answer.status == Status::OverLimit);
                self.counts.decided[algorithm as usize][status].fetch_add(1, Relaxed);
                RateLimitResp {
                    status: match answer.status {
                        Status::UnderLimit => wire::Status::UnderLimit,
                        Status::OverLimit => wire::Status::OverLimit,
                    } as i32,
                    limit: answer.limit,
                    remaining: answer.remaining,
                    reset_time: answer.reset_time,
                    ..RateLimitResp::default()
                }
            }
            Err(why) => self.error(format!("Error while apply rate limit for '{key}': {why}")),
        }
    }

    fn error(&self, error: String) -> RateLimitResp {
        self.counts.errors.fetch_add(1, Relaxed);
        RateLimitResp {
            error,
            ..RateLimitResp::default()
        }
    }

    /// Counts `hit` in `key`'s bucket, making it (or making it again) as the request says.
    fn decide(&self, key: &str, algorithm: Algorithm, hit: &Hit) -> Result<Answer, GregorianError> {
        let shard = &self.shards[self.hasher.hash_one(key) as usize % SHARDS];
        let mut buckets = shard.lock().unwrap_or_else(|p| p.into_inner());
        let reset = hit.behaviors.has(Behaviors::RESET_REMAINING);
        let live = buckets
            .get_mut(key)
            .filter(|bucket| !bucket.expired(hit.now));
        match (live, algorithm) {
            (Some(Bucket::Token(_)), Algorithm::TokenBucket) if reset => {
                buckets.remove(key);
                Ok(TokenBucket::reset(hit))
            }
            (Some(Bucket::Token(bucket)), Algorithm::TokenBucket) => bucket.hit(hit),
            (Some(Bucket::Leaky(bucket)), Algorithm::LeakyBucket) => bucket.hit(hit),
            // None yet, ended, or of the other algorithm: a new one.
            _ => {
                let (bucket, answer) = match algorithm {
                    Algorithm::TokenBucket => {
                        TokenBucket::start(hit).map(|(b, a)| (Bucket::Token(b), a))?
                    }
                    Algorithm::LeakyBucket => {
                        LeakyBucket::start(hit).map(|(b, a)| (Bucket::Leaky(b), a))?
                    }
                };
                if buckets.len() >= self.per_shard && !buckets.contains_key(key) {
                    self.make_room(&mut buckets, hit.now);
                }
                buckets.insert(key.to_owned(), bucket);
                Ok(answer)
            }
        }
    }

    /// Drops the shard's ended buckets, or one live one if none has ended.
    fn make_room(&self, buckets: &mut HashMap<String, Bucket>, now: i64) {
        let before = buckets.len();
        buckets.retain(|_, bucket| !bucket.expired(now));
        if buckets.len() == before
            && let Some(victim) = buckets.keys().next().cloned()
        {
            buckets.remove(&victim);
            self.counts.evicted.fetch_add(1, Relaxed);
        }
    }
}
