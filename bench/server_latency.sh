#!/usr/bin/env bash
# Open-loop latency of HTTP acquire at a fixed rate, and gRPC streaming throughput, against a
# real server on loopback.
#
#   bash bench/server_latency.sh [RATE] [SECONDS]
#
# The load client (crates/weir-server/examples/load.rs) shares the machine's cores with the
# server, as any loopback benchmark does.
source "$(dirname "$0")/common.sh"
rate=${1:-20000}
seconds=${2:-10}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p weir-server --example load
load="$root/target/release/examples/load"
config='
[[policy]]
name = "p"
on_exhausted = "reject"
token_bucket = { rate = 1000000000, burst = 1000000000 }
'
start_weir "$config"
"$load" http-open-loop "$WEIR_HTTP" "$rate" "$seconds" 128 p
"$load" grpc-stream "$WEIR_GRPC" 1000000 2 p
"$load" grpc-stream "$WEIR_GRPC" 1000000 4 p
stop_weir
