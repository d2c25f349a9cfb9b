#!/usr/bin/env bash
# Cluster-scoped rates at saturation: three local nodes joined by gossip, a token bucket that
# never refuses, 64 closed-loop gRPC clients asking the three nodes in turn over 1 000 keys —
# once with the policy per node (`scope = "node"`: every node decides alone) and once
# cluster-scoped (`scope = "cluster"`: two requests in three are decided by another node, the
# bucket's owner). Prints requests a second, p50 and p99, and what each node forwarded.
#
#   bash bench/cluster_rates.sh [SECONDS] [WEIR_BINARY...]
#
# With binaries given (say, two builds to compare), each runs in turn; without, the current
# release build. Everything shares the machine's cores: compare rows of one run.
source "$(dirname "$0")/common.sh"
seconds=${1:-5}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$WEIR_BIN")
need jq:jq curl:curl python3:python3
all_pids=()
trap 'kill "${all_pids[@]}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

# run BINARY SCOPE: one measurement on a fresh 3-node cluster.
run() {
  local bin=$1 scope=$2 dir pids=() seed servers
  dir=$(mktemp -d -p "$bench_dir")
  printf '[[policy]]\nname = "p"\nscope = "%s"\non_exhausted = "reject"\ntoken_bucket = { rate = 1000000000, burst = 1000000000 }\n' \
    "$scope" >"$dir/config.toml"
  seed=127.0.0.1:$(free_udp)
  for i in 1 2 3; do
    local gossip=$seed join=()
    if [ "$i" != 1 ]; then gossip=127.0.0.1:$(free_udp); join=(--join "$seed"); fi
    "$bin" serve --config "$dir/config.toml" --data-dir "$dir/data$i" --http 127.0.0.1:0 \
      --grpc 127.0.0.1:0 --node-id "n$i" --gossip "$gossip" "${join[@]}" --log error \
      >"$dir/out$i" 2>&1 &
    pids+=($!)
    all_pids+=($!)
  done
  wait_members "$dir/out1" "$dir/out2" "$dir/out3"
  servers=$(for i in 1 2 3; do sed -n 's/.* grpc=\([^ ]*\).*/http:\/\/\1/p' "$dir/out$i"; done | paste -sd,)
  "$bin" bench --target grpc --server "$servers" --policy p --rate 0 --clients 64 --keys 1000 \
    --duration "${seconds}s" --warmup 1s --json 2>/dev/null >"$dir/report.json"
  local forwarded=0
  for i in 1 2 3; do
    local http
    http=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$dir/out$i")
    forwarded=$((forwarded + $(curl -s "http://$http/v1/cluster" | jq '.counters.forwarded // 0')))
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  jq -r --arg bin "$(basename "$bin")" --arg scope "$scope" --argjson forwarded "$forwarded" \
    '[$bin, $scope, (.rps|floor), .latency_ms.p50, .latency_ms.p99, .errors, $forwarded] | @tsv' \
    "$dir/report.json" |
    awk -F'\t' '{printf "%-20s %-8s %8d %8.3f %8.3f %7d %10d\n", $1,$2,$3,$4,$5,$6,$7}'
}

printf '%-20s %-8s %8s %8s %8s %7s %10s\n' binary scope rps "p50 ms" "p99 ms" errors forwarded
for bin in "${binaries[@]}"; do
  run "$bin" node
  run "$bin" cluster
done
