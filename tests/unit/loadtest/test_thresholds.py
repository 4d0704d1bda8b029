"""Thresholds: parsing the file and options, and which limits a run breaks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hps.errors import ConfigError
from hps.loadtest.thresholds import evaluate, load_thresholds


@dataclass
class Entry:
    """The part of Locust's StatsEntry the thresholds read, over real response times."""

    method: str | None
    name: str
    times: list[float]
    num_failures: int = 0
    seconds: float = 10.0

    @property
    def num_requests(self) -> int:
        return len(self.times)

    @property
    def total_rps(self) -> float:
        return self.num_requests / self.seconds

    def get_response_time_percentile(self, percent: float) -> float:
        return float(np.percentile(self.times, percent * 100))


def test_file_and_options_merge(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"*": {"max_fail_ratio": 0}, "grpc lookup": {"p99_ms": 100}}))
    got = load_thresholds(f, ["grpc lookup:p99_ms=50,min_rps=2;kafka freshness:p99_ms=1000"])
    assert got == {
        "*": {"max_fail_ratio": 0.0},
        "grpc lookup": {"p99_ms": 50.0, "min_rps": 2.0},
        "kafka freshness": {"p99_ms": 1000.0},
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("grpc lookup:p98_ms=1", "unknown limit 'p98_ms'"),
        ("grpc lookup:p99_ms=fast", "must be a number"),
        ("p99_ms=1", "expected TYPE:limit"),
        ("grpc lookup:p99_ms=-1", "must not be negative"),
        # NaN compares false both ways: as a bound it would switch the check off
        ("*:max_fail_ratio=nan", "max_fail_ratio must be a finite number, got 'nan'"),
        ("grpc lookup:p99_ms=NaN", "p99_ms must be a finite number"),
        ("grpc lookup:min_rps=inf", "min_rps must be a finite number"),
        ("grpc lookup:p99_ms=1e400", "p99_ms must be a finite number"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_thresholds(None, [spec])


@pytest.mark.parametrize("bound", ["NaN", "Infinity", "true"])
def test_a_file_bound_that_is_no_finite_number_is_refused(tmp_path: Path, bound: str) -> None:
    f = tmp_path / "t.json"
    f.write_text(f'{{"grpc lookup": {{"max_fail_ratio": {bound}}}}}')
    with pytest.raises(ConfigError, match="max_fail_ratio must be a"):
        load_thresholds(f)


def test_bad_file(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text("[1]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_thresholds(f)


def test_violations() -> None:
    fast = Entry("grpc", "lookup", [10.0] * 95 + [400.0] * 5)
    failing = Entry("http", "lookup", [5.0] * 10, num_failures=1)
    total = Entry(None, "Aggregated", fast.times + failing.times, num_failures=1)
    th = load_thresholds(None, [
        "*:max_fail_ratio=0", "grpc lookup:p50_ms=20,p99_ms=100,min_rps=20",
        "kafka freshness:min_requests=1", "Aggregated:max_fail_ratio=0.01",
    ])  # fmt: skip
    got = {(v.request_type, v.limit) for v in evaluate(th, [fast, failing], total)}
    assert got == {
        ("http lookup", "max_fail_ratio"),
        ("grpc lookup", "p99_ms"),
        ("grpc lookup", "min_rps"),
        ("kafka freshness", "min_requests"),
    }
    assert not evaluate(load_thresholds(None, ["grpc lookup:p99_ms=1000"]), [fast], total)
    # A type's own limit overrides "*".
    relaxed = load_thresholds(None, ["*:max_fail_ratio=0", "http lookup:max_fail_ratio=0.5"])
    assert not evaluate(relaxed, [fast, failing], total)
    nothing = Entry(None, "Aggregated", [])
    assert [str(v) for v in evaluate({}, [], nothing)] == [
        "Aggregated: min_requests 0 (must be >= 1)"
    ]


@pytest.mark.parametrize(
    ("doc", "specs", "named"),
    [
        ({"grpc lookups": {"p99_ms": 1}}, [], "'grpc lookups'"),
        ({"kafka  freshness": {"p99_ms": 1}}, [], "'kafka  freshness'"),
        (None, ["admin GET /readyz:max_fail_ratio=0.5"], "'admin GET /readyz'"),
    ],
)
def test_a_name_that_is_no_request_type_is_refused_when_loaded(
    tmp_path: Path, doc: dict[str, object] | None, specs: list[str], named: str
) -> None:
    path = None
    if doc is not None:
        path = tmp_path / "t.json"
        path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=f"unknown request type {named}"):
        load_thresholds(path, specs)


def test_a_named_type_that_never_ran_fails_whatever_its_limits() -> None:
    ran = Entry("grpc", "lookup", [10.0] * 10)
    total = Entry(None, "Aggregated", ran.times)
    th = load_thresholds(None, ["kafka freshness:p99_ms=1000", "GET /readyz:max_fail_ratio=0.5"])
    got = [str(v) for v in evaluate(th, [ran], total)]
    assert got == [
        "kafka freshness: min_requests 0 (must be >= 1)",
        "GET /readyz: min_requests 0 (must be >= 1)",
    ]
    # "*" names no type: it only applies to those that ran
    assert not evaluate(load_thresholds(None, ["*:max_fail_ratio=0"]), [ran], total)


@pytest.mark.parametrize("name", ["ci-thresholds.json", "soak-thresholds.json"])
def test_the_shipped_threshold_files_load(name: str) -> None:
    th = load_thresholds(Path(__file__).resolve().parents[3] / "loadtests" / name)
    assert th["*"] == {"max_fail_ratio": 0.0} and "kafka freshness" in th
