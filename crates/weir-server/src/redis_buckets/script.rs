//! The decisions Redis makes: one Lua script, loaded once (`EVALSHA`), for every shape Redis
//! keeps — a GCRA bucket (token and leaky buckets, strict spacing) and a calendar-aligned
//! fixed window — over a batch of keys, so that decisions sent together cost one script call,
//! one round trip and, in a Redis Cluster, go to one slot each.
//!
//! Time is Redis's own (`TIME`, in microseconds, read once a batch): every node sharing the
//! Redis decides on one clock, whatever its own says. A bucket is one string, its theoretical
//! arrival time, written with a time to live of when it is whole again (one that is not a
//! number, or later than an empty bucket's, is damaged and read as an empty bucket: a refusal
//! never says to wait longer than the bucket takes to refill); a window is a hash of its
//! number and its count, living until the window ends. Each key's reply is five integers:
//! admitted (1 or 0), what remains, microseconds until the bucket is whole again (the window
//! ends), microseconds until a refused request could go (0 when admitted), and a window's
//! count (past its limit when refused hits count: what a limit sent with an Envoy request is
//! compared with; -1 for a bucket) — or, when a command on that key failed (a key of another
//! type, a write refused under `maxmemory`), that error's message as a string, in its place:
//! one key's failure is not its batch's. (Not an error reply inside the array: the client
//! reads a reply that holds one as the whole call's failure.)

use weir::keyed::Shape;

/// How many of `ARGV` each key takes.
pub(super) const ARGUMENTS_PER_KEY: usize = 5;

/// The script. `KEYS`: the buckets. `ARGV`: five for each key, in order — `g`, interval µs,
/// tolerance µs, cost, a new bucket's debt µs; or `w`, limit, window µs, cost, whether refused
/// hits count (1/0).
pub(super) const SOURCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function gcra(key, interval, tolerance, cost, debt)
  interval, tolerance, cost = tonumber(interval), tonumber(tolerance), tonumber(cost)
  local stored = redis.call('GET', key)
  local tat
  if not stored then tat = now + tonumber(debt) else tat = tonumber(stored) or now + tolerance end
  if tat < now then tat = now end
  if tat > now + tolerance then tat = now + tolerance end
  local new_tat = tat + interval * cost
  local allow_at = new_tat - tolerance
  if allow_at > now then
    local left = math.max(0, math.floor((tolerance - (tat - now)) / interval))
    return {0, left, math.ceil(tat - now), math.ceil(allow_at - now), -1}
  end
  local whole_in = new_tat - now
  redis.call('SET', key, string.format('%.0f', new_tat), 'PX', math.ceil(whole_in / 1000) + 1)
  return {1, math.max(0, math.floor((tolerance - whole_in) / interval)), math.ceil(whole_in), 0, -1}
end
local function window(key, limit, length, cost, count_refused)
  limit, length, cost = tonumber(limit), tonumber(length), tonumber(cost)
  local number = math.floor(now / length)
  local left = (number + 1) * length - now
  local state = redis.call('HMGET', key, 'n', 'c')
  local count = 0
  if tonumber(state[1]) == number then count = tonumber(state[2]) or 0 end
  local admitted = count + cost <= limit
  if admitted or count_refused == '1' then
    count = count + cost
    redis.call('HSET', key, 'n', string.format('%.0f', number), 'c', count)
    redis.call('PEXPIRE', key, math.ceil(left / 1000))
  end
  if admitted then
    return {1, math.max(0, limit - count), math.ceil(left), 0, count}
  end
  return {0, math.max(0, limit - count), math.ceil(left), math.ceil(left), count}
end
local replies = {}
for i = 1, #KEYS do
  local a = (i - 1) * 5
  local decide = gcra
  if ARGV[a + 1] == 'w' then decide = window end
  local ok, reply = pcall(decide, KEYS[i], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
  if ok then
    replies[i] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[i] = reply.err
  else
    replies[i] = tostring(reply)
  end
end
return replies
";

/// A key's [`ARGUMENTS_PER_KEY`] arguments for a bucket of `shape` and a request of `cost`;
/// `None` for a shape Redis does not keep (a policy's checks refuse those).
pub(super) fn arguments(shape: Shape, cost: u64) -> Option<[String; ARGUMENTS_PER_KEY]> {
    let micros = |nanos: u64| (nanos as f64 / 1000.0).to_string();
    match shape {
        Shape::Gcra {
            interval,
            capacity,
            initial,
            fair: _,
        } => Some([
            "g".to_owned(),
            micros(interval),
            micros(interval.saturating_mul(capacity)),
            cost.to_string(),
            micros(interval.saturating_mul(capacity.saturating_sub(initial))),
        ]),
        Shape::Strict { interval } => Some([
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
        } if count.windows_a_hit_counts_in() == 1 => Some([
            "w".to_owned(),
            limit.to_string(),
            micros(window),
            cost.to_string(),
            if count.counts_refused() { "1" } else { "0" }.to_owned(),
        ]),
        Shape::Window { .. } | Shape::Concurrency { .. } => None,
    }
}
