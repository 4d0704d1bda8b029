"""Stack.stop and stop_group finish whatever interrupts arrive: a second Ctrl-C while the load
test shuts down must not leave the stack's processes and servers running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hps.loadtest.runner import stop_group
from hps.loadtest.stack import Stack

SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"
# Ignores SIGTERM: only the SIGKILL after the grace period ends it.
DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    + SLEEPER.split("; ", 1)[1]
)


class _CtrlCWhileWaited(subprocess.Popen[Any]):
    """A process during whose wait() the user presses Ctrl-C (SIGINT to this process)."""

    def wait(self, timeout: float | None = None) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        return super().wait(timeout)


class _Server:
    def __init__(self, interrupt: bool = False) -> None:
        self.stopped = False
        self.interrupt = interrupt

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True
        if self.interrupt:  # Ctrl-C while a server stops
            os.kill(os.getpid(), signal.SIGINT)


def _sleeper(
    cls: type[subprocess.Popen[Any]] = subprocess.Popen, code: str = SLEEPER
) -> subprocess.Popen[Any]:
    proc = cls([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _kill(procs: list[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            subprocess.Popen.wait(proc)


def test_a_second_ctrl_c_while_the_stack_stops_stops_it_all() -> None:
    first, interrupted = _sleeper(), _sleeper(_CtrlCWhileWaited)
    servers = [_Server(), _Server(interrupt=True)]
    stack = Stack(Path("ps.json"), "h:1", "h:2")
    stack._procs += [("hps serve", first), ("hps admin", interrupted)]  # admin stops first
    stack._servers += servers
    try:
        with pytest.raises(KeyboardInterrupt):  # raised once everything is stopped
            stack.stop()
        assert first.poll() is not None and interrupted.poll() is not None
        assert all(s.stopped for s in servers)
    finally:
        _kill([first, interrupted])


def test_ctrl_c_while_stop_group_waits_still_ends_the_group() -> None:
    proc = _sleeper(_CtrlCWhileWaited, DEAF)  # Ctrl-C during the grace period of its SIGTERM
    try:
        with pytest.raises(KeyboardInterrupt):
            stop_group(proc, grace_s=0.5)
        assert proc.poll() is not None
    finally:
        _kill([proc])
