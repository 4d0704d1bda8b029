"""Pass/fail limits per request type, checked when the load test ends.

A thresholds file is JSON: request type -> limits. The request type is Locust's
``"<type> <name>"``, one of :data:`REQUEST_TYPES` (e.g. ``"grpc lookup"``, ``"kafka
freshness"``, ``"GET /readyz"``), ``"Aggregated"`` for all requests together, or ``"*"`` for
every type that ran (a type's own limits override those of ``"*"``)::

    {"*": {"max_fail_ratio": 0.0},
     "grpc lookup": {"p99_ms": 2000, "min_rps": 5},
     "kafka freshness": {"p99_ms": 1000, "min_requests": 5}}

Limits: ``max_fail_ratio`` (failures / requests), ``p50_ms``, ``p95_ms``, ``p99_ms`` (upper
bounds), ``min_rps`` (a floor on throughput: a collapse fails the run) and
``min_requests`` (the type must have run at least that often); each a finite number, 0 or
more (NaN, infinity or ``true`` are refused). A type named in the
thresholds that never ran fails, whatever its limits; a name that is no request type is
refused when the thresholds are loaded (:func:`load_thresholds`), before anything runs. A
run without a single request always fails. Options add to or override the file:
``--threshold "grpc lookup:p99_ms=500,max_fail_ratio=0"`` (repeatable, ``;``-separated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hps.errors import ConfigError
from hps.loadtest.freshness import PROBES, VISIBLE, WARMUP

LIMITS = ("max_fail_ratio", "p50_ms", "p95_ms", "p99_ms", "min_rps", "min_requests")
ALL = "*"
AGGREGATED = "Aggregated"
REQUEST_TYPES = (
    "grpc lookup",
    "http lookup",
    "grpc ctr",
    "grpc bad request",
    "kafka publish",
    PROBES,
    VISIBLE,
    PROBES + WARMUP,
    VISIBLE + WARMUP,
    "GET /readyz",
    "GET /v1/models",
    "GET /v1/models/{model}/tables/{table}",
)
"""Every request type the users of :mod:`hps.loadtest.users` report (docs/loadtest.md)."""

Thresholds = dict[str, dict[str, float]]


class Entry(Protocol):
    """What a threshold reads of one Locust stats entry (``locust.stats.StatsEntry``)."""

    @property
    def method(self) -> str | None: ...
    @property
    def name(self) -> str: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def num_failures(self) -> int: ...
    @property
    def total_rps(self) -> float: ...

    def get_response_time_percentile(self, percent: float) -> float: ...


@dataclass(frozen=True)
class Violation:
    request_type: str
    limit: str
    bound: float
    value: float

    def __str__(self) -> str:
        op = ">=" if self.limit.startswith("min_") else "<="
        return f"{self.request_type}: {self.limit} {self.value:.4g} (must be {op} {self.bound:g})"


def _check_limits(where: str, limits: object) -> dict[str, float]:
    if not isinstance(limits, Mapping):
        raise ConfigError(f"{where}: expected an object of limits, got {limits!r}")
    out = {}
    for key, value in limits.items():
        if key not in LIMITS:
            raise ConfigError(f"{where}: unknown limit {key!r}; known: {', '.join(LIMITS)}")
        try:
            if isinstance(value, bool):  # JSON true is no bound
                raise TypeError
            out[key] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}") from None
        # NaN compares false both ways: as a bound it would switch the check off
        if not math.isfinite(out[key]):
            raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
        if out[key] < 0:
            raise ConfigError(f"{where}: {key} must not be negative")
    return out


def _check_type(where: str, rtype: str) -> str:
    if rtype not in (*REQUEST_TYPES, AGGREGATED, ALL):
        raise ConfigError(
            f"{where}: unknown request type {rtype!r}; known: {', '.join(REQUEST_TYPES)}, "
            f"{AGGREGATED!r} (all of them) and {ALL!r} (each that ran)"
        )
    return rtype


def load_thresholds(path: str | Path | None, specs: Iterable[str] = ()) -> Thresholds:
    """The file's thresholds (if any), then each ``TYPE:limit=value,...`` spec on top.

    Raises :class:`ConfigError` naming the entry for an unknown request type or limit."""
    result: Thresholds = {}
    if path:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"thresholds file {path}: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"thresholds file {path}: expected a JSON object")
        for rtype, limits in doc.items():
            _check_type(f"thresholds file {path}", rtype)
            result[rtype] = _check_limits(f"{path}: {rtype!r}", limits)
    for spec in (s for group in specs for s in group.split(";") if s.strip()):
        rtype, sep, body = spec.rpartition(":")
        if not sep or not rtype.strip():
            raise ConfigError(f"--threshold {spec!r}: expected TYPE:limit=value[,limit=value]")
        pairs = [p.split("=", 1) for p in body.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError(f"--threshold {spec!r}: expected limit=value pairs after ':'")
        limits = _check_limits(f"--threshold {spec!r}", {k.strip(): v for k, v in pairs})
        result.setdefault(_check_type(f"--threshold {spec!r}", rtype.strip()), {}).update(limits)
    return result


def entry_type(entry: Entry) -> str:
    return f"{entry.method} {entry.name}" if entry.method else entry.name


def evaluate(
    thresholds: Thresholds, entries: Iterable[Entry], total: Entry | None = None
) -> list[Violation]:
    """Every limit broken by the entries (``total``: Locust's aggregated entry), and a
    ``min_requests`` violation for each type the thresholds name that never ran."""
    by_type = {entry_type(e): e for e in entries}
    if total is not None:
        by_type[AGGREGATED] = total
    out: list[Violation] = []
    if total is not None and total.num_requests == 0:  # nothing ran: nothing was tested
        out.append(Violation(AGGREGATED, "min_requests", 1, 0))
    every = thresholds.get(ALL, {})
    for rtype, entry in by_type.items():
        # A type's own limits override the "*" ones (Aggregated takes only its own).
        limits = thresholds.get(rtype, {}) if rtype == AGGREGATED else {
            **every, **thresholds.get(rtype, {})
        }  # fmt: skip
        out += _entry_violations(rtype, entry, limits)
    for rtype, limits in thresholds.items():
        if rtype not in by_type and rtype != ALL:  # named, never ran: nothing was tested
            bound = max(1.0, limits.get("min_requests", 1.0))
            out.append(Violation(rtype, "min_requests", bound, 0))
    return out


def _entry_violations(rtype: str, e: Entry, limits: Mapping[str, float]) -> list[Violation]:
    n = e.num_requests  # failures included, as Locust counts
    values = {
        "max_fail_ratio": e.num_failures / n if n else 0.0,
        "p50_ms": e.get_response_time_percentile(0.50) if e.num_requests else 0.0,
        "p95_ms": e.get_response_time_percentile(0.95) if e.num_requests else 0.0,
        "p99_ms": e.get_response_time_percentile(0.99) if e.num_requests else 0.0,
        "min_rps": e.total_rps,
        "min_requests": float(n),
    }
    out = []
    for limit, bound in limits.items():
        value = values[limit]
        broken = value < bound if limit.startswith("min_") else value > bound
        if broken:
            out.append(Violation(rtype, limit, bound, value))
    return out
