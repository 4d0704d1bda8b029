"""The one-screen summary of a load test, read back from its report folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hps.loadtest import freshness
from hps.loadtest.steps import knee


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(text: str) -> float:
    """A number of Locust's CSV ("N/A" where no request succeeded)."""
    try:
        return float(text)
    except ValueError:
        return 0.0


def read_report(report_dir: Path) -> dict[str, Any]:
    """Per request type (``"grpc lookup"``, ..., ``"Aggregated"``): counts and latencies."""
    types: dict[str, dict[str, float]] = {}
    for r in _rows(report_dir / "locust_stats.csv"):
        name = f"{r['Type']} {r['Name']}".strip() if r["Type"] else r["Name"]
        types[name] = {
            "requests": int(r["Request Count"]),
            "failures": int(r["Failure Count"]),
            "rps": _num(r["Requests/s"]),
            "p50_ms": _num(r["50%"]),
            "p95_ms": _num(r["95%"]),
            "p99_ms": _num(r["99%"]),
        }
    verdict_file = report_dir / "verdict.json"
    verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else {}
    failures = [
        (int(r["Occurrences"]), f"{r['Method']} {r['Name']}: {r['Error']}")
        for r in _rows(report_dir / "locust_failures.csv")
    ]
    return {
        "types": types,
        "verdict": verdict,
        "failures": sorted(failures, reverse=True),
        "freshness": freshness.Figures(
            freshness.probes(types),
            freshness.probes(types, freshness.VISIBLE),
            freshness.read(report_dir),
        ),
    }


def format_summary(
    report_dir: Path,
    exit_code: int,
    *,
    started: list[str] | None = None,
    knee_p99_ms: float | None = None,
) -> str:
    rep = read_report(report_dir)
    lines = []
    if started:
        lines.append("started: " + "; ".join(s.split(" (")[0] for s in started))
    lines.append(f"{'request type':<40}{'reqs':>8}{'fail':>6}{'req/s':>9}"
                 f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")  # fmt: skip
    for name, t in rep["types"].items():
        lines.append(
            f"{name[:39]:<40}{t['requests']:>8}{t['failures']:>6}{t['rps']:>9.1f}"
            f"{t['p50_ms']:>9.0f}{t['p95_ms']:>9.0f}{t['p99_ms']:>9.0f}"
        )
    fresh = rep["freshness"].line()
    if fresh:
        lines.append(fresh)
    stages = rep["verdict"].get("stages") or []
    if len(stages) > 1:
        lines.append("stages (readers): " + "  ".join(
            f"{s['users']}u {s['rps']:.0f}/s p99 {s['p99_ms']:.0f}ms" for s in stages))  # fmt: skip
    if knee_p99_ms is not None and stages:
        k = knee(stages, knee_p99_ms)
        lines.append(
            f"knee (p99 <= {knee_p99_ms:g} ms): "
            + (
                f"{k['users']} users, {k['rps']} req/s, p50 {k['p50_ms']} ms, p99 {k['p99_ms']} ms"
                if k
                else "none: every stage broke the bound"
            )  # fmt: skip
        )
    ab = rep["verdict"].get("reads_and_updates") or {}
    if ab.get("with") and ab.get("without") and ab["without"]["p99_ms"]:
        w, wo = ab["with"], ab["without"]
        lines.append(
            f"reads without bulk updates: {wo['rps']:.1f}/s p50 {wo['p50_ms']:.0f} ms p99 "
            f"{wo['p99_ms']:.0f} ms; with them: {w['rps']:.1f}/s p50 {w['p50_ms']:.0f} ms "
            f"p99 {w['p99_ms']:.0f} ms (p99 x{w['p99_ms'] / wo['p99_ms']:.2f})"
        )
    for count, what in rep["failures"][:5]:
        lines.append(f"  {count} x {what[:150]}")
    violations = rep["verdict"].get("violations")
    if violations:
        lines += [f"THRESHOLD BROKEN: {v}" for v in violations]
    outcome = {0: "PASSED", 1: "FAILED (thresholds)", 124: "FAILED (timed out)"}
    verdict = outcome.get(exit_code, f"FAILED (locust exit {exit_code})")
    lines.append(f"{verdict}; reports: {report_dir} (report.html, locust_*.csv, stages.csv, *.log)")
    return "\n".join(lines)
