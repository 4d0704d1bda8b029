"""The ``hps`` console script ends a command that ran out of memory with one error line
(status 2), not a NumPy traceback."""

from __future__ import annotations

import argparse

import pytest

from hps.cli import main


def test_running_out_of_memory_is_an_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def allocate(args: argparse.Namespace) -> int:
        raise MemoryError(
            "Unable to allocate 28.0 GiB for an array with shape (3758096384,) and data type int64"
        )

    monkeypatch.setattr("hps.commands.plan._freq", allocate)
    assert main(["freq", "--out", "f.npz", "log"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hps freq: error: out of memory: Unable to allocate 28.0 GiB for an array with shape "
        "(3758096384,) and data type int64\n"
    )


def test_a_memory_error_without_a_message_still_says_what_happened(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def allocate(args: argparse.Namespace) -> int:
        raise MemoryError

    monkeypatch.setattr("hps.commands.plan._freq", allocate)
    assert main(["freq", "--out", "f.npz", "log"]) == 2
    assert capsys.readouterr().err == "hps freq: error: out of memory\n"
