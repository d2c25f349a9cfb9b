#!/usr/bin/env bash
# What a decision costs through Gubernator's HTTP gateway against Weir's own acquire, on one
# server side by side: wrk -t2 -c64 on `POST /v1/GetRateLimits` (one request a call, a token
# bucket far above the load, 1 000 keys) and on `POST /v1/acquire` (a token bucket policy far
# above the load, 1 000 keys), alternating, SECONDS each, ROUNDS rounds. Prints each run, the
# medians and gateway / acquire of the server's CPU a request with the rounds' spread.
#
#   bash bench/gubernator.sh [SECONDS] [ROUNDS]
source "$(dirname "$0")/common.sh"
seconds=${1:-5}
rounds=${2:-5}
need wrk:wrk
start_weir '
[[policy]]
name = "p"
on_exhausted = "reject"
max_keys = 100000
token_bucket = { rate = 1000000000, burst = 1000000000 }
'
cat >"$bench_dir/acquire.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/acquire", nil, string.format('{"policy":"p","key":"tenant-%d"}', n % 1000))
end
LUA
cat >"$bench_dir/gateway.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/GetRateLimits", nil, string.format(
    '{"requests":[{"name":"p","unique_key":"tenant-%d","hits":1,"limit":1000000000,"duration":1000}]}',
    n % 1000))
end
LUA
hz=$(getconf CLK_TCK)
run() {
  local label=$1 before after
  before=$(cpu_ticks "$WEIR_PID")
  wrk -t2 -c64 -d"${seconds}s" -s "$bench_dir/$label.lua" "http://$WEIR_HTTP" >"$bench_dir/wrk.txt"
  after=$(cpu_ticks "$WEIR_PID")
  grep -q "Non-2xx" "$bench_dir/wrk.txt" && { cat "$bench_dir/wrk.txt"; echo "$label: refused" >&2; exit 1; }
  local rps requests cpu
  rps=$(awk '/Requests\/sec/ {print $2}' "$bench_dir/wrk.txt")
  requests=$(awk '/requests in/ {print $1}' "$bench_dir/wrk.txt")
  cpu=$(awk -v t=$((after - before)) -v hz="$hz" -v r="$requests" 'BEGIN {printf "%.2f", t / hz / r * 1e6}')
  printf '%s %s %s\n' "$label" "$rps" "$cpu" | tee -a "$bench_dir/results"
}
echo "label req/s server-CPU-µs/request (wrk -t2 -c64, ${seconds}s, $(nproc) cores)"
for _ in $(seq 1 "$rounds"); do
  run acquire
  run gateway
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for label in acquire gateway; do
  printf 'median %s: %s req/s, %s µs CPU/request\n' "$label" \
    "$(awk -v l=$label '$1 == l {print $2}' "$bench_dir/results" | median)" \
    "$(awk -v l=$label '$1 == l {print $3}' "$bench_dir/results" | median)"
done
sorted=$(paste <(awk '$1 == "acquire"' "$bench_dir/results") <(awk '$1 == "gateway"' "$bench_dir/results") |
  awk '{printf "%.3f\n", $6 / $3}' | sort -n)
printf 'gateway / acquire CPU/request: median %s (range %s – %s)\n' "$(echo "$sorted" | median)" \
  "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)"
stop_weir
