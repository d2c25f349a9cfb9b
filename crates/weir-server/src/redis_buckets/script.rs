//! The decision Redis makes: one Lua script, loaded once (`EVALSHA`), for every shape Redis
//! keeps — a GCRA bucket (token and leaky buckets, strict spacing) and a calendar-aligned
//! fixed window — on one key, so a decision is one round trip and, in a Redis Cluster, one
//! slot.
//!
//! Time is Redis's own (`TIME`, in microseconds): every node sharing the Redis decides on one
//! clock, whatever its own says. A bucket is one string, its theoretical arrival time, written
//! with a time to live of when it is whole again (one that is not a number, or later than an
//! empty bucket's, is damaged and read as an empty bucket: a refusal never says to wait longer
//! than the bucket takes to refill); a window is a hash of its number and its
//! count, living until the window ends. The reply is five integers: admitted (1 or 0), what
//! remains, microseconds until the bucket is whole again (the window ends), microseconds
//! until a refused request could go (0 when admitted), and a window's count (past its limit
//! when refused hits count: what a limit sent with an Envoy request is compared with; -1 for
//! a bucket).

use weir::keyed::Shape;

/// The script. `KEYS[1]`: the bucket. `ARGV`: `g`, interval µs, tolerance µs, cost, a new
/// bucket's debt µs — or `w`, limit, window µs, cost, whether refused hits count (1/0).
pub(super) const SOURCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == 'g' then
  local interval, tolerance, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local stored = redis.call('GET', KEYS[1])
  local tat
  if not stored then tat = now + tonumber(ARGV[5]) else tat = tonumber(stored) or now + tolerance end
  if tat < now then tat = now end
  if tat > now + tolerance then tat = now + tolerance end
  local new_tat = tat + interval * cost
  local allow_at = new_tat - tolerance
  if allow_at > now then
    local left = math.max(0, math.floor((tolerance - (tat - now)) / interval))
    return {0, left, math.ceil(tat - now), math.ceil(allow_at - now), -1}
  end
  local whole_in = new_tat - now
  redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil(whole_in / 1000) + 1)
  return {1, math.max(0, math.floor((tolerance - whole_in) / interval)), math.ceil(whole_in), 0, -1}
end
local limit, length, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local number = math.floor(now / length)
local left = (number + 1) * length - now
local state = redis.call('HMGET', KEYS[1], 'n', 'c')
local count = 0
if tonumber(state[1]) == number then count = tonumber(state[2]) or 0 end
local admitted = count + cost <= limit
if admitted or ARGV[5] == '1' then
  count = count + cost
  redis.call('HSET', KEYS[1], 'n', string.format('%.0f', number), 'c', count)
  redis.call('PEXPIRE', KEYS[1], math.ceil(left / 1000))
end
if admitted then
  return {1, math.max(0, limit - count), math.ceil(left), 0, count}
end
return {0, math.max(0, limit - count), math.ceil(left), math.ceil(left), count}
";

/// The script's arguments after `KEYS[1]` for a bucket of `shape` and a request of `cost`;
/// `None` for a shape Redis does not keep (a policy's checks refuse those).
pub(super) fn arguments(shape: Shape, cost: u64) -> Option<Vec<String>> {
    let micros = |nanos: u64| (nanos as f64 / 1000.0).to_string();
    match shape {
        Shape::Gcra {
            interval,
            capacity,
            initial,
            fair: _,
        } => Some(vec![
            "g".to_owned(),
            micros(interval),
            micros(interval.saturating_mul(capacity)),
            cost.to_string(),
            micros(interval.saturating_mul(capacity.saturating_sub(initial))),
        ]),
        Shape::Strict { interval } => Some(vec![
            "g".to_owned(),
            micros(interval),
            micros(interval),
            cost.to_string(),
            "0".to_owned(),
        ]),
        Shape::Window {
            count,
            window,
            limit,
        } if count.windows_a_hit_counts_in() == 1 => Some(vec![
            "w".to_owned(),
            limit.to_string(),
            micros(window),
            cost.to_string(),
            if count.counts_refused() { "1" } else { "0" }.to_owned(),
        ]),
        Shape::Window { .. } | Shape::Concurrency { .. } => None,
    }
}
