"""The Locust process's verdict, end to end on a tiny locustfile (no stack): an exception
raised inside a user fails the run even when every threshold holds, and the final
statistics (stats.json) agree with it to the request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hps.ctr.demo import create_demo

pytestmark = pytest.mark.integration

LOCUSTFILE = '''
from locust import User, constant, task

from hps.loadtest.locustfile import *  # noqa: F403
from hps.loadtest.locustfile import HPSShape as HPSShape


class Crasher(User):
    """Reports a good lookup, then raises: a user's bug, not a failed request."""

    wait_time = constant(0.1)

    @task
    def crash(self) -> None:
        self.environment.events.request.fire(
            request_type="grpc", name="lookup", response_time=1.0, response_length=0,
            exception=None, context={},
        )
        raise RuntimeError("boom in a task")
'''


def test_an_exception_in_a_user_fails_a_run_whose_thresholds_hold(tmp_path: Path) -> None:
    demo = create_demo(tmp_path / "demo", num_tables=2, max_rows=1000, dim=4)
    locustfile = tmp_path / "crash_locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    report = tmp_path / "report"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "1",
           "-r", "1", "-t", "3s", "--only-summary", "--loglevel", "WARNING",
           "--hps-config", str(demo), "--hps-report-dir", str(report),
           "--threshold", "*:max_fail_ratio=0", "Crasher"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads((report / "verdict.json").read_text())
    assert verdict["passed"] is False and verdict["violations"] == [], verdict
    (crash,) = verdict["exceptions"]
    assert crash["type"] == "RuntimeError" and crash["message"] == "boom in a task", crash
    line = LOCUSTFILE.splitlines().index('        raise RuntimeError("boom in a task")') + 1
    assert crash["where"].endswith(f"crash_locustfile.py:{line} in crash"), crash
    stats = json.loads((report / "stats.json").read_text())
    lookups = stats["types"]["grpc lookup"]
    assert lookups["failures"] == 0 and lookups["requests"] == crash["count"] > 5, (stats, crash)
    assert stats["types"]["Aggregated"]["requests"] == lookups["requests"]
