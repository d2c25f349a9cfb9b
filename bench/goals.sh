#!/usr/bin/env bash
# Weir's performance goals in one go, each a ratio taken within one run, printed as the median
# of its rounds and their range:
#
#   1. keyed decisions against governor's keyed limiter at 1, 1 000 and 1 000 000 keys, both
#      timed in alternating blocks in one process (`cargo bench -p weir --bench keyed_pairs`);
#      goal: at most 1.0;
#   2. the HTTP front door's server CPU per request against its framework's floor, each alone
#      (alternating) and both at once (`bench/floor.sh`, without callgrind); gRPC beside it;
#      goal: at most 1.1;
#   3. CL.THROTTLE pipelined 16 deep from 50 redis-benchmark clients over 100 000 keys, the
#      server's CPU per decision against Redis with the redis-cell module, alternating (which
#      goes first swaps every round); goal: at most 0.5.
#
#   bash bench/goals.sh [ROUNDS] [SECONDS]   (defaults 9 5)
#
# Timings only, never a pass or a fail: these shared machines drift by a fifth between runs a
# few seconds apart (docs/benchmarks.md, "Goals, in one go"). With WEIR_BENCH_BIN (CI's debug
# build) every step runs briefly to keep its path working, and its figures mean nothing.
source "$(dirname "$0")/common.sh"
rounds=${1:-9}
seconds=${2:-5}
need redis-server:redis-server redis-benchmark:redis-tools

echo "# 1. keyed decisions, Weir / governor (ratio of ns per decision)"
if [ -n "${WEIR_BENCH_BIN:-}" ]; then
  # The workspace's features, as the tests' build resolved them: `-p weir` alone would build
  # the core's dependencies again with the core's own.
  cargo test --quiet --manifest-path "$root/Cargo.toml" --workspace --bench keyed_pairs -- 1 1000
else
  cargo bench --quiet --manifest-path "$root/Cargo.toml" -p weir --bench keyed_pairs -- \
    $((rounds * 4 + 1)) 1 1000 1000000
fi

echo
echo "# 2. front doors, Weir / floor"
bash "$root/bench/floor.sh" "$seconds" "$rounds" 0 | sed -n '/^weir \/ floor/,$p'

echo
echo "# 3. CL.THROTTLE pipelined, Weir / Redis + redis-cell (server CPU per decision)"
redis_cell
if [ -n "$cell_missing" ]; then
  echo "no figure: $cell_missing"
  exit 0
fi
start_weir '' --resp 127.0.0.1:0
start_redis --loadmodule "$cell_so"
hz=$(getconf CLK_TCK)
# Enough requests for about SECONDS of Weir's load (some 700 000 a second, pipelined).
requests=$((seconds * 700000))
[ -z "${WEIR_BENCH_BIN:-}" ] || requests=20000

# cpu_per_decision PORT PID: µs of the server's CPU per CL.THROTTLE over one run.
cpu_per_decision() {
  local before after
  before=$(cpu_ticks "$2")
  redis-benchmark -p "$1" -c 50 -P 16 -n "$requests" -r 100000 -q \
    CL.THROTTLE user:__rand_int__ 100 1000 1 >/dev/null 2>&1
  after=$(cpu_ticks "$2")
  awk -v t=$((after - before)) -v hz="$hz" -v n="$requests" 'BEGIN { printf "%.4f", t * 1e6 / hz / n }'
}

cpu_per_decision "${WEIR_RESP##*:}" "$WEIR_PID" >/dev/null
cpu_per_decision "$redis_port" "$redis_pid" >/dev/null
ratios=()
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    weir=$(cpu_per_decision "${WEIR_RESP##*:}" "$WEIR_PID")
    cell=$(cpu_per_decision "$redis_port" "$redis_pid")
  else
    cell=$(cpu_per_decision "$redis_port" "$redis_pid")
    weir=$(cpu_per_decision "${WEIR_RESP##*:}" "$WEIR_PID")
  fi
  ratio=$(awk -v a="$weir" -v b="$cell" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
  ratios+=("$ratio")
  echo "round $round: Weir $weir µs, Redis + redis-cell $cell µs, ratio $ratio"
done
sorted=$(printf '%s\n' "${ratios[@]}" | sort -n)
echo "CL.THROTTLE -P 16, Weir / Redis + redis-cell, server CPU per decision:" \
  "median $(echo "$sorted" | sed -n "$(((rounds + 1) / 2))p")" \
  "(range $(echo "$sorted" | head -1)–$(echo "$sorted" | tail -1), $rounds rounds)"
