#!/usr/bin/env bash
# Two builds of weir side by side on the Redis protocol's hot path, alternating, to compare a
# change: `redis-benchmark` sends CL.THROTTLE pipelined 16 deep from 50 clients over 100 000
# random keys, REQUESTS requests a run (default 400 000), ROUNDS rounds of A then B (default 5).
# Prints each run's server CPU per request (user + system of the server process only, from
# /proc, read around the run) and B / A, then the median ratio and the rounds' spread.
#
#   bash bench/resp_ab.sh BIN_A BIN_B [REQUESTS] [ROUNDS]
#
# Builds as for bench/http_ab.sh. Needs Debian's redis-tools (redis-benchmark).
set -euo pipefail
bin_a=$1 bin_b=$2 requests=${3:-400000} rounds=${4:-5}
command -v redis-benchmark >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-tools >/dev/null
work=$(mktemp -d)
pid=
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
hz=$(getconf CLK_TCK)
run() {
  local bin=$1
  rm -rf "$work/data"
  "$bin" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 --resp 127.0.0.1:0 --data-dir "$work/data" \
    --log warn >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q '^listening' "$work/out" && break
    sleep 0.1
  done
  local resp before after
  resp=$(sed -n 's/.* resp=\([^ ]*\).*/\1/p' "$work/out")
  [ -n "$resp" ] || { cat "$work/err" >&2; echo "$bin did not start" >&2; exit 1; }
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  redis-benchmark -p "${resp##*:}" -c 50 -P 16 -n "$requests" -r 100000 -q \
    CL.THROTTLE key:__rand_int__ 100 1000 60 >/dev/null 2>&1
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  awk -v ticks=$((after - before)) -v hz="$hz" -v n="$requests" \
    'BEGIN { printf "%.4f", ticks * 1000000 / hz / n }'
}
ratios=()
for round in $(seq 1 "$rounds"); do
  a=$(run "$bin_a")
  b=$(run "$bin_b")
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", (a > 0 ? b / a : 0) }')
  ratios+=("$ratio")
  echo "round $round: A $a µs CPU/request, B $b µs CPU/request, B / A $ratio"
done
sorted=$(printf '%s\n' "${ratios[@]}" | sort -n)
echo "B / A CPU/request: median $(echo "$sorted" | sed -n "$(((rounds + 1) / 2))p") (range $(echo "$sorted" | head -1) – $(echo "$sorted" | tail -1))"
