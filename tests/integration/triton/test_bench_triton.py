"""`hps bench triton` end to end on a small demo, through the request-size gate: one JSON
row per concurrency level, HPS and the identity floor measured in the same run, with the
levels' hit shares."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_triton_through_the_gate_prints_one_row_per_level() -> None:
    args = "--tables 3 --rows 2000 --batch 64 --concurrency 1,2 --requests 8 --rounds 2"
    done = subprocess.run(
        [sys.executable, "-m", "hps.cli", "bench", "triton", *args.split(), "--warmup", "4"]
        + ["--gate"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert row["gate"] is True and row["requests"] == 8
        assert row["p50_ms"] > 0 and row["floor_p50_ms"] > 0
        assert row["ratio"] == pytest.approx(row["p50_ms"] / row["floor_p50_ms"], rel=0.01)
        # counted even on a run this short (every instance reports before each reading)
        shares = [row[f"{level}_share"] for level in ("l1", "l2", "l3", "default")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3) and row["l1_share"] > 0
