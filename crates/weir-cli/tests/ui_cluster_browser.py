"""Drives Weir's live page in headless Chromium on a cluster member (for
crates/weir-cli/tests/ui.rs, `the_page_shows_the_whole_cluster_by_default`).

Usage: ui_cluster_browser.py BASE_URL

BASE_URL is a loopback `http://127.0.0.1:PORT` of a member of a two-node cluster whose *other*
member the caller keeps asking for policy `edited`. Prints `ok <check>` per check passed and
exits 0, or raises. Chromium and chromedriver are stopped by their process ids before it exits,
also when it is stopped with SIGTERM.
"""

import re
import signal
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser import Browser, text_of, until

BASE = sys.argv[1]
assert BASE.startswith("http://127.0.0.1:"), "loopback only"
signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))


browser = Browser()
driver = browser.driver
try:
    driver.get(BASE + "/ui")
    control = driver.find_element(By.ID, "stats-scope-control")
    until("the scope control shown", control.is_displayed, 10)
    scope = Select(driver.find_element(By.ID, "stats-scope"))
    assert scope.first_selected_option.get_attribute("value") == "cluster"
    members = driver.find_element(By.ID, "stats-members")
    until("the totals' note", lambda: "totals over 2 member(s)" in members.text, 10)
    print(f"ok cluster by default: {members.text!r}", flush=True)

    def admitted():
        text = text_of(driver, '[data-policy="edited"] .now span')
        match = text and re.match(r"admitted ([0-9.]+)/s", text)
        return float(match.group(1)) if match else None

    # Asked only through the other member: seen here only in the cluster's totals.
    rate = until("the other member's admissions", lambda: (admitted() or 0) > 0, 15)
    print(f"ok the other member's admissions: {admitted()}/s", flush=True)

    scope.select_by_value("node")
    until("this node's numbers", lambda: "alone" in members.text, 10)
    until("this node's own rate, none", lambda: admitted() == 0, 10)
    print(f"ok this node alone: {members.text!r}, admitted {admitted()}/s", flush=True)
finally:
    browser.stop()
