"""The rollout bench's ``hps serve``: a process group of its own, stopped whatever happens."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

import pytest

from hps.bench.rollout import _stop, _until_ready

READY = "import time; print('starting'); print('ready: 1 model', flush=True); time.sleep(120)"
NEVER_READY = "import time; print('starting', flush=True); time.sleep(120)"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_serve_runs_in_a_group_of_its_own_and_stops(tmp_path: Path) -> None:
    proc = _until_ready([sys.executable, "-c", READY], tmp_path, "server")
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        _stop(proc)
    assert proc.returncode is not None


def test_interrupted_before_it_is_ready_it_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (the bench's KeyboardInterrupt) while hps serve starts: it does not stay."""
    started: list[int] = []
    real_popen = __import__("subprocess").Popen

    def popen(*args: object, **kw: object) -> object:
        proc = real_popen(*args, **kw)
        started.append(proc.pid)
        signal.setitimer(signal.ITIMER_REAL, 0.5)  # then Ctrl-C, while its line is awaited
        return proc

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("hps.bench.rollout.subprocess.Popen", popen)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            _until_ready([sys.executable, "-c", NEVER_READY], tmp_path, "server")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for pid in started:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the server outlived the interrupt")


def test_a_server_that_exits_before_it_is_ready_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"server exited \(3\) before it was ready"):
        _until_ready([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path, "server")
