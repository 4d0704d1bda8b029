"""CPU by role of a load test's processes (``hps.loadtest.cpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hps.loadtest.cpu import Snapshot, cores, format_cores, role, snapshot


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["/b/triton_python_backend_stub", "/repo/demo_ctr/1/model.py", "shm", "1"],
            "stub demo_ctr",
        ),
        (["/site/pytriton/tritonserver/bin/tritonserver", "--model-repository=/r"], "tritonserver"),
        (["nginx: worker process"], "gate (nginx)"),
        (["/root/.calfkit/bin/tansu-v0.6.0-510f3e2", "broker"], "broker (tansu)"),
        (["/usr/bin/redis-server", "127.0.0.1:7000"], "redis"),
        (["/venv/bin/python3", "-m", "locust", "-f", "locustfile.py"], "locust"),
        (["/venv/bin/python3", "-m", "hps.cli", "serve", "--config", "ps.json"], "hps serve"),
        (["/venv/bin/python3", "-m", "hps.cli", "consume", "--config", "ps.json"], "hps consume"),
        (["/venv/bin/python3", "-m", "hps.cli", "admin", "--port", "1"], "hps admin"),
        (["/usr/bin/timeout", "-k", "20", "140"], "locust"),  # Locust's wrapper
        (["nginx: master process /usr/sbin/nginx -p /tmp/g -e /tmp/g/error.log"], "gate (nginx)"),
        (["/venv/bin/python3", "-c", "print()"], "python3"),  # its program's name
        ([], "other"),
    ],
)
def test_roles_from_command_lines(args: list[str], expected: str) -> None:
    assert role(args) == expected


def test_cores_per_role_count_new_processes_from_zero_and_the_rest_as_other() -> None:
    first = Snapshot(10.0, 100.0, {1: ("locust", 4.0), 2: ("stub demo", 1.0), 3: ("redis", 9.0)})
    last = Snapshot(
        20.0,
        125.0,  # the machine was busy 25 s over 10 s: 2.5 cores
        {
            1: ("locust", 11.0),  # 7 s
            2: ("stub demo", 4.0),  # 3 s
            4: ("stub demo", 2.0),  # started in between: 2 s
            3: ("hps consume", 1.0),  # pid 3 reused by another process: 1 s
        },
    )
    used = cores(first, last)
    assert used == {"locust": 0.7, "stub demo": 0.5, "hps consume": 0.1, "other": 1.2}
    assert list(used)[:2] == ["locust", "stub demo"]  # largest first, other last
    assert format_cores({"locust": 0.7, "redis": 0.004}) == "locust 0.70"
    assert cores(last, last) == {}


def test_a_snapshot_finds_a_busy_child_under_its_role() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", burn + "print('done', flush=True)\ninput()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        snap = snapshot(os.getpid(), time.monotonic())
        name, seconds = snap.processes[child.pid]
        assert name == Path(sys.executable).name
        assert seconds >= 0.25
        assert os.getpid() not in snap.processes  # the root itself is not counted
        assert snap.machine_s >= seconds
    finally:
        child.communicate("\n", timeout=30)
