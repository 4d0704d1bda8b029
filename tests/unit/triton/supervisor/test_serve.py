"""`hps serve`: its banner names the command that runs this very hps; a second one on the
same ps.json stops before it touches the first one's admin key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hps.cli import main
from hps.net import free_port
from hps.triton.admin_key import key_file_for
from hps.triton.supervisor.serve import _hps_command
from hps.triton.supervisor.serve_lock import hold_state_dir
from tests.unit.test_plan import ps_json


def test_banner_command_runs_this_hps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "venv" / "bin" / "hps"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _hps_command() == "venv/bin/hps"
    monkeypatch.setattr(sys, "argv", ["/somewhere/cli.py"])
    assert _hps_command() == f"{sys.executable} -m hps.cli"


def test_a_second_serve_of_a_ps_json_stops_before_it_writes_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ps_json(tmp_path)
    ports = [str(free_port()) for _ in range(3)]
    with hold_state_dir(tmp_path):  # what the first hps serve holds while it runs
        code = main(["serve", "--verbose", "--config", str(config), "--http-port", ports[0],
                     "--grpc-port", ports[1], "--metrics-port", ports[2]])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"another hps serve (pid {os.getpid()}) serves this ps.json" in err
    assert "use --state-dir" in err
    assert not key_file_for(tmp_path).exists()
