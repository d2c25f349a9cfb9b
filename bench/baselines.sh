#!/usr/bin/env bash
# Weir beside the ways people limit today, side by side in one go on one machine, every one
# driven by the same open-loop generator (`weir bench`) at the same load:
#
#   - a per-key token bucket (100/s, burst 10) over 10 keys, offered 2× its rate:
#     Weir over HTTP and gRPC, a Redis Lua token bucket, and nginx `limit_req` (burst 9 nodelay,
#     the same 10-request capacity) in front of an upstream that answers 204;
#   - a per-key in-flight limit (10) over 2 keys, leases held an exponential 5 ms:
#     Weir over gRPC, and a Redis Lua semaphore over a sorted set of leases scored by expiry;
#   - the same semaphores closed loop (take a lease, give it back, again), for throughput.
#
#   bash bench/baselines.sh [SECONDS]
#
# Needs Debian's redis-server, nginx and jq (installed with apt-get when missing and root).
# Everything shares the machine's cores with the generator, as any loopback benchmark does.
source "$(dirname "$0")/common.sh"
seconds=${1:-10}

need redis-server:redis-server nginx:nginx-light jq:jq

config='
[[policy]]
name = "bucket"
on_exhausted = "reject"
token_bucket = { rate = 100, burst = 10 }

[[policy]]
name = "leases"
on_exhausted = "reject"
concurrency = { node_limit = 10, lease_ttl = "30s" }
'
printf '%s\n' "$config" >"$bench_dir/policies.toml"
start_weir "$config"

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --logfile "$bench_dir/redis.log" &
redis_pid=$!

nginx_port=$(free_port)
upstream_port=$(free_port)
mkdir -p "$bench_dir/nginx"
cat >"$bench_dir/nginx/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $bench_dir/nginx/nginx.pid;
error_log $bench_dir/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $bench_dir/nginx;
  proxy_temp_path $bench_dir/nginx;
  limit_req_zone \$http_x_weir_key zone=keys:10m rate=100r/s;
  upstream backend { server 127.0.0.1:$upstream_port; keepalive 64; }
  server {
    listen 127.0.0.1:$nginx_port;
    location = /v1/acquire {
      limit_req zone=keys burst=9 nodelay;
      limit_req_status 429;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://backend;
    }
  }
  server {
    listen 127.0.0.1:$upstream_port;
    location / { return 204; }
  }
}
EOF
nginx -p "$bench_dir/nginx" -c "$bench_dir/nginx/nginx.conf" &
nginx_pid=$!
trap 'kill "$WEIR_PID" "$redis_pid" "$nginx_pid" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null &&
    (exec 3<>"/dev/tcp/127.0.0.1/$nginx_port") 2>/dev/null && break
  sleep 0.05
done

# run NAME ARGS...: one weir bench run; prints a row and keeps its JSON.
run() {
  name=$1
  shift
  "$WEIR_BIN" bench --json --duration "${seconds}s" --warmup 1s "$@" 2>/dev/null >"$bench_dir/$name.json"
  jq -r --arg name "$name" --argjson seconds "$seconds" '
    [$name, .target, (.rps|floor), .missed, (.admitted/$seconds|floor), .refused, .errors,
     .latency_ms.p50, .latency_ms.p99, .admitted_per_key.min, .admitted_per_key.max]
    | @tsv' "$bench_dir/$name.json" |
    awk -F'\t' '{printf "%-16s %-6s %7d %7d %9d %9d %6d %8.3f %8.3f %8.1f %8.1f\n", $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11}'
}

header() {
  printf '%-16s %-6s %7s %7s %9s %9s %6s %8s %8s %8s %8s\n' \
    run target rps missed admitted/s refused errors "p50 ms" "p99 ms" "key min" "key max"
}

load=(--clients 8 --rate 250 --keys 10 --policy bucket)
echo "token bucket 100/s + burst 10 per key, 10 keys, offered 2000/s (2× the limit), ${seconds}s each"
header
run weir-http --target http --server "http://$WEIR_HTTP" "${load[@]}"
run weir-grpc --target grpc --server "http://$WEIR_GRPC" "${load[@]}"
run redis-lua --target redis --server "redis://127.0.0.1:$redis_port" --config "$bench_dir/policies.toml" "${load[@]}"
run nginx-limit-req --target http --server "http://127.0.0.1:$nginx_port" "${load[@]}"

echo
load=(--clients 8 --rate 250 --keys 2 --policy leases --hold exp:5ms)
echo "in-flight limit 10 per key, 2 keys, leases held exp(5 ms), offered 2000/s, ${seconds}s each"
header
run weir-grpc-lease --target grpc --server "http://$WEIR_GRPC" "${load[@]}"
run redis-lua-lease --target redis --server "redis://127.0.0.1:$redis_port" --config "$bench_dir/policies.toml" "${load[@]}"

echo
load=(--clients 64 --rate 0 --keys 100 --policy leases)
echo "closed loop: lease taken and given back, as fast as answered (rps = pairs a second), 64 clients, 100 keys"
header
run weir-grpc-pairs --target grpc --server "http://$WEIR_GRPC" "${load[@]}"
run weir-stream-pairs --target grpc-stream --server "http://$WEIR_GRPC" "${load[@]}"
run redis-lua-pairs --target redis --server "redis://127.0.0.1:$redis_port" --config "$bench_dir/policies.toml" "${load[@]}"

echo
ratio() { jq -n --slurpfile a "$bench_dir/$1.json" --slurpfile b "$bench_dir/$2.json" \
  --arg f "$3" '($a[0].latency_ms[$f] / $b[0].latency_ms[$f]) * 100 | floor / 100'; }
echo "latency ratios (baseline / Weir):"
for f in p50 p99; do
  echo "  $f: redis-lua / weir-grpc $(ratio redis-lua weir-grpc $f)," \
    "nginx-limit-req / weir-http $(ratio nginx-limit-req weir-http $f)," \
    "redis-lua-lease / weir-grpc-lease $(ratio redis-lua-lease weir-grpc-lease $f)"
done
echo "exactness: a key may admit at most $((100 * seconds + 10)) in ${seconds}s (rate × time + burst)," \
  "i.e. $(jq -n "(100 * $seconds + 10) / $seconds * 10 | floor / 10") a second"
stop_weir
