"""The load test's two freshness figures: the probes' and the serving processes' metric."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from hps.loadtest import freshness
from hps.loadtest.summary import format_summary, read_report

INF = float("inf")
COLUMNS = ["Type", "Name", "Request Count", "Failure Count", "Requests/s", "50%", "95%", "99%"]


def _stats(report: Path, rows: list[list[str]]) -> None:
    with open(report / "locust_stats.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)


def test_the_window_keeps_the_runs_observations_of_the_model() -> None:
    before = {("fresh", "m", "t"): [(0.1, 10.0), (0.2, 10.0), (INF, 10.0)]}
    after = {
        ("fresh", "m", "t"): [(0.1, 10.0), (0.2, 30.0), (INF, 30.0)],
        ("fresh", "m_ctr", "t"): [(0.1, 0.0), (0.2, 0.0), (INF, 0.0)],
        ("fresh", "other", "t"): [(0.1, 500.0), (0.2, 500.0), (INF, 500.0)],
        ("stage", "m", "sync"): [(0.1, 4.0), (0.2, 4.0), (INF, 4.0)],
    }
    fig = freshness.window(before, after, "m")
    assert fig.count == 20 and fig.p50_ms == pytest.approx(150.0)
    assert freshness.window(before, "Triton metrics at x: refused", "m").error
    stages = freshness.stage_windows(before, after, "m")
    assert list(stages) == ["sync"] and stages["sync"].count == 4


def test_the_summary_reports_both_figures(tmp_path: Path) -> None:
    _stats(tmp_path, [
        ["grpc", "lookup", "100", "0", "10", "20", "30", "40"],
        ["kafka", "freshness", "20", "0", "1", "200", "300", "400"],
    ])  # fmt: skip
    metric = freshness.Figure(count=80, p50_ms=180.0, p99_ms=440.0)
    freshness.write(tmp_path, metric)
    figures = read_report(tmp_path)["freshness"]
    assert figures.probes == freshness.Figure(20, 200.0, 400.0)
    assert figures.metric == metric
    assert figures.as_json()["metric_vs_probes_p99"] == pytest.approx(1.1)
    out = format_summary(tmp_path, 0)
    line = next(x for x in out.splitlines() if x.startswith("freshness:"))
    assert "probes p50 200 ms p99 400 ms" in line
    assert "hps_update_freshness_seconds p50 180 ms p99 440 ms (80 messages)" in line
    assert "p99 x1.10" in line


def test_a_metric_that_could_not_be_read_is_said(tmp_path: Path) -> None:
    _stats(tmp_path, [["kafka", "freshness", "3", "0", "1", "200", "300", "400"]])
    freshness.write(tmp_path, freshness.Figure(error="Triton metrics at x: refused"))
    out = format_summary(tmp_path, 0)
    assert "hps_update_freshness_seconds unread: Triton metrics at x: refused" in out


def test_without_updates_there_is_no_freshness_line(tmp_path: Path) -> None:
    _stats(tmp_path, [["grpc", "lookup", "100", "0", "10", "20", "30", "40"]])
    assert "freshness:" not in format_summary(tmp_path, 0)
