#!/usr/bin/env bash
# Weir's front doors against their frameworks' floor, side by side on one machine in one go.
#
# The floor is `weir bench floor`: a bare axum `POST /v1/acquire` that parses Weir's JSON body
# and answers a fixed admission, and a bare tonic service of Weir's gRPC API answering fixed
# admissions — the same frameworks, bodies and messages, with no decision, metrics, timeouts
# or shutdown handling. Three loads, each against Weir (a token bucket per key that never
# refuses, 1 000 keys, every request through the whole decision) and against the floor:
#
#   - http:         wrk -t2 -c64, keep-alive, closed loop (bench/http_throughput.sh's requests);
#   - grpc:         `weir bench --target grpc`, 64 clients, closed loop (unary calls);
#   - grpc-stream:  `weir bench --target grpc-stream`, 64 clients, one request in flight each.
#
# Three measures for each:
#   1. alone: the server's own CPU per request (user + system of the server process, from
#      /proc, read around the whole run), and requests/s; Weir and the floor alternate for
#      ROUNDS rounds on the same load, each round's Weir against the floor run beside it;
#   2. side by side: Weir and the floor served at the same time, each under half the load
#      (wrk -t1 -c32, or 32 clients), their CPU read around the same seconds. These shared
#      machines drift by a fifth between runs a few seconds apart (the floor alone has measured
#      9.9 and 11.9 µs a request in one sitting), and whatever the machine does then lands on
#      both sides of this ratio alike;
#   3. instructions per request under valgrind's callgrind (counters zeroed once the server is
#      up, dumped after CALLGRIND_SECONDS of load): repeatable whatever else the machine does,
#      a diagnostic (CPU time is the goal).
# Each ratio is printed as the median of its rounds and their range.
#
#   bash bench/floor.sh [SECONDS] [ROUNDS] [CALLGRIND_SECONDS]   (defaults 5 5 5; 0 skips 3.)
#
# With BEFORE=PATH (another build's `weir` binary, e.g. of the revision before a change), that
# build runs too, as a third contender in the same rounds: before/after figures from one run.
#
# Needs wrk, valgrind and jq (Debian's packages, installed with apt-get when missing and root).
source "$(dirname "$0")/common.sh"
seconds=${1:-5}
rounds=${2:-5}
cg_seconds=${3:-5}
need wrk:wrk jq:jq
[ "$cg_seconds" = 0 ] || need valgrind:valgrind

config='
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
  return wrk.format(nil, "/v1/acquire",
    nil, string.format('{"policy":"p","key":"tenant-%d","kind":"limited"}', n % 1000))
end
LUA
hz=$(getconf CLK_TCK)
# Whatever is running when the script ends (an error included) is stopped.
trap 'kill "${WEIR_PID:-}" "${FLOOR_PID:-}" "${pid:-}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT
: >"$bench_dir/results"
: >"$bench_dir/cg_results"

# start_floor [WRAPPER...]: starts `weir bench floor` (under WRAPPER, e.g. valgrind) on free
# ports; sets FLOOR_PID, FLOOR_HTTP, FLOOR_GRPC.
start_floor() {
  "$@" "$WEIR_BIN" bench floor --http 127.0.0.1:0 --grpc 127.0.0.1:0 >"$bench_dir/floor.out" \
    2>"$bench_dir/floor.err" &
  FLOOR_PID=$!
  wait_listening "$bench_dir/floor.out"
  FLOOR_HTTP=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/floor.out")
  FLOOR_GRPC=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' "$bench_dir/floor.out")
}

# load KIND HTTP GRPC SECONDS CONNECTIONS [TAG [WRK_THREADS]]: drives one load; prints
# "REQUESTS SECONDS", or fails (saying why in $bench_dir/load.err.TAG) if the load did not run,
# or not every request was answered with an admission. TAG names its files, so that two loads
# can run at once.
load() {
  local kind=$1 http=$2 grpc=$3 secs=$4 conns=$5 tag=${6:-0} threads=${7:-2}
  local err="$bench_dir/load.err.$tag"
  case $kind in
    http)
      wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 30s -s "$bench_dir/acquire.lua" \
        "http://$http" >"$bench_dir/wrk.txt.$tag" 2>"$err" || return 1
      if grep -q 'Non-2xx' "$bench_dir/wrk.txt.$tag"; then
        grep 'Non-2xx' "$bench_dir/wrk.txt.$tag" >"$err"
        return 1
      fi
      awk '/requests in/ {r = $1} /Requests\/sec/ {print r, r / $2}' "$bench_dir/wrk.txt.$tag"
      ;;
    grpc | grpc-stream)
      "$WEIR_BIN" bench --target "$kind" --server "http://$grpc" --policy p --kind limited \
        --keys 1000 --clients "$conns" --rate 0 --warmup 0s --duration "${secs}s" --json \
        >"$bench_dir/bench.json.$tag" 2>"$err" || return 1
      if [ "$(jq '.errors + .refused' "$bench_dir/bench.json.$tag")" != 0 ]; then
        jq -r '"errors \(.errors), refused \(.refused): \(.first_error)"' \
          "$bench_dir/bench.json.$tag" >"$err"
        return 1
      fi
      jq -r '"\(.sent) \(.span)"' "$bench_dir/bench.json.$tag"
      ;;
  esac
}

# measure LABEL KIND PID HTTP GRPC: one run of KIND against a started server; appends
# "KIND LABEL req/s µs-CPU/request" to the results.
measure() {
  local label=$1 kind=$2 pid=$3 http=$4 grpc=$5 before after requests span
  before=$(cpu_ticks "$pid")
  if ! load "$kind" "$http" "$grpc" "$seconds" 64 >"$bench_dir/load.out"; then
    echo "$kind $label: the load failed: $(tail -1 "$bench_dir/load.err.0")" >&2
    return 0
  fi
  read -r requests span <"$bench_dir/load.out"
  after=$(cpu_ticks "$pid")
  awk -v k="$kind" -v l="$label" -v t=$((after - before)) -v hz="$hz" -v r="$requests" -v s="$span" \
    'BEGIN {printf "%-12s %-6s %9.0f req/s  %6.2f µs CPU/request\n", k, l, r / s, t / hz / r * 1e6}' |
    tee -a "$bench_dir/results"
}

# side_by_side KIND: Weir and the floor at once, each under half the load; appends both
# figures, as `measure` does, to the side-by-side results.
side_by_side() {
  local kind=$1 wb fb wa fa wr ws fr fs
  start_weir "$config"
  start_floor
  wb=$(cpu_ticks "$WEIR_PID")
  fb=$(cpu_ticks "$FLOOR_PID")
  load "$kind" "$WEIR_HTTP" "$WEIR_GRPC" "$seconds" 32 weir 1 >"$bench_dir/load.out.weir" &
  local weir_load=$!
  local floor_ok=0 weir_ok=0
  load "$kind" "$FLOOR_HTTP" "$FLOOR_GRPC" "$seconds" 32 floor 1 >"$bench_dir/load.out.floor" || floor_ok=1
  wait "$weir_load" || weir_ok=1
  wa=$(cpu_ticks "$WEIR_PID")
  fa=$(cpu_ticks "$FLOOR_PID")
  stop_weir
  kill "$FLOOR_PID" && wait "$FLOOR_PID" 2>/dev/null || true
  if [ "$weir_ok$floor_ok" != 00 ]; then
    echo "$kind side by side: a load failed: $(tail -qn1 "$bench_dir/load.err.weir" "$bench_dir/load.err.floor")" >&2
    return 0
  fi
  read -r wr ws <"$bench_dir/load.out.weir"
  read -r fr fs <"$bench_dir/load.out.floor"
  awk -v k="$kind" -v hz="$hz" -v wt=$((wa - wb)) -v ft=$((fa - fb)) -v wr="$wr" -v ws="$ws" \
    -v fr="$fr" -v fs="$fs" 'BEGIN {
      printf "%-12s %-6s %9.0f req/s  %6.2f µs CPU/request  (side by side)\n", k, "weir", wr / ws, wt / hz / wr * 1e6
      printf "%-12s %-6s %9.0f req/s  %6.2f µs CPU/request  (side by side)\n", k, "floor", fr / fs, ft / hz / fr * 1e6
    }' | tee -a "$bench_dir/side_results"
}

contenders="weir floor${BEFORE:+ before}"
echo "Front doors against their floor: ${seconds}s per run, $rounds rounds, $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  for kind in http grpc grpc-stream; do
    # Alternate the order, so none always runs on the warmer machine.
    order=$contenders
    [ $((round % 2)) = 1 ] || order=$(echo "$contenders" | tr ' ' '\n' | tac | tr '\n' ' ')
    for who in $order; do
      if [ "$who" = weir ] || [ "$who" = before ]; then
        this_bin=$WEIR_BIN
        [ "$who" = weir ] || WEIR_BIN=$BEFORE
        start_weir "$config"
        WEIR_BIN=$this_bin
        measure "$who" "$kind" "$WEIR_PID" "$WEIR_HTTP" "$WEIR_GRPC"
        stop_weir
      else
        start_floor
        measure floor "$kind" "$FLOOR_PID" "$FLOOR_HTTP" "$FLOOR_GRPC"
        kill "$FLOOR_PID" && wait "$FLOOR_PID" 2>/dev/null || true
      fi
    done
    side_by_side "$kind"
  done
done

# ratios A B FILE TITLE: per kind, A's CPU per request and requests/s over B's, each round's
# pair; the median over the rounds and the range.
ratios() {
  echo
  echo "$1 / $2, $4, median (min–max) over $rounds rounds:"
  for kind in http grpc grpc-stream; do
    awk -v k="$kind" -v a="$1" -v b="$2" '
      function median(v, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      }
      $1 == k && $2 == a {w[++nw] = $5; wr[nw] = $3}
      $1 == k && $2 == b {f[++nf] = $5; fr[nf] = $3}
      END {
        if (nw == 0 || nf == 0) { printf "%-12s no pairs: a run failed\n", k; exit }
        n = 0
        for (i = 1; i <= nw && i <= nf; i++) { n++; x[n] = w[i] / f[i]; y[n] = wr[i] / fr[i] }
        mx = median(x, n); my = median(y, n)
        printf "%-12s server CPU/request %.2f× (%.2f–%.2f)   requests/s %.2f× (%.2f–%.2f)\n", k, mx, x[1], x[n], my, y[1], y[n]
      }' "$3"
  done
}
ratios weir floor "$bench_dir/results" "each alone, alternating"
ratios weir floor "$bench_dir/side_results" "side by side"
[ -z "${BEFORE:-}" ] || {
  ratios before floor "$bench_dir/results" "each alone, alternating"
  ratios weir before "$bench_dir/results" "each alone, alternating"
}

[ "$cg_seconds" = 0 ] && exit 0
echo
echo "Instructions per request under callgrind (${cg_seconds}s of load, 8 connections):"
# callgrind PID: zeroes the counters of the process under callgrind.
cg() { callgrind_control "$@" >/dev/null 2>&1; }
for kind in http grpc grpc-stream; do
  for who in $contenders; do
    out="$bench_dir/callgrind.$kind.$who"
    if [ "$who" != floor ]; then
      bin=$WEIR_BIN
      [ "$who" = weir ] || bin=$BEFORE
      printf '%s\n' "$config" >"$bench_dir/config.toml"
      valgrind --tool=callgrind --callgrind-out-file="$out.%p" \
        "$bin" serve --config "$bench_dir/config.toml" --data-dir "$bench_dir/data" \
        --http 127.0.0.1:0 --grpc 127.0.0.1:0 --log warn \
        >"$bench_dir/cg.out" 2>"$bench_dir/cg.err" &
      pid=$!
      wait_listening "$bench_dir/cg.out"
      http=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/cg.out")
      grpc=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' "$bench_dir/cg.out")
    else
      start_floor valgrind --tool=callgrind --callgrind-out-file="$out.%p"
      pid=$FLOOR_PID http=$FLOOR_HTTP grpc=$FLOOR_GRPC
    fi
    # Warm up a little (a server under valgrind starts slowly), then count only the measured
    # load. A load that fails is reported, and the others go on.
    if load "$kind" "$http" "$grpc" 2 8 >/dev/null && cg -z "$pid" &&
      load "$kind" "$http" "$grpc" "$cg_seconds" 8 >"$bench_dir/cg_load"; then
      read -r requests _ <"$bench_dir/cg_load"
      cg -d "$pid"
    else
      echo "$kind $who: the load failed: $(tail -1 "$bench_dir/load.err.0" 2>/dev/null)" >&2
      kill -TERM "$pid" && wait "$pid" 2>/dev/null || true
      continue
    fi
    kill -TERM "$pid" && wait "$pid" 2>/dev/null || true
    # The dump made on request is the file with a part number; its totals are since zeroing.
    ir=$(grep -h '^summary:\|^totals:' "$out.$pid".[0-9]* 2>/dev/null | awk '{print $2; exit}' || true)
    awk -v k="$kind" -v w="$who" -v ir="$ir" -v r="$requests" \
      'BEGIN {printf "%-12s %-6s %9d requests  %8.0f instructions/request\n", k, w, r, ir / r}' |
      tee -a "$bench_dir/cg_results"
  done
done
echo
for kind in http grpc grpc-stream; do
  awk -v k="$kind" '$1 == k {ir[$2] = $(NF-1)}
    END {
      if (!(ir["weir"] > 0 && ir["floor"] > 0)) { printf "%-12s no figure: a run failed\n", k; exit }
      printf "%-12s instructions/request, weir / floor %.2f×", k, ir["weir"] / ir["floor"]
      if (ir["before"] > 0) printf ", before / floor %.2f×, weir / before %.2f×", ir["before"] / ir["floor"], ir["weir"] / ir["before"]
      printf "\n"
    }' "$bench_dir/cg_results"
done
