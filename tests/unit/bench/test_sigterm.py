"""SIGTERM stops ``hps bench`` as Ctrl-C does: the bench's finally clauses run (they stop its
servers, remove its shared memory and temporary folders) and the status is 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hps.cli import sigterm_interrupts

BENCH = """
import os, signal
from pathlib import Path

def add_arguments(parser):
    parser.add_argument("--marker")

def run(args):
    try:
        yield {"row": 1}
        os.kill(os.getpid(), signal.SIGTERM)  # as a service manager or `kill` would
        yield {"row": 2}
    finally:
        Path(args.marker).write_text("cleaned up")
"""

MAIN = """
import sys
import hps.bench
from hps.cli import main
hps.bench.BENCHES["fake"] = "fake_bench"
sys.exit(main(["bench", "fake", "--marker", sys.argv[1]]))
"""


def test_sigterm_runs_the_bench_finally_clauses(tmp_path: Path) -> None:
    (tmp_path / "fake_bench.py").write_text(textwrap.dedent(BENCH))
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-c", MAIN, str(marker)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert marker.read_text() == "cleaned up"
    assert done.stdout.splitlines() == ['{"row": 1}']


def test_the_previous_sigterm_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_interrupts():
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs as os.kill returns
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_hangup_interrupts_too_unless_ignored() -> None:
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with sigterm_interrupts(), pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGHUP)  # the terminal closed
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        with sigterm_interrupts():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
