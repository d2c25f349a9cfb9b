#!/usr/bin/env bash
# What the live page costs the server: its CPU with ten `/ui` pages open against none.
#
#   bash bench/ui.sh [SECONDS] [ROUNDS]
#
# One release server on loopback, lightly loaded for the whole run (`weir bench`: 200 acquires a
# second over 100 keys of a rate policy that throttles some of them, and 100 a second of a
# concurrency policy whose leases are held 10 s, about a thousand held at once, so that the
# page's lease counts have leases to count). Each round measures the server's CPU (utime + stime
# from /proc/PID/stat) over SECONDS (default 30) with no page open and over SECONDS with ten
# headless Chromium windows on `/ui` (one browser, opened and settled before its window starts,
# closed after it; windows, not tabs: a background tab is hidden, and the page does not poll
# while hidden), the order alternating from round to round. The page polls once a second; the
# server's own count of `/v1/stats` requests over the window says how many pages really polled.
# ROUNDS (default 3) rounds; the medians and the spread (min–max) are printed.
#
# Then the cost is measured directly, where the noise of the rounds cannot hide it: each
# endpoint the page polls is asked back to back (`wrk`, one connection, 5 s) and the server's
# CPU per answer is printed, with what one page costs a second (each once a second, the
# policies every fifth).
#
# Needs Debian's chromium and chromium-driver and python3's selenium (as .ci/run installs them).
source "$(dirname "$0")/common.sh"
seconds=${1:-30}
rounds=${2:-3}
pages=10
need chromium:chromium chromedriver:chromium-driver wrk:wrk
python3 -c 'import selenium' 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check selenium==4.27.1

start_weir '
[[policy]]
name = "tables"
on_exhausted = "reject"
strict = { qps = 1 }

[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 10, lease_ttl = "30s" }
'
load_for="$((rounds * (2 * seconds + 40) + 60))s"
"$WEIR_BIN" bench --target http --server "http://$WEIR_HTTP" --policy tables --keys 100 \
  --clients 4 --rate 50 --duration "$load_for" --warmup 0s >/dev/null 2>&1 &
load_pid=$!
"$WEIR_BIN" bench --target http --server "http://$WEIR_HTTP" --policy search --keys 100 \
  --clients 4 --rate 25 --hold 10s --duration "$load_for" --warmup 0s >/dev/null 2>&1 &
lease_pid=$!
browser_pid=
# The browser script stops its driver and Chromium on SIGTERM (see its `finally`).
trap 'kill "$load_pid" "$lease_pid" "${browser_pid:-}" "${WEIR_PID:-}" 2>/dev/null || true
  wait "${browser_pid:-}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

# Opens $pages windows on /ui, says "open" when each has read the API twice, and holds them
# until its standard input closes; chromedriver and Chromium are stopped by their ids.
cat >"$bench_dir/pages.py" <<'PY'
import os, shutil, signal, sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
url, pages, profile, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, tests)
from processes import descendants, kill_browser
# SIGTERM unwinds through `finally`, which stops the browser by its ids.
signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))



options = webdriver.ChromeOptions()
options.binary_location = shutil.which("chromium")
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
          "--no-first-run", "--disable-background-networking", "--disable-extensions",
          # Background tabs must not be slowed: every page polls as a visible one would.
          "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
          "--disable-backgrounding-occluded-windows", f"--user-data-dir={profile}",
          "--window-size=1400,900"]:
    options.add_argument(a)
service = Service(executable_path=shutil.which("chromedriver"))
driver = webdriver.Chrome(service=service, options=options)
try:
    for i in range(pages):
        if i:
            driver.switch_to.new_window("window")
        driver.get(url)
    deadline = time.monotonic() + 30
    for handle in driver.window_handles:
        driver.switch_to.window(handle)
        while driver.execute_script("return window.weirUi ? weirUi.generation : 0") < 2:
            assert time.monotonic() < deadline, "the pages did not start polling"
            time.sleep(0.1)
    print("open", flush=True)
    sys.stdin.read()
finally:
    pids = [service.process.pid] + descendants(service.process.pid)
    try:
        driver.quit()
    finally:
        kill_browser(pids)
PY

hz=$(getconf CLK_TCK)
stats_polls() {
  curl -sf "http://$WEIR_HTTP/metrics" |
    awk '/^weir_api_requests_total\{/ && /endpoint="\/v1\/stats"/ {n += $NF} END {print n + 0}'
}
# window LABEL: the server's CPU over $seconds as % of one core, and /v1/stats polls a second.
window() {
  local t0 t1 p0 p1
  t0=$(cpu_ticks "$WEIR_PID")
  p0=$(stats_polls)
  sleep "$seconds"
  t1=$(cpu_ticks "$WEIR_PID")
  p1=$(stats_polls)
  awk -v label="$1" -v t=$((t1 - t0)) -v hz="$hz" -v s="$seconds" -v p=$((p1 - p0)) \
    'BEGIN { printf "%-9s server CPU %6.2f %% of a core   /v1/stats %5.1f a second\n", label, t / hz / s * 100, p / s }'
}

echo "weir serve (release) under ~200 acquires/s; CPU over ${seconds}s windows, $pages pages vs none, $(nproc) cores, $rounds rounds"
sleep 3
# pages_window: opens the pages, measures a window with them, closes them.
pages_window() {
  mkfifo "$bench_dir/hold"
  python3 "$bench_dir/pages.py" "http://$WEIR_HTTP/ui" "$pages" "$bench_dir/profile" \
    "$root/crates/weir-cli/tests" <"$bench_dir/hold" >"$bench_dir/pages.out" &
  browser_pid=$!
  exec 3>"$bench_dir/hold"
  for _ in $(seq 1 600); do
    grep -q '^open' "$bench_dir/pages.out" && break
    kill -0 "$browser_pid" 2>/dev/null || { echo "the browser failed" >&2; exit 1; }
    sleep 0.1
  done
  grep -q '^open' "$bench_dir/pages.out" || { echo "the pages did not open within 60 s" >&2; exit 1; }
  window "$pages pages" | tee -a "$bench_dir/results"
  exec 3>&-
  wait "$browser_pid" || true
  browser_pid=
  rm -rf "$bench_dir/hold" "$bench_dir/profile" "$bench_dir/pages.out"
  sleep 2
}
for round in $(seq 1 "$rounds"); do
  # Alternating, so that a drift of the machine over the run favours neither.
  if [ $((round % 2)) = 1 ]; then
    window "no pages" | tee -a "$bench_dir/results"
    pages_window
  else
    pages_window
    window "no pages" | tee -a "$bench_dir/results"
  fi
done
summary() {
  grep "^$1 " "$bench_dir/results" | awk '{print $5}' | sort -n |
    awk -v label="$1" '{v[NR] = $1} END {printf "%-9s median %6.2f %% of a core, spread %.2f–%.2f\n", label, v[int((NR + 1) / 2)], v[1], v[NR]}'
}
echo "---"
summary "no"
summary "$pages"

# The cost per answer of each endpoint the page polls, asked back to back.
echo "---"
per_page=0
for path in /v1/stats "/v1/throttles?limit=100" /v1/cluster /v1/policies; do
  t0=$(cpu_ticks "$WEIR_PID")
  answered=$(wrk -t1 -c1 -d5s "http://$WEIR_HTTP$path" | awk '/requests in/ {print $1}')
  t1=$(cpu_ticks "$WEIR_PID")
  us=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v n="$answered" 'BEGIN { printf "%.1f", t / hz / n * 1e6 }')
  # The configs are read every fifth second.
  share=1
  [ "$path" = /v1/policies ] && share=0.2
  per_page=$(awk -v a="$per_page" -v us="$us" -v s="$share" 'BEGIN { printf "%.1f", a + us * s }')
  printf '%-24s %8s µs of server CPU an answer (%s answers)\n' "$path" "$us" "$answered"
done
awk -v us="$per_page" -v p="$pages" 'BEGIN { printf "one page: %.1f µs of CPU a second (%.4f %% of a core); %d pages: %.3f %% of a core\n", us, us / 1e4, p, p * us / 1e4 }'
