"""The final statistics of a run, the ones its thresholds were checked against: ``stats.json``.

Locust rewrites its ``--csv`` files once a second and not at shutdown, so their last rows
can be a second old (all zeros after a short run). The locustfile's ``quitting`` listener
writes this file from Locust's live statistics instead (:func:`snapshot`, :func:`write`):
per request type (``"grpc lookup"``, ..., ``"Aggregated"``) its requests, failures, req/s
and p50 / p95 / p99 in ms, and every distinct failure with its count. The summary and
``hps bench freshness`` read it back (:func:`read`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from hps.loadtest.thresholds import AGGREGATED, Entry, entry_type

REPORT = "stats.json"


class Error(Protocol):
    """What is read of one distinct failure (``locust.stats.StatsError``)."""

    @property
    def method(self) -> str | None: ...
    @property
    def name(self) -> str: ...
    @property
    def error(self) -> object: ...
    @property
    def occurrences(self) -> int: ...


def figures(e: Entry) -> dict[str, float]:
    """One request type's figures (latencies 0 when it has no request)."""
    n = e.num_requests

    def pct(q: float) -> float:
        return float(e.get_response_time_percentile(q)) if n else 0.0

    return {
        "requests": n,
        "failures": e.num_failures,
        "rps": round(float(e.total_rps), 3),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
    }


def _text(error: object) -> str:
    """A failure as Locust's own reports write it (an exception as its repr)."""
    return error if isinstance(error, str) else repr(error)


def snapshot(entries: Iterable[Entry], total: Entry, errors: Iterable[Error]) -> dict[str, Any]:
    """``{"types": {type: figures}, "errors": [{"type", "error", "occurrences"}]}``, the
    types in name order then ``"Aggregated"``, the errors most frequent first."""
    types = {entry_type(e): figures(e) for e in entries}
    doc_types = {k: types[k] for k in sorted(types)}
    doc_types[AGGREGATED] = figures(total)
    errs = [
        {"type": f"{e.method} {e.name}" if e.method else e.name, "error": _text(e.error),
         "occurrences": e.occurrences}
        for e in sorted(errors, key=lambda e: -e.occurrences)
    ]  # fmt: skip
    return {"types": doc_types, "errors": errs}


def write(report_dir: Path, doc: dict[str, Any]) -> None:
    (report_dir / REPORT).write_text(json.dumps(doc, indent=1) + "\n")


def read(report_dir: Path) -> dict[str, Any]:
    """The run's ``stats.json`` (no types and no errors when the run wrote none)."""
    path = report_dir / REPORT
    doc = json.loads(path.read_text()) if path.exists() else {}
    return {"types": doc.get("types") or {}, "errors": doc.get("errors") or []}
