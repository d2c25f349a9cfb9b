#!/usr/bin/env bash
# Buckets kept in Redis (`scope = "redis"`) beside Weir's own cluster mode and beside the
# reference Envoy rate limit server's Redis calls, side by side in one run on one machine:
#
# - throughput: 64 closed-loop HTTP clients over 1 000 keys asking three Weir nodes in turn,
#   a bucket that never refuses — three stateless nodes sharing one Redis, then three nodes
#   in cluster mode (`scope = "cluster"`) — and the reference server's shape straight to the
#   same Redis (`INCRBY` + `EXPIRE` pipelined per descriptor, `weir bench --target redis-rls`).
#   The Redis nodes run twice: decisions batched into shared script calls (the default), and
#   each decision its own call (`batch_limit = 1`, as before batching).
#   Requests a second, p50, p99, and CPU a decision: the Weir nodes' together, Redis's.
# - accuracy: 10 keys of 100 a second (burst 10), each offered 200 a second through the three
#   nodes, open loop: admitted over configured, lowest, median and highest key.
# - failover: a Redis Cluster of three masters and three replicas (`cluster-node-timeout`
#   1 s), three Weir nodes on it, 2 000 requests a second over 100 keys; a master killed
#   after 4 s. Counted: requests that failed, admissions `on_unavailable = "open"` made, and
#   how long from the first to the last of them.
#
#   bash bench/redis_store.sh [SECONDS]
#
# Needs Debian's redis-server and jq (installed with apt-get when missing and root).
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
need redis-server:redis-server jq:jq curl:curl python3:python3
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$bench_dir"' EXIT
ticks=$(getconf CLK_TCK)

# redis PORT [ARGS...]: a redis-server on PORT; its PID in $redis_pid.
redis() {
  local port=$1
  shift
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$bench_dir" \
    --logfile "$bench_dir/redis-$port.log" "$@" &
  redis_pid=$!
  pids+=("$redis_pid")
  for _ in $(seq 1 200); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return
    sleep 0.05
  done
  echo "redis-server on $port did not start:" >&2
  tail -5 "$bench_dir/redis-$port.log" >&2
  exit 1
}

# nodes NAME CONFIG [cluster]: three Weir nodes on CONFIG (joined by gossip with `cluster`);
# their HTTP URLs in $servers (comma-separated), their PIDs in $node_pids.
nodes() {
  local name=$1 config=$2 mode=${3:-} seed
  printf '%s\n' "$config" >"$bench_dir/$name.toml"
  seed=127.0.0.1:$(free_udp)
  node_pids=()
  for i in 1 2 3; do
    local args=()
    if [ "$mode" = cluster ]; then
      args=(--node-id "n$i" --gossip "$seed")
      [ "$i" != 1 ] && args=(--node-id "n$i" --gossip "127.0.0.1:$(free_udp)" --join "$seed")
    fi
    "$WEIR_BIN" serve --config "$bench_dir/$name.toml" --data-dir "$bench_dir/$name-data$i" \
      --http 127.0.0.1:0 --grpc 127.0.0.1:0 --log error "${args[@]}" >"$bench_dir/$name-out$i" 2>&1 &
    node_pids+=($!)
    pids+=($!)
  done
  servers=""
  for i in 1 2 3; do
    wait_listening "$bench_dir/$name-out$i"
    local http
    http=http://$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/$name-out$i")
    for _ in $(seq 1 300); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "$http/readyz")" = 200 ] && break
      sleep 0.1
    done
    servers=${servers:+$servers,}$http
  done
  [ "$mode" = cluster ] && sleep 2 # the last ring rebuild after gossip converged
  return 0
}

# ticks_of PID...: their user + system clock ticks together.
ticks_of() {
  local sum=0
  for pid in "$@"; do sum=$((sum + $(cpu_ticks "$pid"))); done
  echo "$sum"
}

# throughput NAME REDIS_PID ARGS...: one row (Weir's CPU from $node_pids, unless none).
throughput() {
  local name=$1 rpid=$2
  shift 2
  local weir_before=0 redis_before
  [ ${#node_pids[@]} -gt 0 ] && weir_before=$(ticks_of "${node_pids[@]}")
  redis_before=$(cpu_ticks "$rpid")
  "$WEIR_BIN" bench --json --duration "${seconds}s" --warmup 1s --clients 64 --rate 0 --keys 1000 \
    "$@" 2>/dev/null >"$bench_dir/$name.json"
  local weir_ticks=0
  [ ${#node_pids[@]} -gt 0 ] && weir_ticks=$(($(ticks_of "${node_pids[@]}") - weir_before))
  local redis_ticks=$(($(cpu_ticks "$rpid") - redis_before))
  jq -r --arg name "$name" --argjson w "$weir_ticks" --argjson r "$redis_ticks" --argjson t "$ticks" '
    [$name, (.rps|floor), .latency_ms.p50, .latency_ms.p99, .errors,
     ($w / $t * 1e6 / (if .sent > 0 then .sent else 1 end)),
     ($r / $t * 1e6 / (if .sent > 0 then .sent else 1 end))] | @tsv' "$bench_dir/$name.json" |
    awk -F'\t' '{printf "%-24s %8d %8.3f %8.3f %7d %12.1f %12.1f\n", $1,$2,$3,$4,$5,$6,$7}'
}

# accuracy NAME ARGS...: admitted over configured across the 10 keys.
accuracy() {
  local name=$1
  shift
  "$WEIR_BIN" bench --json --duration "${seconds}s" --warmup 1s --clients 20 --rate 100 --keys 10 \
    --key-per-client --config "$bench_dir/$name.toml" "$@" 2>/dev/null >"$bench_dir/$name-acc.json"
  jq -r --arg name "$name" '[$name, .against_configured.min, .against_configured.median,
    .against_configured.max, .errors] | @tsv' "$bench_dir/$name-acc.json" |
    awk -F'\t' '{printf "%-24s %8.4f %8.4f %8.4f %7d\n", $1,$2,$3,$4,$5}'
}

policies='
[[policy]]
name = "open"
scope = "SCOPE"
on_exhausted = "reject"
token_bucket = { rate = 1000000000, burst = 1000000000 }

[[policy]]
name = "acc"
scope = "SCOPE"
on_exhausted = "reject"
token_bucket = { rate = 100, burst = 10 }
'

redis_port=$(free_port)
redis "$redis_port"
standalone_pid=$redis_pid

echo "== throughput, ${seconds}s each (CPU a decision: µs of the Weir nodes together, of Redis)"
printf '%-24s %8s %8s %8s %7s %12s %12s\n' run rps "p50 ms" "p99 ms" errors "weir µs/dec" "redis µs/dec"
nodes redis "[redis]
url = \"redis://127.0.0.1:$redis_port\"
${policies//SCOPE/redis}"
redis_servers=$servers
redis_nodes=("${node_pids[@]}")
throughput weir-redis "$standalone_pid" --target http --server "$redis_servers" --policy open
# The same nodes' shape with every decision its own script call (`batch_limit = 1`): what the
# batches save, in the same run.
nodes unbatched "[redis]
url = \"redis://127.0.0.1:$redis_port\"
batch_limit = 1
${policies//SCOPE/redis}"
unbatched_nodes=("${node_pids[@]}")
throughput weir-redis-unbatched "$standalone_pid" --target http --server "$servers" --policy open
kill "${unbatched_nodes[@]}" 2>/dev/null || true
nodes cluster "${policies//SCOPE/cluster}" cluster
cluster_servers=$servers
cluster_nodes=("${node_pids[@]}")
throughput weir-cluster "$standalone_pid" --target http --server "$cluster_servers" --policy open
printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n' \
  >"$bench_dir/rules.yaml"
node_pids=()
throughput reference-incr-expire "$standalone_pid" --target redis-rls \
  --server "redis://127.0.0.1:$redis_port" --rls-config "$bench_dir/rules.yaml" \
  --domain bench --descriptor 'user={key}'

echo
echo "== accuracy: 10 keys of 100/s (burst 10), each offered 200/s through three nodes"
printf '%-24s %8s %8s %8s %7s\n' "nodes' buckets in" min median max errors
accuracy redis --target http --server "$redis_servers" --policy acc
accuracy cluster --target http --server "$cluster_servers" --policy acc
kill "${redis_nodes[@]}" "${cluster_nodes[@]}" 2>/dev/null || true

echo
echo "== failover: a Redis Cluster of 3 masters and 3 replicas, a master killed after 4 s"
# A cluster node listens on its port and on that + 10 000 (the cluster bus): both free, and
# below the kernel's ephemeral ports, so that no connection takes the bus's port meanwhile.
cluster_port() {
  while :; do
    port=$((10000 + RANDOM % 10000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null && continue
    [[ " ${cluster_ports[*]} " == *" $port "* ]] && continue
    echo "$port"
    return
  done
}
cluster_ports=()
cluster_pids=()
for _ in 1 2 3 4 5 6; do
  port=$(cluster_port)
  redis "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
    --cluster-node-timeout 1000
  cluster_ports+=("$port")
  cluster_pids+=("$redis_pid")
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") --cluster-replicas 1 \
  --cluster-yes >/dev/null
for _ in $(seq 1 200); do
  [ "$(redis-cli -p "${cluster_ports[0]}" CLUSTER INFO | grep -c cluster_state:ok)" = 1 ] && break
  sleep 0.1
done
sleep 2 # the replicas' first sync
urls=$(printf '"redis://127.0.0.1:%s",' "${cluster_ports[@]}")
nodes failover "[redis]
cluster = [${urls%,}]
on_unavailable = \"open\"
timeout = \"250ms\"
${policies//SCOPE/redis}"
"$WEIR_BIN" bench --json --duration 12s --warmup 0s --clients 20 --rate 100 --keys 100 \
  --target http --server "$servers" --policy open 2>/dev/null >"$bench_dir/failover.json" &
bench_pid=$!
sleep 4
victim=$(redis-cli -p "${cluster_ports[0]}" CLUSTER NODES | awk '/master/ && !/fail/ {print $2}' |
  head -1 | sed 's/.*:\([0-9]*\)@.*/\1/')
for i in "${!cluster_ports[@]}"; do
  if [ "${cluster_ports[$i]}" = "$victim" ]; then
    kill -9 "${cluster_pids[$i]}"
    wait "${cluster_pids[$i]}" 2>/dev/null || true
  fi
done
killed_at=$(date +%s.%N)
first="" last="" previous=0
while kill -0 "$bench_pid" 2>/dev/null; do
  total=0
  for url in ${servers//,/ }; do
    n=$(curl -s "$url/metrics" | awk '$1 == "weir_redis_decisions_total{outcome=\"fail_open\"}" {print $2}')
    total=$((total + ${n:-0}))
  done
  now=$(date +%s.%N)
  if [ "$total" -gt "$previous" ]; then
    [ -z "$first" ] && first=$now
    last=$now
    previous=$total
  fi
  sleep 0.1
done
wait "$bench_pid" || true
jq -r --arg fo "$previous" --arg first "${first:-$killed_at}" --arg last "${last:-$killed_at}" \
  --arg killed "$killed_at" '
  "requests \(.sent), failed \(.errors), admitted by on_unavailable = open: \($fo), from \((($first|tonumber) - ($killed|tonumber)) * 1000 | floor) ms to \((($last|tonumber) - ($killed|tonumber)) * 1000 | floor) ms after the kill"' \
  "$bench_dir/failover.json"
