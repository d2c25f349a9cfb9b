#!/usr/bin/env bash
# The leaky bucket's acceptance test, in real time against a real server: a leaky-bucket policy of
# 10 tokens per 100 ms (100/s), at most 10, starting empty; one client acquiring with wait, in a
# loop, for 10 s must get 1000 admissions ± 5 %.
#
#   bash bench/leaky_bucket_acceptance.sh
source "$(dirname "$0")/common.sh"
start_weir '
[[policy]]
name = "tenant"
on_exhausted = "wait"
max_wait = "1s"
leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 10, max = 10 }
'
python3 - "$WEIR_HTTP" <<'PY'
import http.client, json, sys, time
host, port = sys.argv[1].rsplit(":", 1)
conn = http.client.HTTPConnection(host, int(port))
body = json.dumps({"policy": "tenant", "key": "tenant-1"})
admitted = 0
start = time.monotonic()
while True:
    conn.request("POST", "/v1/acquire", body, {"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    elapsed = time.monotonic() - start
    if elapsed > 10.0:
        break
    if answer.status == 200:
        admitted += 1
low, high = 950, 1050
verdict = "PASS" if low <= admitted <= high else "FAIL"
print(f"leaky-bucket acceptance: {admitted} admitted in 10 s (expected 1000 ± 5 %: {low}..{high}) {verdict}")
sys.exit(0 if verdict == "PASS" else 1)
PY
stop_weir
