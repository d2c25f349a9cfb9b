#!/usr/bin/env bash
# Kept buckets (long quotas that outlive the process), measured from outside a real server:
#
# - loss: a week's fixed window of QUOTA is spent at RATE a second over the Redis protocol
#   (`WEIR.ACQUIRE`, pipelined by redis-py), the server is `kill -9`ed after a random 2–4 s,
#   started again on its data dir, and asked until it refuses. What it admits beyond the
#   quota is what the crash lost: printed as decisions and as time at RATE (the goal: at most
#   `durable_flush`, 1 s, plus one write). Then the same with SIGTERM: nothing may be lost.
#   ROUNDS rounds of each.
# - memory and disk: KEYS keys of a day's quota spent once each, with the buckets kept and
#   without (`durable_after = "100d"`): the server's RSS after, bytes per key, the size of
#   `buckets.redb`, and how long a walk that writes every key takes.
# - decision cost: HTTP acquires (closed loop, `weir bench`) on 100 000 keys of a kept policy
#   and of the same policy not kept, alternating, ROUNDS rounds: decisions a second and server
#   CPU per decision (the background walk's included), as ratios kept / not kept.
#
# PARTS picks some of them (default "loss memory cost").
#
#   bash bench/kept_buckets.sh [ROUNDS] [KEYS] [RATE]
source "$(dirname "$0")/common.sh"
parts=${PARTS:-loss memory cost}
rounds=${1:-3}
keys=${2:-1000000}
rate=${3:-2000}
need python3:python3
python3 -c 'import redis' 2>/dev/null || python3 -m pip install -q --break-system-packages redis

ticks=$(getconf CLK_TCK)

# metric NAME: the value of an unlabelled series in the running server's /metrics.
metric() {
  curl -s "http://$WEIR_HTTP/metrics" | awk -v n="$1" '$1 == n {print $2}'
}

# walked: waits for two walks after now (every decision made so far is then written).
walked() {
  local walks
  walks=$(metric weir_kept_bucket_walks_total)
  for _ in $(seq 1 600); do
    [ "$(metric weir_kept_bucket_walks_total)" -ge $((walks + 2)) ] && return
    sleep 0.1
  done
  echo "no walk within 60 s" >&2
  exit 1
}

loss() {
quota=$((rate * 10))
echo "== loss: a quota of $quota spent at $rate/s, stopped after 2-4 s"
for how in KILL TERM; do
  for round in $(seq 1 "$rounds"); do
    rm -rf "$bench_dir/data"
    start_weir "[[policy]]
name = \"week\"
on_exhausted = \"reject\"
fixed_window = { limit = $quota, window = \"7d\" }" --resp 127.0.0.1:0
    stop_after=$(python3 -c 'import random; print(round(random.uniform(2, 4), 2))')
    WEIR_RESP=$WEIR_RESP RATE=$rate STOP_AFTER=$stop_after python3 - >"$bench_dir/spent" <<'PY' &
import os, time, redis
host, port = os.environ["WEIR_RESP"].rsplit(":", 1)
client = redis.Redis(host=host, port=int(port))
rate, stop_after = int(os.environ["RATE"]), float(os.environ["STOP_AFTER"])
admitted, start, batch = 0, time.monotonic(), max(1, rate // 100)
try:
    while True:
        due = start + admitted / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            pipe.execute_command("WEIR.ACQUIRE", "week", "tenant")
        for reply in pipe.execute():
            admitted += int(reply[1]) if isinstance(reply, list) else 0
        print(admitted, flush=True)
except (redis.ConnectionError, redis.TimeoutError):
    pass
PY
    spender=$!
    sleep "$stop_after"
    kill "-$how" "$WEIR_PID"
    wait "$WEIR_PID" 2>/dev/null || true
    wait "$spender" 2>/dev/null || true
    spent=$(tail -1 "$bench_dir/spent")
    start_weir "$(cat "$bench_dir/config.toml")" --resp 127.0.0.1:0
    left=$(WEIR_RESP=$WEIR_RESP QUOTA=$quota python3 - <<'PY'
import os, redis
host, port = os.environ["WEIR_RESP"].rsplit(":", 1)
client = redis.Redis(host=host, port=int(port))
pipe = client.pipeline(transaction=False)
for _ in range(int(os.environ["QUOTA"]) + 1):
    pipe.execute_command("WEIR.ACQUIRE", "week", "tenant")
print(sum(int(reply[1]) for reply in pipe.execute()))
PY
)
    stop_weir
    over=$((spent + left - quota))
    python3 -c "print(f'$how round $round: stopped after ${stop_after} s, {$spent} admitted before, {$left} after; over the quota: {$over} ({$over / $rate:.2f} s at $rate/s)')"
  done
done
}

memory() {
echo "== memory and disk: $keys keys spent once each"
for kept in yes no; do
  rm -rf "$bench_dir/data"
  after=""
  [ "$kept" = no ] && after='durable_after = "100d"'
  start_weir "[server]
$after
[[policy]]
name = \"day\"
on_exhausted = \"reject\"
max_keys = $((keys + 1000))
token_bucket = { rate = 0.0011574, burst = 100 }" --resp 127.0.0.1:0
  base=$(metric process_resident_memory_bytes)
  WEIR_RESP=$WEIR_RESP KEYS=$keys python3 - <<'PY'
import os, redis
host, port = os.environ["WEIR_RESP"].rsplit(":", 1)
client = redis.Redis(host=host, port=int(port))
keys, step = int(os.environ["KEYS"]), 10000
for first in range(0, keys, step):
    pipe = client.pipeline(transaction=False)
    for key in range(first, min(first + step, keys)):
        pipe.execute_command("WEIR.ACQUIRE", "day", f"tenant-{key}")
    pipe.execute()
PY
  if [ "$kept" = yes ]; then
    walked
    walk=$(metric weir_kept_bucket_last_walk_seconds)
    # The walk that wrote them all was the one before the last (the last found nothing new).
    written=$(metric weir_kept_buckets_written_total)
    disk=$(du -b "$bench_dir/data/buckets.redb" | cut -f1)
  fi
  rss=$(metric process_resident_memory_bytes)
  if [ "$kept" = yes ]; then
    python3 -c "print(f'kept: RSS {$rss/2**20:.0f} MiB ({($rss-$base)/$keys:.0f} B a key over the idle {$base/2**20:.0f} MiB), buckets.redb {$disk/2**20:.0f} MiB ({$disk/$keys:.0f} B a key), {$written} written, last walk (nothing new) {$walk:.3f} s')"
  else
    python3 -c "print(f'not kept: RSS {$rss/2**20:.0f} MiB ({($rss-$base)/$keys:.0f} B a key over the idle {$base/2**20:.0f} MiB)')"
  fi
  stop_weir
done
}

cost() {
echo "== decision cost: HTTP acquires on 100 000 keys, kept vs not kept"
for round in $(seq 1 "$rounds"); do
  for kept in yes no; do
    rm -rf "$bench_dir/data"
    after=""
    [ "$kept" = no ] && after='durable_after = "100d"'
    start_weir "[server]
$after
[[policy]]
name = \"day\"
on_exhausted = \"reject\"
token_bucket = { rate = 1000, burst = 100000000 }"
    before=$(cpu_ticks "$WEIR_PID")
    report=$("$WEIR_BIN" bench --target http --server "http://$WEIR_HTTP" --policy day --keys 100000 \
      --clients 32 --rate 0 --duration 10s --warmup 0s --json 2>/dev/null)
    after_ticks=$(cpu_ticks "$WEIR_PID")
    stop_weir
    REPORT=$report python3 -c "
import json, os
r = json.loads(os.environ['REPORT'])
done = r['sent']
print(f'round $round kept=$kept: {r[\"rps\"]:.0f} decisions/s, {($after_ticks - $before) / $ticks / done * 1e6:.1f} µs server CPU a decision, {r[\"errors\"]} errors')"
  done
done
}

for part in $parts; do "$part"; done
