#!/usr/bin/env bash
# Rate assignments while demand and membership move: three local nodes, one cluster-scoped token
# bucket (200/s, burst 20) asked as fast as it answers through the nodes that do not own it.
#   0–5 s   all of it through node A;
#   5–10 s  all of it through node B (the shift: how long until B admits at the rate again);
#   10–20 s through A and B at once; at 12 s the bucket's owner leaves (SIGTERM: the bucket and
#           its assignment book move to a new owner); at 16 s a fourth node joins.
# Prints what was admitted in each second against what one bucket admits in a second
# (rate + burst = 220 at most), the busiest 1 s window anywhere, and the shift's follow time
# (from the shift to the first 100 ms in which B admitted at 90 % of the rate or more).
#
#   bash bench/assignment_shift.sh
#
# Everything shares the machine's cores: the figures are of one run; run it several times.
source "$(dirname "$0")/common.sh"
need jq:jq curl:curl python3:python3
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

printf '[[policy]]\nname = "hot"\nscope = "cluster"\non_exhausted = "reject"\ntoken_bucket = { rate = 200, burst = 20 }\n' \
  >"$bench_dir/config.toml"
seed=127.0.0.1:$(free_udp)
start_node() { # start_node N [--join SEED]
  local i=$1 gossip
  shift
  gossip=127.0.0.1:$(free_udp)
  [ "$i" = 1 ] && gossip=$seed
  "$WEIR_BIN" serve --config "$bench_dir/config.toml" --data-dir "$bench_dir/data$i" \
    --http 127.0.0.1:0 --grpc 127.0.0.1:0 --node-id "n$i" --gossip "$gossip" "$@" --log error \
    >"$bench_dir/out$i" 2>&1 &
  pids[$i]=$!
}
http_of() { sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/out$1"; }

start_node 1
start_node 2 --join "$seed"
start_node 3 --join "$seed"
wait_members "$bench_dir/out1" "$bench_dir/out2" "$bench_dir/out3"

# The owner is the node that decides the bucket itself.
owner=
askers=()
for i in 1 2 3; do
  tier=$(curl -s -X POST "http://$(http_of "$i")/v1/acquire" -H 'content-type: application/json' \
    -d '{"policy":"hot","key":"tenant"}' | jq -r .tier)
  if [ "$tier" = node ]; then owner=$i; else askers+=("$i"); fi
done
[ -n "$owner" ] || { echo "no owner found" >&2; exit 1; }
sleep 1 # the three asks above spent part of the burst: let it refill
a=$(http_of "${askers[0]}")
b=$(http_of "${askers[1]}")
echo "owner n$owner; A = n${askers[0]}, B = n${askers[1]}"

python3 - "$a" "$b" "$bench_dir/admitted" <<'EOF' &
import http.client, json, sys, threading, time
a, b, out = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.monotonic()
admitted, lock = [], threading.Lock()
def client(target, start_at, stop_at):
    host, port = target.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    body = json.dumps({"policy": "hot", "key": "tenant"})
    while time.monotonic() - start < start_at:
        time.sleep(0.001)
    while time.monotonic() - start < stop_at:
        try:
            conn.request("POST", "/v1/acquire", body, {"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
        except Exception:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            continue
        if response.status == 200:
            with lock:
                admitted.append((time.monotonic() - start, target == b))
plan = [(a, 0, 5), (b, 5, 10), (a, 10, 20), (b, 10, 20)]
threads = [threading.Thread(target=client, args=p) for p in plan for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
with open(out, "w") as f:
    for t, on_b in sorted(admitted):
        f.write(f"{t:.6f} {int(on_b)}\n")
EOF
load=$!
sleep 12
kill -TERM "${pids[$owner]}"
echo "12 s: n$owner (the owner) stopped"
sleep 4
start_node 4 --join "$seed"
echo "16 s: n4 joins"
wait "$load"

python3 - "$bench_dir/admitted" <<'EOF'
import sys
rows = [line.split() for line in open(sys.argv[1])]
times = [float(t) for t, _ in rows]
on_b = [t for (t, b) in ((float(t), b == "1") for t, b in rows) if b]
rate, burst = 200, 20
print("second  admitted  (one bucket: 200 a second, 220 at most)")
for s in range(20):
    n = sum(1 for t in times if s <= t < s + 1)
    print(f"{s:>6}  {n:>8}")
most, j = 0, 0
for i, t in enumerate(times):
    while times[j] < t - 1.0:
        j += 1
    most = max(most, i - j + 1)
print(f"busiest 1 s window: {most} (bound {rate + burst})")
follow = None
for k in range(50, 100):
    lo, hi = k / 10, (k + 1) / 10
    if sum(1 for t in on_b if lo <= t < hi) >= 0.9 * rate / 10:
        follow = lo - 5.0
        break
print(f"shift followed after: {follow if follow is None else f'{follow * 1000:.0f} ms'}")
EOF
