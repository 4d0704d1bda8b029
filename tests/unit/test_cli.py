"""The ``hps`` console script: a reader that goes away (``hps ... | head``) ends it quietly;
unknown options, numbers out of range and paths that cannot be used are error lines (status
2), never tracebacks."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hps.cli import (
    _dispatch,
    int64,
    main,
    non_negative_float,
    non_negative_int,
    os_error_text,
    port,
    positive_float,
    positive_int,
    positive_ints,
)
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


def hps(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``hps ARGS`` in this process: its status (a usage error's too) and its stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_an_unknown_option_is_named_and_a_missing_command_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = hps(capsys, "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err
    code, err = hps(capsys)
    assert code == 2 and "the following arguments are required: COMMAND" in err


@pytest.mark.parametrize(
    "args",
    [
        ["freq", "--out", "{tmp}/f.npz", "/nonexistent/keys"],
        ["repository", "--out", "/proc/hps/repo"],
        ["demo", "--dir", "/proc/hps/demo"],
    ],
)
def test_a_path_that_cannot_be_used_is_an_error_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, err = hps(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2
    assert err.startswith(f"hps {args[0]}: error: /") and "Traceback" not in err
    assert "No such file or directory" in err


def test_a_broken_pipe_is_not_reported_as_an_os_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("hps.commands.plan._freq", broken)
    with pytest.raises(BrokenPipeError):
        _dispatch(["freq", "--out", "f.npz", "log"])


def test_os_error_text_names_the_paths() -> None:
    assert os_error_text(FileNotFoundError(2, "No such file or directory", "/x")) == (
        "/x: No such file or directory"
    )
    assert os_error_text(OSError(18, "Invalid cross-device link", "a", None, "b")) == (
        "a -> b: Invalid cross-device link"
    )
    assert os_error_text(ConnectionRefusedError(111, "Connection refused")) == "Connection refused"
    assert os_error_text(OSError("no errno")) == "no errno"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lookup", "--config", "c", "--table", "m.t", "99999999999999999999"], "outside int64"),
        (["lookup", "--config", "c", "--table", "m.t", "1x"], "not an integer: '1x'"),
        (["freq", "--out", "f.npz", "--top", "-5", "log"], "--top: must be 0 or more, not -5"),
        (["publish", "--table", "m.t", "--sparse", "d", "--chunk-rows", "-5"], "--chunk-rows"),
        (["publish", "--table", "m.t", "--sparse", "d", "--max-message-bytes", "0"], "bytes"),
        (["consume-check", "--heartbeat-file", "h", "--max-age-s", "nan"], "--max-age-s"),
        (["consume", "--config", "c", "--max-loop-age-s", "inf"], "--max-loop-age-s"),
        (["admin", "--max-jobs", "0"], "--max-jobs: must be a positive integer"),
        (["admin", "--max-staged-gb", "-2"], "--max-staged-gb"),
        (["admin", "--read-timeout", "nan"], "--read-timeout"),
        (["admin", "--max-connections", "-5"], "--max-connections"),
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, err = hps(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_argument_types() -> None:
    assert positive_int("3") == 3 and non_negative_int("0") == 0
    assert port("1") == 1 and port("65535") == 65535
    assert int64(str(2**63 - 1)) == 2**63 - 1 and int64(str(-(2**63))) == -(2**63)
    assert positive_ints("1,8, 64") == [1, 8, 64]
    assert non_negative_float("0") == 0.0 and non_negative_float("1.5") == 1.5
    assert positive_float("0.5") == 0.5
    for parse, bad in [
        (positive_int, "0"),
        (positive_int, "-3"),
        (non_negative_int, "-1"),
        (port, "0"),
        (port, "65536"),
        (int64, str(2**63)),
        (positive_ints, "1,0"),
        (positive_ints, ","),
        (non_negative_float, "-1"),
        (non_negative_float, "nan"),
        (non_negative_float, "inf"),
        (non_negative_float, "x"),
        (positive_float, "0"),
        (positive_float, "nan"),
        (positive_float, "-inf"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
