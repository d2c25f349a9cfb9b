#!/usr/bin/env bash
# HTTP acquire throughput and the cost of throttling, against a real server on loopback.
#
#   bash bench/http_throughput.sh [SECONDS] [ROUNDS]
#
# wrk (Debian's package; installed if missing) drives keep-alive connections as fast as the
# server answers (closed loop). Two runs, same load, 1 000 keys:
#   - "limiting":   a token bucket per key, far above what the load reaches (every request
#                   goes through the whole decision, none is refused);
#   - "admit-all":  a policy whose kind override is unlimited (the decision short-circuits).
# For each: requests/s, latency from wrk, and the server's CPU time per request. The two runs
# alternate for ROUNDS rounds (default 3), because these shared machines drift: compare the
# medians.
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-3}
if ! command -v wrk >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
cat >"$bench_dir/acquire.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/acquire",
    nil, string.format('{"policy":"p","key":"tenant-%d","kind":"%s"}', n % 1000, KIND))
end
LUA

run() {
  local label=$1 kind=$2
  start_weir '
[[policy]]
name = "p"
on_exhausted = "reject"
max_keys = 100000
token_bucket = { rate = 1000000000, burst = 1000000000, overrides = { free = 0 } }
'
  sed "s/KIND/$kind/" "$bench_dir/acquire.lua" >"$bench_dir/run.lua"
  local before after
  before=$(cpu_ticks "$WEIR_PID")
  wrk -t2 -c64 -d"${seconds}s" --latency -s "$bench_dir/run.lua" "http://$WEIR_HTTP" >"$bench_dir/wrk.txt"
  after=$(cpu_ticks "$WEIR_PID")
  local rps requests
  rps=$(awk '/Requests\/sec/ {print $2}' "$bench_dir/wrk.txt")
  requests=$(awk '/requests in/ {print $1}' "$bench_dir/wrk.txt")
  local hz; hz=$(getconf CLK_TCK)
  local us_per_req
  us_per_req=$(awk -v t=$((after - before)) -v hz="$hz" -v r="$requests" 'BEGIN {printf "%.2f", t / hz / r * 1e6}')
  local p50 p99
  p50=$(awk '/^ +50%/ {print $2}' "$bench_dir/wrk.txt")
  p99=$(awk '/^ +99%/ {print $2}' "$bench_dir/wrk.txt")
  printf '%-10s %10s req/s   p50 %8s   p99 %8s   server CPU %s µs/request\n' "$label" "$rps" "$p50" "$p99" "$us_per_req"
  stop_weir
}

echo "HTTP POST /v1/acquire, wrk -t2 -c64, ${seconds}s per run, $(nproc) cores, $rounds rounds"
for _ in $(seq 1 "$rounds"); do
  run limiting limited | tee -a "$bench_dir/results"
  run admit-all free | tee -a "$bench_dir/results"
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for label in limiting admit-all; do
  rps=$(awk -v l="$label" '$1 == l {print $2}' "$bench_dir/results" | median)
  cpu=$(awk -v l="$label" '$1 == l {print $(NF-1)}' "$bench_dir/results" | median)
  printf 'median %-10s %10s req/s   %s µs CPU/request\n' "$label" "$rps" "$cpu"
  eval "cpu_${label//-/_}=$cpu"
done
awk -v a="$cpu_limiting" -v b="$cpu_admit_all" 'BEGIN {printf "CPU per request, throttling / admit-all: %.3f\n", a / b}'
