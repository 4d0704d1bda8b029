"""The summary: figures from the final statistics (stats.json), the verdict by its causes."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from hps.loadtest import stats
from hps.loadtest.summary import format_summary, outcome, read_report


@dataclass
class _Entry:
    method: str | None
    name: str
    num_requests: int
    num_failures: int = 0
    total_rps: float = 0.0
    ms: float = 0.0

    def get_response_time_percentile(self, percent: float) -> float:
        return self.ms * percent


@dataclass
class _Error:
    method: str | None
    name: str
    error: object
    occurrences: int


def _final(report: Path) -> None:
    lookups = _Entry("grpc", "lookup", 1371, 1, 247.1, 100.0)
    total = _Entry(None, "Aggregated", 1371, 1, 247.1, 100.0)
    errors = [_Error("grpc", "lookup", RuntimeError("stub not healthy"), 1)]
    stats.write(report, stats.snapshot([lookups], total, errors))


def test_the_summary_shows_the_final_stats_not_lagging_csvs(tmp_path: Path) -> None:
    _final(tmp_path)
    # Locust's CSV, last written a second before the end: no failure, fewer requests
    with open(tmp_path / "locust_stats.csv", "w", newline="") as f:
        csv.writer(f).writerows([["Type", "Name", "Request Count", "Failure Count"],
                                 ["grpc", "lookup", "1200", "0"]])  # fmt: skip
    with open(tmp_path / "locust_failures.csv", "w", newline="") as f:
        csv.writer(f).writerow(["Method", "Name", "Error", "Occurrences"])
    (tmp_path / "verdict.json").write_text(json.dumps(
        {"violations": ["grpc lookup: max_fail_ratio 0.0007294 (must be <= 0)"]}))  # fmt: skip
    rep = read_report(tmp_path)
    want = {"requests": 1371, "failures": 1, "rps": 247.1, "p50_ms": 50.0, "p95_ms": 95.0,
            "p99_ms": 99.0}  # fmt: skip
    assert rep["types"]["grpc lookup"] == want
    assert list(rep["types"]) == ["grpc lookup", "Aggregated"]
    out = format_summary(tmp_path, 1)
    row = next(x for x in out.splitlines() if x.startswith("grpc lookup"))
    assert row.split()[2:] == ["1371", "1", "247.1", "50", "95", "99"], out
    assert "  1 x grpc lookup: RuntimeError('stub not healthy')" in out
    assert out.splitlines()[-1].startswith("FAILED (thresholds); reports: ")


def test_columns_stay_apart_at_six_digit_counts(tmp_path: Path) -> None:
    """109756 requests, all failed: the counts must not run together (109756109756)."""
    lookups = _Entry("grpc", "lookup", 109_756, 109_756, 1826.9, 2.0)
    total = _Entry(None, "Aggregated", 123_456_789, 12_345_678, 123_456.7, 1000.0)
    stats.write(tmp_path, stats.snapshot([lookups], total, []))
    lines = format_summary(tmp_path, 1).splitlines()
    header = next(x for x in lines if x.startswith("request type"))
    assert header.split()[2:] == ["reqs", "fail", "req/s", "p50", "ms", "p95", "ms", "p99", "ms"]
    row = next(x for x in lines if x.startswith("grpc lookup"))
    assert row.split()[2:] == ["109756", "109756", "1826.9", "1", "2", "2"], row
    agg = next(x for x in lines if x.startswith("Aggregated"))
    assert agg.split()[1:] == ["123456789", "12345678", "123456.7", "500", "950", "990"]
    assert len(header) == len(row)  # the widths fit the figures


def test_without_final_stats_no_figures_are_made_up(tmp_path: Path) -> None:
    assert read_report(tmp_path)["types"] == {} and read_report(tmp_path)["failures"] == []


@pytest.mark.parametrize(
    ("code", "verdict", "label"),
    [
        (0, {}, "PASSED"),
        (1, {"violations": ["v"]}, "FAILED (thresholds)"),
        (1, {"exceptions": [{"type": "E"}]}, "FAILED (exceptions in users)"),
        (1, {"violations": ["v"], "exceptions": [{}]}, "FAILED (thresholds; exceptions in users)"),
        (2, {"exceptions": [{}]}, "FAILED (exceptions in users)"),
        (1, {}, "FAILED (locust exit 1)"),  # Locust failed before judging the run
        (124, {"violations": ["v"]}, "FAILED (timed out)"),
    ],
)
def test_the_outcome_is_labelled_by_its_cause(
    code: int, verdict: dict[str, object], label: str
) -> None:
    assert outcome(code, verdict) == label


def test_exceptions_in_users_are_listed(tmp_path: Path) -> None:
    _final(tmp_path)
    crash = {"type": "BackendUnavailable", "message": "kafka: no broker", "count": 2,
             "where": "hps/loadtest/users/kafka.py:59 in on_start"}  # fmt: skip
    (tmp_path / "verdict.json").write_text(json.dumps({"exceptions": [crash]}))
    out = format_summary(tmp_path, 1)
    assert ("EXCEPTION IN USERS: 2 x BackendUnavailable: kafka: no broker (at "
            "hps/loadtest/users/kafka.py:59 in on_start)") in out  # fmt: skip
    assert "FAILED (exceptions in users)" in out
