"""Sizes of the benches are positive: a usage error naming the option, not a crash."""

from __future__ import annotations

import pytest

from hps.cli import main


@pytest.mark.parametrize(
    "args",
    [
        ["storage", "--rows", "0"],
        ["storage", "--repeats", "0"],
        ["storage", "--batch", "0"],
        ["memory", "--rows", "0"],
        ["triton", "--tables", "0"],
        ["triton", "--requests", "0"],
        ["triton", "--concurrency", "1,0"],
        ["freshness", "--run-time", "0"],
    ],
)
def test_a_size_of_zero_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    assert exc.value.code == 2
    assert f"argument {args[1]}: must be a positive integer, not 0" in capsys.readouterr().err
