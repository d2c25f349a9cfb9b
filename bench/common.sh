# Shared by the bench scripts: build the release binary (or take WEIR_BENCH_BIN's), start a server on ephemeral loopback
# ports with a given config, and stop it on exit; install missing tools (`need`), find a free
# port (`free_port`, and a UDP one for gossip: `free_udp`), wait for a local cluster to form
# (`wait_members`). Source it; it sets WEIR_HTTP,
# WEIR_GRPC and WEIR_PID; `redis_cell` builds redis-cell, `start_redis` starts a Redis.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Wherever cargo builds (CARGO_TARGET_DIR, a config's build.target-dir), ask it rather than assume.
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
  grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
if [ -n "${WEIR_BENCH_BIN:-}" ]; then
  # A binary given (CI's debug build, to run the scripts' paths and flags): figures from it
  # mean nothing, and no release build is made.
  WEIR_BIN=$WEIR_BENCH_BIN
else
  cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p weir-cli
  WEIR_BIN="$target_dir/release/weir"
fi
bench_dir=$(mktemp -d)
trap 'kill "${WEIR_PID:-}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

# start_weir CONFIG_TEXT [ARGS...]: starts a server (with any extra `weir serve` arguments)
# and waits for its "listening" line; sets WEIR_RESP too when it was given --resp.
start_weir() {
  printf '%s\n' "$1" >"$bench_dir/config.toml"
  shift
  "$WEIR_BIN" serve --config "$bench_dir/config.toml" --data-dir "$bench_dir/data" \
    --http 127.0.0.1:0 --grpc 127.0.0.1:0 --log warn "$@" >"$bench_dir/out" 2>"$bench_dir/err" &
  WEIR_PID=$!
  wait_listening "$bench_dir/out" "$WEIR_PID" || true
  WEIR_HTTP=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/out")
  WEIR_GRPC=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' "$bench_dir/out")
  WEIR_RESP=$(sed -n 's/.* resp=\([^ ]*\).*/\1/p' "$bench_dir/out")
  [ -n "$WEIR_HTTP" ] || { cat "$bench_dir/err"; echo "weir did not start" >&2; exit 1; }
}

# wait_listening FILE [PID]: waits for a server's "listening" line in FILE, up to a minute (CI
# runs two bench lanes at once on a debug build, where a start once took over 10 s, and
# valgrind starts slowly); gives up at once if PID has exited. Fails when no line came.
wait_listening() {
  for _ in $(seq 1 600); do
    grep -q '^listening' "$1" 2>/dev/null && return 0
    [ -z "${2:-}" ] || kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "no server started (see $1)" >&2
  return 1
}

# stop_weir: SIGTERM and wait.
stop_weir() {
  kill -TERM "$WEIR_PID" && wait "$WEIR_PID" || true
}

# cpu_ticks PID: user + system clock ticks the process has used so far.
cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# need COMMAND:PACKAGE...: installs the Debian packages of the commands that are missing (as
# root), or says which to install.
need() {
  missing=()
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" = 0 ] || { echo "please install: ${missing[*]}" >&2; exit 1; }
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
}

# free_port: a loopback TCP port nobody listens on.
free_port() {
  while :; do
    port=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

# free_udp: a loopback UDP port nobody has bound (for a node's gossip).
free_udp() {
  python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_members OUT_FILE...: waits (up to 20 s) until every node whose `weir serve` output is in
# the files given counts them all as members, then 2 s for the last ring rebuild after gossip
# converged.
wait_members() {
  for _ in $(seq 1 200); do
    local ready=0 out http
    for out in "$@"; do
      http=$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$out")
      [ -n "$http" ] && [ "$(curl -s "http://$http/v1/cluster" | jq '[.members[] | select(.state == "alive")] | length' 2>/dev/null)" = "$#" ] &&
        ready=$((ready + 1))
    done
    [ "$ready" = "$#" ] && break
    sleep 0.1
  done
  sleep 2
}

# redis_cell: builds redis-cell 0.2.2 from crates.io as a Redis module, once (cached beside the
# build); sets cell_so to its path, or cell_missing to why it did not build.
redis_cell() {
  cell_so="$target_dir/redis-cell/libredis_cell.so"
  cell_missing=""
  if [ ! -f "$cell_so" ]; then
    fetch="$bench_dir/cell-fetch"
    mkdir -p "$fetch/src"
    printf '[package]\nname = "cell-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nredis-cell = "=0.2.2"\n' \
      >"$fetch/Cargo.toml"
    : >"$fetch/src/lib.rs"
    manifest=$(cargo metadata --format-version 1 --manifest-path "$fetch/Cargo.toml" 2>/dev/null |
      grep -o '"manifest_path":"[^"]*redis-cell-0.2.2/Cargo.toml"' | cut -d'"' -f4 || true)
    if [ -n "$manifest" ] &&
      cargo build --release --quiet --manifest-path "$manifest" \
        --target-dir "$bench_dir/cell-target" 2>"$bench_dir/cell.log"; then
      mkdir -p "$(dirname "$cell_so")"
      # Put in place by a rename, never written over: another script may have built it too
      # and have a Redis running with it loaded (CI runs two lanes at once), and a loaded
      # module overwritten in place crashes that Redis.
      cp "$bench_dir/cell-target/release/libredis_cell.so" "$cell_so.$$"
      mv -f "$cell_so.$$" "$cell_so"
    else
      cell_missing="redis-cell 0.2.2 did not build ($(tail -1 "$bench_dir/cell.log" 2>/dev/null))"
    fi
  fi
}

# start_redis [ARGS...]: a throwaway Redis (no persistence) on a free loopback port, with any
# extra `redis-server` arguments (a module); sets redis_port and redis_pid, stops it and Weir on
# exit, and waits until it answers. The answer must be its own: two scripts at once (CI's two
# lanes) can draw the same free port, and the one whose Redis could not bind would otherwise
# measure the other's — so another port is tried until the process that answers is this one.
start_redis() {
  for _ in 1 2 3 4 5; do
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
      --logfile "$bench_dir/redis.log" "$@" &
    redis_pid=$!
    trap 'kill "${WEIR_PID:-}" "$redis_pid" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT
    for _ in $(seq 1 100); do
      kill -0 "$redis_pid" 2>/dev/null || break
      if [ "$(redis-cli -p "$redis_port" info server 2>/dev/null |
        sed -n 's/^process_id:\([0-9]*\).*/\1/p')" = "$redis_pid" ]; then
        return 0
      fi
      sleep 0.05
    done
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  done
  echo "no Redis of this script's answered (see $bench_dir/redis.log)" >&2
  return 1
}
