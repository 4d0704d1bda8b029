"""The ``hps`` console script: a reader that goes away (``hps ... | head``) ends it quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.test_plan import ps_json


def _to_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-m", "hps.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    done = _to_a_closed_pipe("plan", "--config", str(ps_json(tmp_path)), "--rows", "m.t1=0")
    assert done.returncode == 141
    assert done.stderr == b""  # no traceback, no "Exception ignored" at exit
