"""`hps serve`'s banner names the command that runs this very hps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hps.triton.supervisor.serve import _hps_command


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
