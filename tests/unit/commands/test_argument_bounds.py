"""Command-line values out of their range are refused with one line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.cli import main


@pytest.mark.parametrize("above", ["-5", "999999999999999999999999", str(1 << 64)])
def test_repair_versions_refuses_a_bound_outside_uint64(
    above: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["repair-versions", "--config", str(tmp_path / "ps.json"), "--table", "m.t",
              "--above", above])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"--above: must be from 0 to 2**64 - 1, not {above}" in err
    assert "Traceback" not in err


def test_repair_versions_takes_the_largest_uint64() -> None:
    from hps.updates.commands import _uint64

    assert _uint64(str((1 << 64) - 1)) == (1 << 64) - 1
    assert _uint64("0") == 0
