#!/usr/bin/env bash
# What TLS and traces cost the server, on HTTP POST /v1/acquire on loopback.
#
#   bash bench/tls.sh [SECONDS] [ROUNDS]
#
# wrk -t2 -c64, closed loop, 1 000 keys of a token bucket that never refuses (every request
# through the whole decision), against one release build in five setups, alternating for ROUNDS
# rounds (default 3) of SECONDS each (default 5):
#   - plain:          HTTP, kept-alive connections;
#   - tls:            HTTPS (a P-256 certificate openssl makes), kept-alive: the cost of
#                     encrypting;
#   - plain-new:      HTTP, a new connection per request (`Connection: close`);
#   - tls-new:        HTTPS, a new connection, so a handshake, per request;
#   - traced:         HTTP, kept-alive, with --otlp-endpoint to a collector on loopback that
#                     takes every batch (a small Python OTLP/HTTP sink): a span per admission;
#   - traced-1%:      the same, sampling 1 % of them (OTEL_TRACES_SAMPLER=traceidratio,
#                     OTEL_TRACES_SAMPLER_ARG=0.01).
# Printed: requests/s and the server's CPU per request (user + system from /proc), the medians
# over the rounds and each setup against plain.
#
# Needs wrk, openssl and python3.
source "$(dirname "$0")/common.sh"
seconds=${1:-5}
rounds=${2:-3}
need wrk:wrk openssl:openssl

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=weir \
  -addext "subjectAltName=IP:127.0.0.1" -keyout "$bench_dir/tls.key" -out "$bench_dir/tls.crt" \
  2>/dev/null

# A collector that takes every batch and answers an empty protobuf.
sink_port=$(free_port)
python3 - "$sink_port" >/dev/null 2>&1 <<'PY' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
sink_pid=$!
trap 'kill "$sink_pid" "${WEIR_PID:-}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

cat >"$bench_dir/acquire.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if os.getenv("NEW_CONNECTIONS") == "1" then
  wrk.headers["Connection"] = "close"
end
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/acquire", nil,
    string.format('{"policy":"p","key":"tenant-%d"}', n % 1000))
end
LUA
config='
[[policy]]
name = "p"
on_exhausted = "reject"
max_keys = 100000
token_bucket = { rate = 1000000000, burst = 1000000000 }
'
hz=$(getconf CLK_TCK)

run() {
  local label=$1 scheme=http new=0
  local args=()
  case "$label" in
  tls | tls-new) scheme=https args=(--tls-cert "$bench_dir/tls.crt" --tls-key "$bench_dir/tls.key") ;;
  traced*) args=(--otlp-endpoint "http://127.0.0.1:$sink_port") ;;
  esac
  local sampler=always_on
  [ "$label" = traced-1% ] && sampler=traceidratio
  case "$label" in *-new) new=1 ;; esac
  OTEL_TRACES_SAMPLER=$sampler OTEL_TRACES_SAMPLER_ARG=0.01 start_weir "$config" "${args[@]}"
  local before after
  before=$(cpu_ticks "$WEIR_PID")
  NEW_CONNECTIONS=$new wrk -t2 -c64 -d"${seconds}s" -s "$bench_dir/acquire.lua" \
    "$scheme://$WEIR_HTTP" >"$bench_dir/wrk.txt"
  after=$(cpu_ticks "$WEIR_PID")
  stop_weir
  awk -v label="$label" -v t=$((after - before)) -v hz="$hz" '
    /Requests\/sec/ {rps = $2} /requests in/ {n = $1}
    /Non-2xx/ {bad = $NF}
    END {printf "%-10s %10.0f req/s   %7.2f µs CPU/request%s\n", label, rps, t / hz / n * 1e6,
      bad ? "   (" bad " not 2xx!)" : ""}' "$bench_dir/wrk.txt"
}

setups="plain tls plain-new tls-new traced traced-1%"
echo "HTTP POST /v1/acquire, wrk -t2 -c64, ${seconds}s per run, $(nproc) cores, $rounds rounds"
for round in $(seq 1 "$rounds"); do
  # Rotated each round, so that no setup always runs first.
  order=$(echo $setups | tr ' ' '\n' | awk -v r="$round" '{a[NR] = $0} END {for (i = 0; i < NR; i++) print a[(i + r - 1) % NR + 1]}')
  for label in $order; do
    run "$label" | tee -a "$bench_dir/results"
  done
done
echo "---"
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
plain_cpu=$(awk '$1 == "plain" {print $(NF-2)}' "$bench_dir/results" | median)
plain_new_cpu=$(awk '$1 == "plain-new" {print $(NF-2)}' "$bench_dir/results" | median)
for label in $setups; do
  rps=$(awk -v l="$label" '$1 == l {print $2}' "$bench_dir/results" | median)
  cpu=$(awk -v l="$label" '$1 == l {print $(NF-2)}' "$bench_dir/results" | median)
  spread=$(awk -v l="$label" '$1 == l {print $(NF-2)}' "$bench_dir/results" | sort -n |
    awk '{v[NR] = $1} END {printf "%s–%s", v[1], v[NR]}')
  base=$plain_cpu
  [ "$label" = tls-new ] && base=$plain_new_cpu
  awk -v l="$label" -v r="$rps" -v c="$cpu" -v s="$spread" -v b="$base" \
    'BEGIN {printf "median %-10s %8s req/s   %6s µs CPU/request (spread %s)   %.2f× its plain\n", l, r, c, s, c / b}'
done
