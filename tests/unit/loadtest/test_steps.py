"""Load shapes as stages, per-stage reader statistics and the knee."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.loadtest.steps import StageRecorder, knee, stage_at, stages, updates_on


def test_shapes() -> None:
    assert stages("steady", 8, 30) == [(30, 8)]
    assert stages("ramp", 64, 80, 4) == [(20, 16), (40, 32), (60, 48), (80, 64)]
    assert stages("spike", 8, 100) == [(40, 2), (60, 8), (100, 2)]
    with pytest.raises(ValueError, match="unknown shape"):
        stages("wave", 8, 10)
    plan = stages("ramp", 4, 40, 4)
    assert [stage_at(plan, t) for t in (0, 9.9, 10, 39.9, 40)] == [0, 0, 1, 3, None]


def test_recorder_and_knee(tmp_path: Path) -> None:
    plan = stages("ramp", 3, 30, 3)
    rec = StageRecorder(plan, {"grpc lookup"})
    for i in range(100):  # stage 0: 100 fast; stage 1: 300 fast; stage 2: 320 slow
        rec.record(i * 0.1, "grpc lookup", 5.0, False)
    for i in range(300):
        rec.record(10 + i / 30, "grpc lookup", 8.0, i == 0)
    for i in range(320):
        rec.record(20 + i / 32, "grpc lookup", 900.0, False)
        rec.record(20 + i / 32, "kafka publish", 1.0, False)  # not a read: ignored
    rows = rec.write(tmp_path / "stages.csv")
    assert [r["requests"] for r in rows] == [100, 300, 320]
    assert rows[1]["failures"] == 1 and rows[1]["rps"] == pytest.approx(30, rel=0.01)
    assert (tmp_path / "stages.csv").read_text().startswith("stage,users,seconds")
    k = knee(rows, p99_bound_ms=100)
    assert k is not None and k["stage"] == 1 and k["users"] == 2
    assert knee(rows, p99_bound_ms=1) is None


def test_update_phases_compare_reads_with_and_without_updates() -> None:
    plan = stages("steady", 4, 40, phases=4)
    assert plan == [(10, 4), (20, 4), (30, 4), (40, 4)]
    assert [updates_on(4, i) for i in range(4)] == [False, True, False, True]
    assert updates_on(0, None) and not updates_on(4, None)
    rec = StageRecorder(plan, {"grpc lookup"})
    for i in range(400):  # 10 reads a second; twice as slow while updates flow
        t = i / 10
        on = updates_on(4, stage_at(plan, t))
        rec.record(t, "grpc lookup", 20.0 if on else 10.0, False)
    got = rec.compare_updates(4)
    assert got["without"]["requests"] == got["with"]["requests"] == 200
    assert got["without"]["p99_ms"] == 10.0 and got["with"]["p99_ms"] == 20.0
    assert got["with"]["rps"] == pytest.approx(10, rel=0.05)
    assert rec.compare_updates(0) == {}


def test_reads_finishing_after_the_plan_count_in_the_last_stage(tmp_path: Path) -> None:
    rec = StageRecorder(stages("spike", 8, 10), {"grpc lookup"})  # ends at 4, 6, 10 s
    rec.record(1.0, "grpc lookup", 5.0, False)
    rec.record(9.5, "grpc lookup", 5.0, False)
    rec.record(10.4, "grpc lookup", 900.0, True)  # started before the end, answered after
    rows = rec.write(tmp_path / "stages.csv")
    assert [r["requests"] for r in rows] == [1, 0, 2]
    assert rows[2]["failures"] == 1 and rows[2]["seconds"] == pytest.approx(4.4)
