"""A headless Chromium for the live page's browser runs (ui_browser.py, ui_cluster_browser.py):
started with nothing but loopback reachable, and stopped with everything it started, by
process id; and `until`, the runs' bounded wait for a condition."""

import shutil
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from processes import descendants, kill_browser


class Browser:
    """Chromium under chromedriver; `driver` is selenium's. With `logs`, the page's console
    messages are kept for `driver.get_log("browser")`."""

    def __init__(self, logs=False):
        self.profile = tempfile.mkdtemp(prefix="weir-ui-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for argument in [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--window-size=1400,900", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-default-apps",
            f"--user-data-dir={self.profile}",
            # Nothing but the server on loopback is reachable from the page.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ]:
            options.add_argument(argument)
        if logs:
            options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path=shutil.which("chromedriver"),
                          service_args=["--allowed-ips=127.0.0.1"])
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver_pid = service.process.pid
        self.pids = descendants(self.driver_pid)

    def stop(self):
        """Quits, then kills by id whatever quitting left behind, and removes the profile."""
        pids = sorted(set(self.pids + descendants(self.driver_pid)))
        try:
            self.driver.quit()
        finally:
            kill_browser([self.driver_pid] + pids)
            shutil.rmtree(self.profile, ignore_errors=True)


def text_of(driver, css):
    """The rendered text of the first element matching `css`, or None: read in the page in one
    step, so an element the page re-renders between finding and reading cannot go stale."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", css)


def until(what, check, within):
    """`check()`'s first true value, asked every 50 ms; raises if none within `within` s."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.05)
