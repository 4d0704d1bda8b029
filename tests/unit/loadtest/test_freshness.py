"""The load test's freshness figures: the probes' (end to end, and when the update became
visible) and the serving processes' metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hps.loadtest import freshness
from hps.loadtest.summary import format_summary, read_report

INF = float("inf")
COLUMNS = ["requests", "failures", "rps", "p50_ms", "p95_ms", "p99_ms"]


def _stats(report: Path, rows: list[list[str]]) -> None:
    """The run's final statistics (stats.json), a row per type: type, name, then COLUMNS."""
    types = {
        f"{r[0]} {r[1]}": {k: int(v) if k in ("requests", "failures") else float(v)
                           for k, v in zip(COLUMNS, r[2:], strict=True)}
        for r in rows
    }  # fmt: skip
    (report / "stats.json").write_text(json.dumps({"types": types, "errors": []}))


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
        ["kafka", "visible", "20", "0", "1", "150", "250", "360"],
    ])  # fmt: skip
    metric = freshness.Figure(count=80, p50_ms=180.0, p99_ms=396.0)
    freshness.write(tmp_path, metric)
    figures = read_report(tmp_path)["freshness"]
    assert figures.probes == freshness.Figure(20, 200.0, 400.0)
    assert figures.visible == freshness.Figure(20, 150.0, 360.0)
    assert figures.metric == metric
    # the metric is held against the figure that times the same instant
    assert figures.ratio("p50_ms") == pytest.approx(1.2)
    assert figures.ratio("p99_ms") == pytest.approx(1.1)
    out = format_summary(tmp_path, 0)
    line = next(x for x in out.splitlines() if x.startswith("freshness:"))
    assert "probes p50 200 ms p99 400 ms" in line and "visible p50 150 ms p99 360 ms" in line
    assert "hps_update_freshness_seconds p50 180 ms p99 396 ms (80 messages)" in line
    assert "metric/visible p50 x1.20 p99 x1.10" in line


def test_without_a_visible_figure_there_is_no_ratio(tmp_path: Path) -> None:
    _stats(tmp_path, [["kafka", "freshness", "20", "0", "1", "200", "300", "400"]])
    freshness.write(tmp_path, freshness.Figure(count=80, p50_ms=180.0, p99_ms=440.0))
    figures = read_report(tmp_path)["freshness"]
    assert figures.visible is None and figures.ratio("p99_ms") is None
    assert "metric/visible" not in format_summary(tmp_path, 0)


def test_a_metric_that_could_not_be_read_is_said(tmp_path: Path) -> None:
    _stats(tmp_path, [["kafka", "freshness", "3", "0", "1", "200", "300", "400"]])
    freshness.write(tmp_path, freshness.Figure(error="Triton metrics at x: refused"))
    out = format_summary(tmp_path, 0)
    assert "hps_update_freshness_seconds unread: Triton metrics at x: refused" in out


def test_without_updates_there_is_no_freshness_line(tmp_path: Path) -> None:
    _stats(tmp_path, [["grpc", "lookup", "100", "0", "10", "20", "30", "40"]])
    assert "freshness:" not in format_summary(tmp_path, 0)


# -- kafka visible: from the start times of the probe's lookups in Triton ---------------

MS = 1_000_000  # ns


def test_the_middle_between_the_last_miss_and_the_first_hit() -> None:
    lookups = [(10 * MS, False), (30 * MS, False), (50 * MS, True), (70 * MS, True)]
    assert freshness.visible_after(0, lookups) == pytest.approx(0.040)


def test_lookups_answered_out_of_order_are_ordered_by_their_start() -> None:
    # a miss that began after the first hit (another instance, not refreshed yet) is not
    # the bracket's lower end
    lookups = [(70 * MS, True), (60 * MS, False), (50 * MS, True), (30 * MS, False)]
    assert freshness.visible_after(0, lookups) == pytest.approx(0.040)


def test_a_first_lookup_that_hits_is_bracketed_by_the_publish() -> None:
    assert freshness.visible_after(100 * MS, [(120 * MS, True)]) == pytest.approx(0.010)


def test_nothing_visible_without_a_hit() -> None:
    assert freshness.visible_after(0, [(10 * MS, False)]) is None
    assert freshness.visible_after(0, []) is None


TRITON_METRICS = """\
hps_update_stage_seconds_bucket{model="m",process="1",stage="journal",le="0.1"} 3
hps_update_stage_seconds_bucket{model="m",process="1",stage="journal",le="+Inf"} 3
"""
CONSUMER_METRICS = """\
hps_update_stage_seconds_bucket{stage="delivery",le="0.05"} 1
hps_update_stage_seconds_bucket{stage="delivery",le="0.1"} 2
hps_update_stage_seconds_bucket{stage="delivery",le="+Inf"} 2
"""


def test_the_stages_of_hps_consume_are_read_beside_the_serving_processes() -> None:
    from tests.helpers import QuietHandler, loopback_http

    class Metrics(QuietHandler):
        def do_GET(self) -> None:
            self.reply((TRITON_METRICS if self.path == "/triton" else CONSUMER_METRICS).encode())

    with loopback_http(Metrics) as port:
        base = f"http://127.0.0.1:{port}"
        after = freshness.snapshot(f"{base}/triton", f"{base}/consume")
        alone = freshness.snapshot(f"{base}/triton")
    assert isinstance(after, dict) and isinstance(alone, dict)
    assert ("stage", freshness.CONSUMER, "delivery") in after
    assert not any(k[1] == freshness.CONSUMER for k in alone)
    stages = freshness.stage_windows({}, after, "m")
    assert sorted(stages) == ["delivery", "journal"]
    assert stages["delivery"].count == 2 and stages["journal"].count == 3


def test_the_baseline_is_the_snapshot_taken_when_the_warm_up_ends() -> None:
    """The metric figures count from the end of the warm-up, as the probes do."""
    import threading

    from tests.helpers import QuietHandler, loopback_http

    served: list[int] = []
    second = threading.Event()

    class Growing(QuietHandler):  # each scrape has seen one more message
        def do_GET(self) -> None:
            served.append(1)
            n = len(served)
            bucket = 'hps_update_freshness_seconds_bucket{model="m",table="t",le="%s"} %d\n'
            self.reply((bucket % ("0.1", n) + bucket % ("+Inf", n)).encode())
            if n == 2:
                second.set()

    def count(snap: freshness.Snapshot | str) -> float:
        assert isinstance(snap, dict)
        return snap[("fresh", "m", "t")][-1][1]

    with loopback_http(Growing) as port:
        url = f"http://127.0.0.1:{port}/metrics"
        warmed = freshness.Baseline(url, "", warmup_s=0.05)
        assert second.wait(10.0)
        assert count(warmed.stop()) == 2  # retaken once the warm-up was over
        cut_short = freshness.Baseline(url, "", warmup_s=3600.0)
        assert count(cut_short.stop()) == 3  # a run shorter than its warm-up: the start's
    assert len(served) == 3
