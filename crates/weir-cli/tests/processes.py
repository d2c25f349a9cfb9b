"""Finding and stopping the processes a browser run started, by their ids (for browser.py
and bench/ui.sh): what chromedriver's quit leaves behind is found under its process in /proc."""

import os
import signal


def descendants(pid):
    """Every process below `pid`, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_browser(pids):
    """SIGKILL to each of `pids` that is still chromedriver or Chromium (an id that has been
    reused by another process is left alone)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if not comm.read().startswith("chrom"):
                    continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass
