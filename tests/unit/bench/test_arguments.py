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
        ["cache", "--keys", "0"],
        ["cache", "--rows", "0"],
        ["cache", "--dim", "0"],
        ["cache", "--tables", "0"],
        ["cache", "--repeats", "0"],
    ],
)
def test_a_size_of_zero_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    assert exc.value.code == 2
    assert f"argument {args[1]}: must be a positive integer, not 0" in capsys.readouterr().err


def test_the_cache_bench_warmup_is_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "cache", "--warmup", "1.5"])
    assert exc.value.code == 2
    assert "argument --warmup: must be from 0 to 1, not 1.5" in capsys.readouterr().err
