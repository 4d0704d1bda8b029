"""``hps bench memory`` on tiny sizes: every tier and format measured, quantized rows smaller."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hps.bench.memory import TIERS, _measurer
from hps.cli import main
from hps.rowformat import FORMATS, ROW_DTYPES
from hps.types import TableSpec

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


def test_the_redis_baseline_leaves_out_the_servers_first_allocations() -> None:
    """float32, measured first on a fresh server, is the baseline of every ratio: it must not
    carry the server's one-time allocations (it did: 99 bytes a row, then 50 measured again)."""
    rows, dim = 2000, 8
    rng = np.random.default_rng(7)
    keys = rng.permutation(np.arange(rows, dtype=np.int64) * 7919 + 1)
    values = rng.standard_normal((rows, dim), dtype=np.float32)
    with _measurer("redis") as measure:
        got = []
        for name in ("float32", "float16", "float32"):
            spec = TableSpec(model="bench", table=f"t{dim}_{name}", dim=dim, row_dtype=name)
            got.append(measure(spec, keys, spec.fmt.encode(values)))
    first, again = got[0], got[2]
    assert abs(first - again) <= 0.05 * again, got
    assert got[1] < first
