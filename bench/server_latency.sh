#!/usr/bin/env bash
# Open-loop latency of HTTP acquire at a fixed rate, and gRPC streaming throughput, against a
# real server on loopback, both driven by `weir bench`.
#
#   bash bench/server_latency.sh [RATE] [SECONDS]
#
# HTTP: 128 clients share RATE open loop (request k of a client due at start + k / its rate;
# latency from the due time). gRPC: 64 clients as fast as answered, each over its own stream.
# The generator shares the machine's cores with the server, as any loopback benchmark does.
source "$(dirname "$0")/common.sh"
rate=${1:-20000}
seconds=${2:-10}
config='
[[policy]]
name = "p"
on_exhausted = "reject"
token_bucket = { rate = 1000000000, burst = 1000000000 }
'
start_weir "$config"
clients=128
"$WEIR_BIN" bench --target http --server "http://$WEIR_HTTP" --policy p --keys 1000 \
  --clients "$clients" --rate "$(awk -v r="$rate" -v c="$clients" 'BEGIN { print r / c }')" --duration "${seconds}s" 2>/dev/null
"$WEIR_BIN" bench --target grpc-stream --server "http://$WEIR_GRPC" --policy p --keys 1000 \
  --clients 64 --rate 0 --duration "${seconds}s" 2>/dev/null
stop_weir
