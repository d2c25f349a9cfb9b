#!/usr/bin/env bash
# What the live page costs the server: its CPU with ten `/ui` pages open against none.
#
#   bash bench/ui.sh [SECONDS] [ROUNDS]
#
# One release server on loopback, lightly loaded (`weir bench`, 200 acquires a second over 100
# keys of a policy that throttles some of them, for the whole run). Each round measures the
# server's CPU (utime + stime from /proc/PID/stat) over SECONDS (default 30) with no page open,
# then over SECONDS with ten headless Chromium windows on `/ui` (one browser, opened and settled
# before the window starts, closed after it; windows, not tabs: a background tab is hidden, and
# the page does not poll while hidden). The page polls once a second; the server's own
# count of `/v1/stats` requests over the window says how many pages really polled. ROUNDS
# (default 3) rounds; the medians and the spread (min–max) are printed.
#
# Needs Debian's chromium and chromium-driver and python3's selenium (as .ci/run installs them).
source "$(dirname "$0")/common.sh"
seconds=${1:-30}
rounds=${2:-3}
pages=10
need chromium:chromium chromedriver:chromium-driver
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
concurrency = { node_limit = 10 }
'
"$WEIR_BIN" bench --target http --server "http://$WEIR_HTTP" --policy tables --keys 100 \
  --clients 4 --rate 50 --duration "$((rounds * (2 * seconds + 20) + 30))s" --warmup 0s \
  >/dev/null 2>&1 &
load_pid=$!
browser_pid=
trap 'kill "$load_pid" "${browser_pid:-}" "${WEIR_PID:-}" 2>/dev/null || true; rm -rf "$bench_dir"' EXIT

# Opens $pages windows on /ui, says "open" when each has read the API twice, and holds them
# until its standard input closes; chromedriver and Chromium are stopped by their ids.
cat >"$bench_dir/pages.py" <<'PY'
import os, shutil, signal, sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
url, pages, profile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
    pid = service.process.pid
    driver.quit()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
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
for _ in $(seq 1 "$rounds"); do
  window "no pages" | tee -a "$bench_dir/results"
  mkfifo "$bench_dir/hold"
  python3 "$bench_dir/pages.py" "http://$WEIR_HTTP/ui" "$pages" "$bench_dir/profile" \
    <"$bench_dir/hold" >"$bench_dir/pages.out" &
  browser_pid=$!
  exec 3>"$bench_dir/hold"
  for _ in $(seq 1 600); do
    grep -q '^open' "$bench_dir/pages.out" && break
    kill -0 "$browser_pid" 2>/dev/null || { echo "the browser failed" >&2; exit 1; }
    sleep 0.1
  done
  window "$pages pages" | tee -a "$bench_dir/results"
  exec 3>&-
  wait "$browser_pid" || true
  browser_pid=
  rm -rf "$bench_dir/hold" "$bench_dir/profile"
  sleep 2
done
summary() {
  grep "^$1 " "$bench_dir/results" | awk '{print $5}' | sort -n |
    awk -v label="$1" '{v[NR] = $1} END {printf "%-9s median %6.2f %% of a core, spread %.2f–%.2f\n", label, v[int((NR + 1) / 2)], v[1], v[NR]}'
}
echo "---"
summary "no"
summary "$pages"
