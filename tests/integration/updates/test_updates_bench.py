"""``hps bench updates`` runs end to end against the session's broker (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hps.cli import main
from hps.testing.kafka import TansuBroker

pytestmark = pytest.mark.integration


def test_bench_updates_prints_the_figures(
    tmp_path: Path, kafka_broker: TansuBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "updates", "--brokers", kafka_broker.bootstrap, "--dir", str(tmp_path)]
    assert main([*argv, "--rows", "3000", "--publish-rows", "500", "--samples", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["phase"] for r in lines] == ["apply", "freshness", "freshness", "summary"]
    summary = lines[-1]
    for key in ("apply_per_s", "baseline_per_s", "ratio", "freshness_p50_ms", "freshness_p99_ms"):
        assert summary[key] > 0, key
    assert summary["bench"] == "updates" and summary["rows"] == 3000
    stages = summary["stages_s"]  # every batch wrote L3, then L2, then synced
    assert set(stages) == {"batch", "decode", "l3_write", "l2_write", "sync"}
    assert all(stages[s] > 0 for s in ("decode", "l3_write", "l2_write", "sync")), stages
    assert summary["l3_write_vs_l3_ceiling"] > 0
    assert {r.get("mode") for r in lines[1:3]} == {"embedded", "shared"}
