#!/usr/bin/env bash
# The Redis protocol against Redis itself, side by side on one machine in one go:
#
#   1. CL.THROTTLE closed loop with redis-benchmark (50 clients, random keys out of 100 000),
#      unpipelined and pipelined 16 deep: Weir, Redis with the redis-cell module (built here
#      from crates.io), and Redis running redis-cell's decision as a Lua script;
#   2. the same three open loop with `weir bench` at 20 000 requests a second: p50 and p99;
#   3. lease pairs closed loop (take, give back, again) with `weir bench`, 50 clients:
#      Weir's WEIR.ACQUIRE + WEIR.RELEASE against the Redis Lua lease semaphore;
#   4. every front door of one Weir server closed loop, 50 clients, a bucket that never
#      refuses: HTTP, gRPC unary, gRPC stream, WEIR.ACQUIRE and CL.THROTTLE.
#
# Each figure is also the server's own CPU per request (user + system of the server process
# only, from /proc), so the generator's cost does not blur the comparison.
#
#   bash bench/resp.sh [SECONDS] [ROUNDS]
#
# Needs Debian's redis-server (and its redis-benchmark), installed with apt-get when missing
# and root; cargo builds redis-cell. Without a built module, its rows say why and the rest runs.
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-1}
need redis-server:redis-server redis-benchmark:redis-tools

config='
[[policy]]
name = "open"
on_exhausted = "reject"
token_bucket = { rate = 1000000000, burst = 1000000 }

[[policy]]
name = "leases"
on_exhausted = "reject"
concurrency = { node_limit = 1000000, lease_ttl = "30s" }
'
printf '%s\n' "$config" >"$bench_dir/policies.toml"
start_weir "$config" --resp 127.0.0.1:0
[ -n "$WEIR_RESP" ] || { echo "weir did not open its Redis-protocol listener" >&2; exit 1; }

redis_cell

module=()
[ -z "$cell_missing" ] && module=(--loadmodule "$cell_so")
start_redis "${module[@]}"
weir_port=${WEIR_RESP##*:}

# The Lua form of redis-cell's decision: the same script the lua-cell target runs.
lua=$(sed -n '/^const LUA_CELL: &str = r"$/,/^";$/p' "$root/crates/weir-bench/src/targets/resp.rs" |
  sed '1d;$d')
sha=$(redis-cli -p "$redis_port" script load "$lua")

cell_args=(100 1000 1)
per_second=$((seconds > 0 ? seconds : 1))

# cpu PID: the process's CPU time so far, in clock ticks (100 a second).
cpu() { cpu_ticks "$1"; }

# user_sys PID: the process's user and system clock ticks so far.
user_sys() { awk '{print $14, $15}' "/proc/$1/stat"; }

# closed NAME PORT PID PIPELINE COMMAND...: a redis-benchmark run; prints requests/s and the
# server's CPU µs per request, and how much of it was user space and how much the kernel.
closed() {
  local name=$1 port=$2 pid=$3 pipeline=$4
  shift 4
  local n=$((per_second * (pipeline > 1 ? 200000 : 40000)))
  local before after out rps
  before=$(user_sys "$pid")
  out=$(redis-benchmark -p "$port" -c 50 -n "$n" -P "$pipeline" -r 100000 -q "$@" 2>&1 | tr '\r' '\n' | grep "requests per second" | tail -1)
  after=$(user_sys "$pid")
  rps=$(sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' <<<"$out")
  awk -v name="$name" -v p="$pipeline" -v rps="$rps" -v before="$before" -v after="$after" -v n="$n" \
    'BEGIN { split(before, b, " "); split(after, a, " "); user = (a[1] - b[1]) * 10000 / n; sys = (a[2] - b[2]) * 10000 / n;
             printf "| %-23s | %2s | %9.0f | %6.2f | %5.2f | %5.2f |\n", name, p, rps, user + sys, user, sys }'
}

# measured NAME PID LOAD TARGET ARGS...: a weir bench run, 50 clients, open loop at 400/s each
# over 100 000 keys (LOAD `open`: prints p50 and p99 too) or closed loop over 1 000 keys (LOAD
# `closed`); prints requests/s, p50, and the server's CPU µs per request. No warm-up: the
# server's CPU is read around the whole run, so every request it served must be counted.
measured() {
  local name=$1 pid=$2 load=$3
  shift 3
  local before after shape=(--rate 0 --keys 1000) p99=''
  if [ "$load" = open ]; then
    shape=(--rate 400 --keys 100000)
    p99=' \(.latency_ms.p99) ms |'
  fi
  before=$(cpu "$pid")
  "$WEIR_BIN" bench "$@" --clients 50 "${shape[@]}" --duration "${seconds}s" \
    --warmup 0s --json >"$bench_dir/run.json"
  after=$(cpu "$pid")
  jq -r --arg name "$name" --argjson ticks $((after - before)) \
    "\"| \\(\$name) | \\(.rps | floor) | \\(.latency_ms.p50) ms |$p99 \\(((\$ticks * 10000) / .sent * 100 | floor) / 100) |\"" \
    "$bench_dir/run.json"
}

for round in $(seq 1 "$rounds"); do
  echo "## round $round of $rounds, ${seconds}s runs"
  echo
  echo "| CL.THROTTLE closed loop (redis-benchmark, 50 clients) | -P | requests/s | server CPU µs/request | user | system |"
  echo "|---|---:|---:|---:|---:|---:|"
  for pipeline in 1 16; do
    closed "Weir" "$weir_port" "$WEIR_PID" "$pipeline" CL.THROTTLE "user:__rand_int__" "${cell_args[@]}"
    if [ -z "$cell_missing" ]; then
      closed "Redis + redis-cell" "$redis_port" "$redis_pid" "$pipeline" CL.THROTTLE "user:__rand_int__" "${cell_args[@]}"
    fi
    closed "Redis + Lua (same GCRA)" "$redis_port" "$redis_pid" "$pipeline" EVALSHA "$sha" 1 "lua:__rand_int__" "${cell_args[@]}" 1
  done
  [ -n "$cell_missing" ] && echo "(no redis-cell row: $cell_missing)"
  echo
  echo "| CL.THROTTLE open loop, 20 000/s (weir bench) | requests/s | p50 | p99 | server CPU µs/request |"
  echo "|---|---:|---:|---:|---:|"
  measured "Weir" "$WEIR_PID" open --target cl-throttle --server "redis://$WEIR_RESP"
  if [ -z "$cell_missing" ]; then
    measured "Redis + redis-cell" "$redis_pid" open --target cl-throttle --server "redis://127.0.0.1:$redis_port"
  fi
  measured "Redis + Lua (same GCRA)" "$redis_pid" open --target lua-cell --server "redis://127.0.0.1:$redis_port"
  echo
  echo "| lease pairs closed loop (weir bench, 50 clients) | pairs/s | p50 (take) | server CPU µs/pair |"
  echo "|---|---:|---:|---:|"
  measured "Weir WEIR.ACQUIRE + WEIR.RELEASE" "$WEIR_PID" closed --target resp --policy leases --server "redis://$WEIR_RESP"
  measured "Redis Lua lease semaphore" "$redis_pid" closed --target redis --policy leases \
    --config "$bench_dir/policies.toml" --server "redis://127.0.0.1:$redis_port"
  echo
  echo "| Weir's front doors closed loop (weir bench, 50 clients) | decisions/s | p50 | server CPU µs/decision |"
  echo "|---|---:|---:|---:|"
  measured "HTTP" "$WEIR_PID" closed --target http --policy open --server "http://$WEIR_HTTP"
  measured "gRPC unary" "$WEIR_PID" closed --target grpc --policy open --server "http://$WEIR_GRPC"
  measured "gRPC stream" "$WEIR_PID" closed --target grpc-stream --policy open --server "http://$WEIR_GRPC"
  measured "RESP WEIR.ACQUIRE" "$WEIR_PID" closed --target resp --policy open --server "redis://$WEIR_RESP"
  measured "RESP CL.THROTTLE" "$WEIR_PID" closed --target cl-throttle --server "redis://$WEIR_RESP"
  echo
done
