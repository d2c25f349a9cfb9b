#!/usr/bin/env bash
# Two builds of weir side by side on the same HTTP load, alternating, to compare a change.
#
#   bash bench/http_ab.sh BIN_A BIN_B [SECONDS] [ROUNDS]
#
# Each round runs A then B: wrk -t2 -c64 on POST /v1/acquire over 1 000 keys of a token bucket
# far above the load (every request goes through the whole decision), SECONDS each (default
# 5), ROUNDS rounds (default 5). Prints each run, then per build the median requests/s and
# server CPU per request (from /proc), and B / A for both with the rounds' spread. To build the
# two binaries: `git worktree add ../rev-a REV && cargo build --release --manifest-path
# ../rev-a/Cargo.toml -p weir-cli` (`-p weir-server` for revisions before the binary had a crate of
# its own), and the same for the other revision.
set -euo pipefail
bin_a=$1 bin_b=$2 seconds=${3:-5} rounds=${4:-5}
command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
work=$(mktemp -d)
pid=
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/config.toml" <<'TOML'
[[policy]]
name = "p"
on_exhausted = "reject"
max_keys = 100000
token_bucket = { rate = 1000000000, burst = 1000000000 }
TOML
cat >"$work/acquire.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/acquire", nil, string.format('{"policy":"p","key":"tenant-%d"}', n % 1000))
end
LUA
hz=$(getconf CLK_TCK)
run() {
  local label=$1 bin=$2
  rm -rf "$work/data"
  "$bin" serve --config "$work/config.toml" --data-dir "$work/data" --http 127.0.0.1:0 \
    --grpc 127.0.0.1:0 --log warn >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 1 600); do grep -q '^listening' "$work/out" && break; sleep 0.1; done
  local http; http=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$work/out")
  [ -n "$http" ] || { cat "$work/err"; echo "$label did not start" >&2; exit 1; }
  local before after
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  wrk -t2 -c64 -d"${seconds}s" -s "$work/acquire.lua" "http://$http" >"$work/wrk.txt"
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill -TERM "$pid"; wait "$pid" || true
  local rps requests cpu
  rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.txt")
  requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
  cpu=$(awk -v t=$((after - before)) -v hz="$hz" -v r="$requests" 'BEGIN {printf "%.2f", t / hz / r * 1e6}')
  printf '%s %s %s\n' "$label" "$rps" "$cpu" | tee -a "$work/results"
}
echo "label req/s server-CPU-µs/request (wrk -t2 -c64, ${seconds}s, $(nproc) cores)"
for _ in $(seq 1 "$rounds"); do
  run A "$bin_a"
  run B "$bin_b"
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for label in A B; do
  printf 'median %s: %s req/s, %s µs CPU/request\n' "$label" \
    "$(awk -v l=$label '$1 == l {print $2}' "$work/results" | median)" \
    "$(awk -v l=$label '$1 == l {print $3}' "$work/results" | median)"
done
# B / A per round (A and B of one round ran back to back), then the median and the range.
paste <(awk '$1 == "A"' "$work/results") <(awk '$1 == "B"' "$work/results") |
  awk '{printf "%.3f %.3f\n", $5 / $2, $6 / $3}' >"$work/ratios"
for column in 1 2; do
  name=$([ $column = 1 ] && echo "req/s" || echo "CPU/request")
  sorted=$(awk -v c=$column '{print $c}' "$work/ratios" | sort -n)
  printf 'B / A %s: median %s (range %s – %s)\n' "$name" "$(echo "$sorted" | median)" \
    "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)"
done
