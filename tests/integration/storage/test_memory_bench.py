"""``hps bench memory`` on tiny sizes: every tier and format measured, quantized rows smaller."""

from __future__ import annotations

import json

import pytest

from hps.bench.memory import TIERS
from hps.cli import main
from hps.rowformat import FORMATS, ROW_DTYPES

pytestmark = pytest.mark.integration


def test_every_tier_and_format_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "memory", "--rows", "20000", "--dims", "32", "--samples", "256"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tiers = [r for r in rows if r["tier"] != "ctr_scores"]
    assert {(r["tier"], r["row_dtype"]) for r in tiers} == {
        (t, f) for t in TIERS for f in ROW_DTYPES
    }
    by = {(r["tier"], r["row_dtype"]): r for r in tiers}
    for tier in TIERS:
        assert by[tier, "float32"]["ratio"] == 1.0
        # real usage holds at least the stored row, and quantized rows take less of it
        for name in ROW_DTYPES:
            assert by[tier, name]["bytes_per_row"] >= FORMATS[name].row_bytes(32) * 0.5
        assert 1.0 < by[tier, "float16"]["ratio"] < by[tier, "int8"]["ratio"]
    scores = {r["row_dtype"]: r for r in rows if r["tier"] == "ctr_scores"}
    assert set(scores) == {"float16", "int8"}
    assert 0 < scores["float16"]["max_abs_diff"] < scores["int8"]["max_abs_diff"] < 0.05
