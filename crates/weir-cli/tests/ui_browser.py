"""Drives Weir's live page in headless Chromium (for crates/weir-cli/tests/ui.rs).

Usage: ui_browser.py BASE_URL ADMIN_TOKEN SCREENSHOT_DIR READ_ONLY_URL

BASE_URL is a loopback `http://127.0.0.1:PORT` of a `weir serve` that the caller keeps under
load: key `hot` of policy `tables` throttled, policy `getpage` asked thousands of times a
second. READ_ONLY_URL is one with no admin token. Prints `ok <check>` per check passed and
exits 0, or raises. Chromium and chromedriver are stopped by their process ids before it
exits, also when it is stopped with SIGTERM.
"""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser import Browser, until

BASE, TOKEN, SHOTS, READ_ONLY = sys.argv[1:5]
assert BASE.startswith("http://127.0.0.1:") and READ_ONLY.startswith("http://127.0.0.1:"), \
    "loopback only"
# SIGTERM (the caller's time bound) unwinds through the `finally` below, which stops the
# browser; its default action would leave Chromium running.
signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))


def api(method, path, body=None, headers=None):
    """One API call; returns (status, headers, parsed body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method, headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read() or b"null")


# Every chart's layout as boxes, in CSS px of the viewport: uPlot's canvas and root, the
# chart's container, the legend's rows, and each axis' box (its `.u-axis` element: where uPlot
# placed it) with the boxes of its tick labels as uPlot draws them: the strings it chose, each
# line's width measured with the canvas' `measureText` in the axis' own font. A y axis on the
# left draws a label right-aligned at its tick's length and gap from the plot; an x axis
# centres a label on its tick, one line under the other, from its tick's length and gap down.
LAYOUT = """
const ruler = document.createElement("canvas").getContext("2d");
const box = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
const charts = [...weirUi.charts];
if (weirUi.clusterChart) charts.push(["cluster", weirUi.clusterChart]);
return {
  viewport: document.documentElement.clientWidth,
  pageWidth: document.documentElement.scrollWidth,
  charts: charts.map(([name, u]) => {
    const over = u.over.getBoundingClientRect();
    return {
      name,
      canvas: box(u.ctx.canvas.getBoundingClientRect()),
      root: box(u.root.getBoundingClientRect()),
      container: box(u.root.parentElement.getBoundingClientRect()),
      legend: [...u.root.querySelectorAll(".u-legend tr")].map((tr) =>
        ({text: tr.textContent.trim(), ...box(tr.getBoundingClientRect())})),
      axes: u.axes.filter((a) => a._show && a._el && a._values).map((a) => {
        ruler.font = a.font[0];
        const scale = uPlot.pxRatio;
        const vertical = a.side % 2 === 1;
        const axisBox = box(a._el.getBoundingClientRect());
        const offset = (a.ticks.show ? a.ticks.size : 0) + a.gap;
        const size = a.font[1] / scale, lineHeight = size * a.lineGap;
        const labels = [];
        a._values.forEach((value, i) => {
          if (value == null || value === "") return;
          const at = u.valToPos(a._splits[i], a.scale);
          String(value).split("\\n").forEach((line, j) => {
            const width = ruler.measureText(line).width / scale;
            if (vertical) {
              const right = axisBox.right - offset, middle = over.top + at;
              labels.push({text: line, width, left: right - width, right,
                           top: middle - size / 2, bottom: middle + size / 2});
            } else {
              const centre = over.left + at, top = axisBox.top + offset + j * lineHeight;
              labels.push({text: line, width, left: centre - width / 2,
                           right: centre + width / 2, top, bottom: top + size});
            }
          });
        });
        return {side: a.side, size: a._size, offset, box: axisBox, labels};
      }),
    };
  }),
};"""


def inside(inner, outer, sides=("left", "right", "top", "bottom"), slack=0.5):
    """Whether box `inner` lies within box `outer` (on `sides`), to half a pixel."""
    return all(inner[s] >= outer[s] - slack if s in ("left", "top")
               else inner[s] <= outer[s] + slack for s in sides)


def check_layout(width):
    """Asserts every chart's tick labels fit their axis' box and the chart's canvas, that the
    charts and their legends fit the page's width, and that the page does not scroll sideways.
    Returns the layout read and the widest y label: (chart, text, width, room for it)."""
    layout = js(LAYOUT)
    viewport = layout["viewport"]
    problems, widest = [], None
    assert layout["pageWidth"] <= viewport, \
        f"at {width} px the page scrolls sideways: {layout['pageWidth']} px wide in {viewport}"
    for chart in layout["charts"]:
        name = chart["name"]
        for what in ("canvas", "root"):
            if not inside(chart[what], {"left": 0, "right": viewport}, ("left", "right")):
                problems.append(f"{name}: its {what} {chart[what]} is out of the page's {viewport} px")
        if not inside(chart["root"], chart["container"], ("left", "right")):
            problems.append(f"{name}: the chart {chart['root']} overflows its box {chart['container']}")
        for row in chart["legend"]:
            if not inside(row, {"left": 0, "right": viewport}, ("left", "right")) or \
                    not inside(row, chart["root"], ("left", "right")):
                problems.append(f"{name}: legend {row['text']!r} {row} overflows")
        for axis in chart["axes"]:
            vertical = axis["side"] % 2 == 1
            for label in axis["labels"]:
                if vertical and (widest is None or label["width"] > widest[2]):
                    widest = (name, label["text"], label["width"], axis["box"]["right"]
                              - axis["box"]["left"] - axis["offset"])
                # A y label within its axis' box across; an x label below the plot within it.
                where = ("left", "right") if vertical else ("top", "bottom")
                if not inside(label, axis["box"], where):
                    problems.append(f"{name}: {'y' if vertical else 'x'} label {label['text']!r} "
                                    f"({label['width']:.1f} px) {label} is out of its axis' box "
                                    f"{axis['box']} (size {axis['size']}, ticks and gap "
                                    f"{axis['offset']})")
                if not inside(label, chart["canvas"]):
                    problems.append(f"{name}: {'y' if vertical else 'x'} label {label['text']!r} "
                                    f"{label} is cut by the canvas {chart['canvas']}")
    assert not problems, f"at {width} px:\n" + "\n".join(problems)
    return layout, widest


def throttle_row(policy, key):
    _, _, body = api("GET", "/v1/throttles?limit=100")
    rows = [r for r in body["rows"] if r["policy"] == policy and r["key"] == key]
    assert rows, f"{policy}/{key} is not in /v1/throttles: {body}"
    return rows[0]


browser = Browser(logs=True)
driver = browser.driver
try:
    js = driver.execute_script

    # The throttled key shows in the table within 3 s of opening the page.
    opened = time.monotonic()
    driver.get(BASE + "/ui")
    row_css = 'tr[data-policy="tables"][data-key="hot"]'
    until("the throttled key in the table", lambda: driver.find_elements(By.CSS_SELECTOR, row_css), 3)
    print(f"ok throttled key shown after {time.monotonic() - opened:.2f} s", flush=True)

    # A key with a right-to-left override is shown with the override escaped, not obeyed, and
    # the cell is isolated from its neighbours.
    spoof = "invoice\u202egnp.exe"
    shown_key = until("the spoofing key in the table", lambda: js("""
        const row = [...document.querySelectorAll('tr[data-policy="tables"]')]
            .find(r => r.dataset.key === arguments[0]);
        return row && {text: row.querySelector('td.key').textContent,
                       bidi: getComputedStyle(row.querySelector('td.key')).unicodeBidi};""", spoof), 5)
    assert shown_key["text"] == "invoice\\u{202e}gnp.exe", shown_key
    assert "\u202e" not in shown_key["text"] and shown_key["bidi"] == "isolate", shown_key
    print("ok bidirectional override shown escaped", flush=True)

    # Its numbers are /v1/throttles' at the moment the page read it: two reads bracket it. The
    # page reads its data once a second, one read after the other, so once two more reads
    # have finished after `before` was read, the one on screen started after it.
    time.sleep(1.2)
    before = throttle_row("tables", "hot")
    since = js("return weirUi.generation")
    until("two more page reads", lambda: js("return weirUi.generation") >= since + 2, 5)
    shown = js("""
        const row = document.querySelector('tr[data-policy="tables"][data-key="hot"]');
        return row && {generation: weirUi.generation,
                       qps: Number(row.querySelector('.qps').dataset.value),
                       limit: Number(row.querySelector('.limit').dataset.value),
                       kind: row.children[3].textContent, node: row.children[0].textContent};""")
    after = throttle_row("tables", "hot")
    assert shown, "the throttled key left the table"
    assert shown["limit"] == before["qps_limit"] == after["qps_limit"], (shown, before, after)
    assert shown["kind"] == before["kind"] and shown["node"] == before["node_id"], (shown, before)
    low = min(before["current_qps"], after["current_qps"])
    high = max(before["current_qps"], after["current_qps"])
    # The rate moves between the reads; a tenth either way and one request a second more
    # allows for that, not for a wrong column or a stale row.
    assert low * 0.9 - 1 <= shown["qps"] <= high * 1.1 + 1, (shown, before, after)
    print(f"ok numbers match /v1/throttles: page {shown['qps']:.2f}/s within "
          f"[{low:.2f}, {high:.2f}], limit {shown['limit']}", flush=True)

    # The policy's chart has points, in uPlot's own data.
    points = until("points on the chart",
                   lambda: js("const u = weirUi.charts.get('tables'); return u && u.data[0].length"), 5)
    assert js("return weirUi.charts.get('tables').data[3].some(v => v > 0)"), "no rejections drawn"
    print(f"ok chart has {points} points", flush=True)

    # The member table names the policies' version, as /v1/cluster has it, and whether it
    # differs from this node's (alone, it cannot).
    _, _, cluster = api("GET", "/v1/cluster")
    version = cluster["members"][0]["config_version"]
    member = until("the member's config version", lambda: js(
        "const r = document.querySelector('#member-table tbody tr');"
        "return r && {version: r.cells[5].textContent, differs: r.dataset.configDiffers}"), 5)
    assert member == {"version": version, "differs": "false"}, (member, version)
    print(f"ok member table shows config version {version}", flush=True)

    # A single node has no cluster to sum: the choice of whose numbers stays hidden.
    assert not driver.find_element(By.ID, "stats-scope-control").is_displayed(), \
        "the choice of the cluster's or this node's numbers is shown on a single node"
    print("ok no choice of whose numbers on a single node", flush=True)

    # Editing: without the token refused (401), with a wrong one refused (403), with it applied.
    def result():
        return driver.find_element(By.ID, "edit-result").text

    def load(name):
        Select(driver.find_element(By.ID, "edit-policy")).select_by_value(name)
        driver.find_element(By.ID, "edit-load").click()
        until("the policy loaded", lambda: result().startswith("Loaded"), 5)

    def edit_qps(qps):
        js("const t = document.getElementById('edit-text'); const c = JSON.parse(t.value);"
           "c.strict.qps = arguments[0]; t.value = JSON.stringify(c, null, 2);", qps)
        driver.find_element(By.ID, "edit-save").click()

    def use_token(value):
        field = driver.find_element(By.ID, "token")
        field.clear()
        field.send_keys(value)
        driver.find_element(By.ID, "token-use").click()

    def stored_qps():
        status, headers, body = api("GET", "/v1/policies/edited")
        assert status == 200, body
        return body["strict"]["qps"], headers["ETag"]

    original, _ = stored_qps()
    load("edited")
    edit_qps(original + 1)
    until("a refusal shown", lambda: "needs the admin token" in result(), 5)
    assert stored_qps()[0] == original
    print(f"ok edit without the token refused: {result()!r}", flush=True)
    use_token("not-the-token")
    edit_qps(original + 1)
    until("a 403 shown", lambda: "403" in result(), 5)
    assert stored_qps()[0] == original
    print(f"ok edit with a wrong token refused: {result()!r}", flush=True)
    use_token(TOKEN)
    edit_qps(original + 1)
    until("saved", lambda: result().startswith("Saved"), 5)
    assert stored_qps()[0] == original + 1, stored_qps()
    print(f"ok edit with the token applied: qps {original} -> {original + 1}", flush=True)

    # A conflicting edit: someone else changes the policy after the page loaded it.
    load("edited")
    theirs, etag = stored_qps()
    mine = theirs + 10
    status, _, body = api("PUT", "/v1/policies/edited",
                          {**api("GET", "/v1/policies/edited")[2],
                           "strict": {"qps": theirs + 20}},
                          {"Authorization": f"Bearer {TOKEN}", "If-Match": etag})
    assert status == 200, (status, body)
    edit_qps(mine)
    until("a conflict shown", lambda: "Conflict (412)" in result(), 5)
    assert stored_qps()[0] == theirs + 20, "the page overwrote someone else's edit"
    kept = js("return JSON.parse(document.getElementById('edit-text').value).strict.qps")
    assert kept == mine, f"the page dropped the user's text: {kept}"
    print(f"ok conflicting edit reported, not applied: {result()!r}", flush=True)

    # The token is in no URL the page asked for, and not kept in storage.
    urls = js("return [location.href].concat(performance.getEntriesByType('resource').map(e => e.name))")
    assert all(TOKEN not in url for url in urls), urls
    stored = js("return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie")
    assert TOKEN not in stored
    print(f"ok token in none of {len(urls)} URLs nor in storage", flush=True)

    # Nothing went wrong in the page: no script error, no refused load (the page's own
    # refusals, 401, 403 and 412, are answers it asked for).
    problems = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
                and not any(f" {code} " in e["message"] for code in ("401", "403", "412"))]
    assert not problems, problems
    print("ok no errors in the console", flush=True)

    # The charts, wide and narrow, with the busiest policy in the thousands a second: every
    # axis' tick labels inside its box and the chart's canvas, no legend nor chart off the page.
    for width, height in [(1400, 900), (360, 800)]:
        driver.set_window_size(width, height)
        js("window.scrollTo(0, 0)")
        seen = js("return weirUi.generation")
        until("a reading at the new size", lambda: js("return weirUi.generation") >= seen + 2, 5)
        until("a chart's y axis in the thousands", lambda: js(
            "return [...weirUi.charts.values()].some(u => (u.axes[1]._values || [])"
            ".some(v => Number(String(v).replace(/,/g, '')) >= 1000))"), 10)
        layout, (name, text, label_width, room) = check_layout(width)
        labels = sum(len(a["labels"]) for c in layout["charts"] for a in c["axes"])
        print(f"ok layout at {width} px: {len(layout['charts'])} charts, {labels} tick labels in "
              f"their axes; widest y label {text!r} ({name}) {label_width:.1f} px in "
              f"{room:.0f} px; legends and charts within the page's {layout['viewport']} px",
              flush=True)
        for chart in layout["charts"]:
            for axis in chart["axes"]:
                if axis["side"] % 2 == 1:
                    room = axis["box"]["right"] - axis["box"]["left"] - axis["offset"]
                    print(f"   {chart['name']}: y labels " + ", ".join(
                        f"{label['text']} {label['width']:.1f}" for label in axis["labels"])
                        + f" in {room:.0f} px", flush=True)

    # Screenshots for the README, wide and narrow, after a few readings.
    Select(driver.find_element(By.ID, "edit-policy")).select_by_value("tables")
    driver.find_element(By.ID, "edit-load").click()
    driver.find_element(By.ID, "token-forget").click()
    for name, (width, height) in [("ui-wide.png", (1400, 900)), ("ui-narrow.png", (390, 844))]:
        driver.set_window_size(width, height)
        js("window.scrollTo(0, 0)")
        seen = js("return weirUi.generation")
        until("a reading at the new size", lambda: js("return weirUi.generation") >= seen + 2, 5)
        assert driver.save_screenshot(os.path.join(SHOTS, name))
        print(f"ok screenshot {name}", flush=True)

    # A server with no admin token takes changes from anyone: there the page stays read-only.
    driver.get(READ_ONLY + "/ui")
    until("a reading of the read-only server", lambda: js(
        "return window.weirUi && weirUi.generation >= 1"), 5)
    assert not driver.find_element(By.ID, "edit-save").is_enabled(), "Save is enabled"
    mode = driver.find_element(By.ID, "edit-mode").text
    assert mode.startswith("Read-only"), mode
    print(f"ok read-only without a server token: {mode!r}", flush=True)
finally:
    browser.stop()
