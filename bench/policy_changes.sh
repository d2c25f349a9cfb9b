#!/usr/bin/env bash
# Cluster-wide policy changes: NODES local nodes (default 3) joined by gossip, their policy log
# agreed by Raft. Two measurements:
#
# - propagation: CHANGES changes, made in turn through each node (`PUT /v1/policies/p`, a new
#   rate each time); for each, how long the PUT took to be answered (committed by a majority,
#   applied on the node asked) and how long until every node served the new rate (each
#   polled in its own thread, every millisecond). Prints p50, p99 and max of both.
# - conflicting writers: ROUNDS rounds of conditional writers at once, one per node, each
#   `If-Match` the version all of them just read. Checks the history, round by round: exactly one
#   write acknowledged, the others 412, and the version every node serves next is the
#   acknowledged one's (an acknowledged write lost, or two accepted, fails the run).
#
#   bash bench/policy_changes.sh [CHANGES] [ROUNDS] [NODES]
source "$(dirname "$0")/common.sh"
changes=${1:-100}
rounds=${2:-50}
nodes=${3:-3}
need curl:curl python3:python3
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

free_udp() {
  python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

printf '[[policy]]\nname = "p"\non_exhausted = "reject"\ntoken_bucket = { rate = 1, burst = 5 }\n' \
  >"$bench_dir/config.toml"
seed=127.0.0.1:$(free_udp)
for i in $(seq 1 "$nodes"); do
  gossip=$seed join=()
  if [ "$i" != 1 ]; then gossip=127.0.0.1:$(free_udp); join=(--join "$seed"); fi
  "$WEIR_BIN" serve --config "$bench_dir/config.toml" --data-dir "$bench_dir/data$i" \
    --http 127.0.0.1:0 --grpc 127.0.0.1:0 --node-id "n$i" --gossip "$gossip" "${join[@]}" \
    --log error >"$bench_dir/out$i" 2>&1 &
  pids+=($!)
done
urls=()
for i in $(seq 1 "$nodes"); do
  for _ in $(seq 1 300); do
    grep -q '^listening' "$bench_dir/out$i" && break
    sleep 0.1
  done
  urls+=("http://$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/out$i")")
done
for url in "${urls[@]}"; do
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 200 ] && break
    sleep 0.1
  done
done

python3 - "$changes" "$rounds" "${urls[@]}" <<'EOF'
import json, sys, threading, time, urllib.error, urllib.request

changes, rounds, urls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

def put(url, rate, if_match=None):
    body = json.dumps({"on_exhausted": "reject", "token_bucket": {"rate": rate, "burst": 5}})
    request = urllib.request.Request(url + "/v1/policies/p", data=body.encode(), method="PUT",
                                     headers={"content-type": "application/json"})
    if if_match:
        request.add_header("if-match", if_match)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["etag"]
    except urllib.error.HTTPError as error:
        return error.code, None

def get(url):
    with urllib.request.urlopen(url + "/v1/policies/p", timeout=10) as response:
        return json.load(response)["token_bucket"]["rate"], response.headers["etag"]

def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]

acked, everywhere = [], []
for change in range(changes):
    rate = 1000 + change
    seen = [None] * len(urls)
    start = time.perf_counter()
    def watch(i):
        while get(urls[i])[0] != rate:
            time.sleep(0.001)
        seen[i] = time.perf_counter()
    watchers = [threading.Thread(target=watch, args=(i,)) for i in range(len(urls))]
    for w in watchers:
        w.start()
    status, _ = put(urls[change % len(urls)], rate)
    answered = time.perf_counter()
    assert status == 200, f"change {change}: {status}"
    for w in watchers:
        w.join()
    acked.append((answered - start) * 1000)
    everywhere.append((max(seen) - start) * 1000)

print(f"{'changes':<28}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
for name, values in [("answered (committed)", acked),
                     (f"applied on all {len(urls)} nodes", everywhere)]:
    print(f"{name:<28}{pct(values, 50):>10.1f}{pct(values, 99):>10.1f}{max(values):>10.1f}")

wins = {i: 0 for i in range(len(urls))}
for round_ in range(rounds):
    _, tag = get(urls[0])
    results = [None] * len(urls)
    def write(i):
        results[i] = put(urls[i], 5000 + round_ * 10 + i, tag)
    writers = [threading.Thread(target=write, args=(i,)) for i in range(len(urls))]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    ok = [i for i, (status, _) in enumerate(results) if status == 200]
    refused = [i for i, (status, _) in enumerate(results) if status == 412]
    assert len(ok) == 1 and len(refused) == len(urls) - 1, f"round {round_}: {results}"
    winner_tag = results[ok[0]][1]
    wins[ok[0]] += 1
    # The history: every node serves the acknowledged write next (within a heartbeat).
    for url in urls:
        deadline = time.time() + 5
        while get(url)[1] != winner_tag:
            assert time.time() < deadline, f"round {round_}: {url} lost the acknowledged write"
            time.sleep(0.005)
won = "/".join(str(wins[i]) for i in range(len(urls)))
print(f"conflicting writers: {rounds} rounds of {len(urls)}, exactly one acknowledged each "
      f"(won through node 1/…/{len(urls)}: {won}), no acknowledged write lost")
EOF
