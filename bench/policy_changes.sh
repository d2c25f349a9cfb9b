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
# - with FAULTS > 0, that many more rounds of conditional writers while members fail: in turn
#   one member stopped (SIGSTOP) for the round, so its writer's answer may never come (counted
#   unknown, not acknowledged), and one member restarted (SIGTERM, started again on its data
#   dir) before the round. Checked: at most one write acknowledged a round, every member up
#   serves it next, a stopped member serves what the others do once resumed, and a restarted
#   one serves the cluster's version as soon as it is ready.
#
#   bash bench/policy_changes.sh [CHANGES] [ROUNDS] [NODES] [FAULTS]
source "$(dirname "$0")/common.sh"
changes=${1:-100}
rounds=${2:-50}
nodes=${3:-3}
faults=${4:-0}
need curl:curl python3:python3
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

printf '[[policy]]\nname = "p"\non_exhausted = "reject"\ntoken_bucket = { rate = 1, burst = 5 }\n' \
  >"$bench_dir/config.toml"
seed=127.0.0.1:$(free_udp)
gossips=()
for i in $(seq 1 "$nodes"); do
  gossip=$seed join=()
  if [ "$i" != 1 ]; then gossip=127.0.0.1:$(free_udp); join=(--join "$seed"); fi
  gossips+=("$gossip")
  "$WEIR_BIN" serve --config "$bench_dir/config.toml" --data-dir "$bench_dir/data$i" \
    --http 127.0.0.1:0 --grpc 127.0.0.1:0 --node-id "n$i" --gossip "$gossip" "${join[@]}" \
    --log error >"$bench_dir/out$i" 2>&1 &
  pids+=($!)
done
urls=()
for i in $(seq 1 "$nodes"); do
  wait_listening "$bench_dir/out$i"
  urls+=("http://$(sed -n 's/^listening http=\([^ ]*\).*/\1/p' "$bench_dir/out$i")")
done
for url in "${urls[@]}"; do
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 200 ] && break
    sleep 0.1
  done
done

nodes_json=$(for i in $(seq 0 $((nodes - 1))); do
  printf '{"pid": %s, "gossip": "%s", "data": "%s"}\n' "${pids[$i]}" "${gossips[$i]}" "$bench_dir/data$((i + 1))"
done | paste -sd, | sed 's/^/[/; s/$/]/')
WEIR_BIN=$WEIR_BIN BENCH_DIR=$bench_dir SEED=$seed NODES_JSON=$nodes_json \
  python3 - "$changes" "$rounds" "$faults" "${urls[@]}" <<'EOF'
import json, os, signal, subprocess, sys, threading, time, urllib.error, urllib.request

changes, rounds, faults, urls = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
nodes = json.loads(os.environ["NODES_JSON"])
started = []  # members this script started again, stopped at its end

def put(url, rate, if_match=None, timeout=10):
    body = json.dumps({"on_exhausted": "reject", "token_bucket": {"rate": rate, "burst": 5}})
    request = urllib.request.Request(url + "/v1/policies/p", data=body.encode(), method="PUT",
                                     headers={"content-type": "application/json"})
    if if_match:
        request.add_header("if-match", if_match)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers["etag"]
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:
        return None, None  # no answer: the write may or may not have been made

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

def serves(url, tag, within, what):
    """Waits until `url` serves the version `tag` (a function: the version to serve, read
    again at each look)."""
    expected = tag if callable(tag) else (lambda: tag)
    deadline = time.time() + within
    while True:
        try:
            if get(url)[1] == expected():
                return
        except OSError:
            pass
        assert time.time() < deadline, what
        time.sleep(0.01)

def restart(i):
    os.kill(nodes[i]["pid"], signal.SIGTERM)
    while os.path.exists(f"/proc/{nodes[i]['pid']}") and \
            open(f"/proc/{nodes[i]['pid']}/stat").read().split()[2] != "Z":
        time.sleep(0.05)
    args = [os.environ["WEIR_BIN"], "serve", "--config", os.environ["BENCH_DIR"] + "/config.toml",
            "--data-dir", nodes[i]["data"], "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
            "--node-id", f"n{i + 1}", "--gossip", nodes[i]["gossip"], "--log", "error"]
    if i != 0:
        args += ["--join", os.environ["SEED"]]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    started.append(child)
    line = child.stdout.readline()
    assert line.startswith("listening"), line
    threading.Thread(target=child.stdout.read, daemon=True).start()
    nodes[i]["pid"] = child.pid
    urls[i] = "http://" + line.split("http=")[1].split()[0]
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(urls[i] + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert time.time() < deadline, f"n{i + 1} not ready again"
        time.sleep(0.05)

try:
    outcomes = {"acknowledged": 0, "refused": 0, "unknown": 0}
    for round_ in range(faults):
        victim = 1 + round_ % (len(urls) - 1)
        stopped = None
        if round_ % 2 == 1:
            restart(victim)
            # Back: it serves what the others do at once (it caught up before it was ready).
            serves(urls[victim], get(urls[0])[1], 5, f"round {round_}: n{victim + 1} restarted behind")
        else:
            stopped = victim
            os.kill(nodes[victim]["pid"], signal.SIGSTOP)
        up = [i for i in range(len(urls)) if i != stopped]
        _, tag = get(urls[up[0]])
        results = [None] * len(urls)
        def write(i):
            results[i] = put(urls[i], 9000 + round_ * 10 + i, tag, timeout=4)
        writers = [threading.Thread(target=write, args=(i,)) for i in range(len(urls))]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        ok = [i for i, (status, _) in enumerate(results) if status == 200]
        assert len(ok) <= 1, f"fault round {round_}: two acknowledged: {results}"
        outcomes["acknowledged"] += len(ok)
        outcomes["refused"] += sum(1 for status, _ in results if status in (412, 503))
        outcomes["unknown"] += sum(1 for status, _ in results if status is None)
        if ok:
            for i in up:
                serves(urls[i], results[ok[0]][1], 5,
                       f"fault round {round_}: n{i + 1} lost the acknowledged write")
        if stopped is not None:
            os.kill(nodes[stopped]["pid"], signal.SIGCONT)
            # Its writer's request, held while it was stopped, is answered now and may
            # still commit: the others' version is read again at each look.
            serves(urls[stopped], lambda: get(urls[up[0]])[1], 10,
                   f"fault round {round_}: n{stopped + 1} did not catch up once resumed")
    if faults:
        print(f"with faults: {faults} rounds (a member stopped, or restarted, in turn): "
              f"{outcomes['acknowledged']} writes acknowledged, {outcomes['refused']} refused, "
              f"{outcomes['unknown']} unanswered; no round with two, none lost")
finally:
    for child in started:
        child.kill()
EOF
