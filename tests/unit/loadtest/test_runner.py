"""run_locust's clean-up: Locust runs under ``timeout`` in a group of its own, stopped whole."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from hps.loadtest.runner import stop_group


def _children(pid: int) -> list[int]:
    return [
        int(c) for t in Path(f"/proc/{pid}/task").glob("*/children") for c in t.read_text().split()
    ]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_stop_group_takes_the_child_of_timeout_with_it() -> None:
    proc = subprocess.Popen(["timeout", "-k", "20", "60", "sleep", "100"], start_new_session=True)
    deadline = time.monotonic() + 5
    while not _children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    (sleeper,) = _children(proc.pid)
    stop_group(proc, grace_s=5)
    assert proc.returncode is not None
    deadline = time.monotonic() + 5
    while not _gone(sleeper) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(sleeper), "timeout's child outlived the group stop"
