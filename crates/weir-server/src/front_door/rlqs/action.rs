//! What an RLQS stream pushes for a bucket: a share of a Weir bucket as the token bucket
//! Envoy's `rate_limit_quota` filter runs, and the stream's own view of a bucket's demand.
//!
//! The filter (Envoy 1.40) reads a token bucket as `tokens_per_fill` over the *whole seconds*
//! of `fill_interval`, refilled continuously, and compares a re-sent bucket with the one it
//! runs by `max_tokens`, `tokens_per_fill` and the interval's nanoseconds only. So the interval
//! is always [`FILL_INTERVAL`] (a change of rate is a change of `tokens_per_fill`), long enough
//! that rounding `tokens_per_fill` down loses under 1/60 of a token a second. It reads an
//! assignment's TTL in whole seconds, and one under a second expires at once.

use std::time::Duration;

use weir_api::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use weir_api::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use weir_cluster::assignment::{SHARES, Whole};

/// The fill interval of every token bucket pushed.
pub const FILL_INTERVAL: Duration = Duration::from_secs(60);

/// The strategy for `shares` of `whole`: a token bucket of that share of its rate and burst,
/// or deny-all with no share (the bucket's rate is all lent elsewhere until the next
/// re-balance).
pub fn strategy_of(shares: u64, whole: Whole) -> RateLimitStrategy {
    let max_tokens = whole.capacity_of(shares);
    let strategy = if shares == 0 || max_tokens == 0 {
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    } else {
        // Tokens per fill interval: rate × share × interval, rounded down so the shares'
        // rates never add up to more than the whole's.
        let per_fill = u128::from(shares) * FILL_INTERVAL.as_nanos()
            / (u128::from(whole.interval.max(1)) * u128::from(SHARES));
        Strategy::TokenBucket(TokenBucket {
            max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
            tokens_per_fill: Some(u32::try_from(per_fill).unwrap_or(u32::MAX)),
            fill_interval: Some(prost_types::Duration {
                seconds: FILL_INTERVAL.as_secs() as i64,
                nanos: 0,
            }),
        })
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

/// A bucket's demand as one stream reports it: requests a second, from the counts of its
/// reports over the time between them as this server saw it (Envoy's own `time_elapsed` is
/// truncated to whole seconds, and 0 on a bucket's first report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Requests a second; `None` until two reports have been seen.
    pub per_second: Option<u64>,
    /// Reports in a row that counted no request.
    pub idle_reports: u32,
}

impl Demand {
    /// Takes a report of `count` requests (allowed and denied) made over `elapsed` since the
    /// last one (`None`: this is the bucket's first).
    pub fn reported(&mut self, count: u64, elapsed: Option<Duration>) {
        self.idle_reports = if count == 0 {
            self.idle_reports.saturating_add(1)
        } else {
            0
        };
        if let Some(elapsed) = elapsed.filter(|e| !e.is_zero()) {
            let per_second = u128::from(count) * 1_000_000_000 / elapsed.as_nanos().max(1);
            self.per_second = Some(u64::try_from(per_second).unwrap_or(u64::MAX));
        }
    }

    /// What to report to the bucket's owner: the measured rate, or, before one is measured,
    /// the whole bucket's rate — a bucket Envoy just started asking for is taken as hot until
    /// its next report (every 5 s) says otherwise, so it starts on a fair share, not a crumb.
    pub fn to_report(self, whole_rate: u64) -> u64 {
        self.per_second.unwrap_or(whole_rate)
    }
}
