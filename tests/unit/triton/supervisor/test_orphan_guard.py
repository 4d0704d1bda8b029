"""The orphan guard: a process group that ignores its SIGTERM and outlives a SIGKILLed
parent is killed after the grace; a parent that stops in order leaves its groups alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hps.triton.supervisor import orphan_guard
from tests.unit.triton.supervisor.test_lifecycle import wait_zombie

HANG_S = 30.0  # hang guards only

# A parent: starts the guard (grace 0.5 s), a child in a group of its own that ignores
# SIGTERM (a Triton whose shutdown hangs), names it to the guard, prints the child's PID.
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    from hps.triton.supervisor.orphan_guard import OrphanGuard

    guard = OrphanGuard(grace=0.5).start()
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        start_new_session=True,
    )
    guard.watch(child.pid)
    print(child.pid, flush=True)
    if sys.argv[1] == "stop":
        guard.stop()
        print("stopped", flush=True)
    sys.stdin.read()  # until the test kills us
    """
)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _parent(mode: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[4],
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_group_that_outlives_a_killed_parent_is_killed_after_the_grace() -> None:
    proc, child = _parent("watch")
    try:
        assert _running(child)
        proc.kill()  # as SIGKILL ends hps serve: nothing of ours runs after it
        proc.wait()
        deadline = time.monotonic() + HANG_S
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child), "the guard left the group running"
        assert proc.stderr is not None
        said = proc.stderr.read()  # the guard shares the parent's stderr
        assert f"process groups [{child}] outlived hps serve by 0.5s; killed them" in said
    finally:
        _kill(child)


def test_a_parent_that_stops_the_guard_leaves_its_groups_alone() -> None:
    proc, child = _parent("stop")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "stopped"
        proc.kill()
        proc.wait()
        time.sleep(1.5)  # three times the guard's grace: a guard still there would have killed it
        assert _running(child), "a stopped guard killed a group"
    finally:
        _kill(child)


def test_a_group_of_zombies_has_ended() -> None:
    """Ended processes init has not reaped yet are not waited for, nor reported killed."""
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        wait_zombie(child.pid)
        assert not orphan_guard._alive(child.pid)
        assert orphan_guard._alive(os.getpgid(0))  # ours, running
    finally:
        child.wait()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
