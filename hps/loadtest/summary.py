"""The one-screen summary of a load test, read back from its report folder.

Its figures come from ``stats.json`` (:mod:`hps.loadtest.stats`: Locust's final statistics,
the ones the thresholds were checked against), never from Locust's CSV files, which lag;
its verdict from ``verdict.json`` (:mod:`hps.loadtest.verdict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hps.loadtest import freshness, stats
from hps.loadtest.steps import knee
from hps.loadtest.verdict import causes

REPORTS = "report.html, stats.json, verdict.json, stages.csv, locust_*.csv, *.log"


def read_report(report_dir: Path) -> dict[str, Any]:
    """Per request type (``"grpc lookup"``, ..., ``"Aggregated"``): counts and latencies;
    the failures, most frequent first; the verdict and the freshness figures."""
    final = stats.read(report_dir)
    types: dict[str, dict[str, float]] = final["types"]
    verdict_file = report_dir / "verdict.json"
    verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else {}
    failures = [(int(e["occurrences"]), f"{e['type']}: {e['error']}") for e in final["errors"]]
    return {
        "types": types,
        "verdict": verdict,
        "failures": failures,
        "freshness": freshness.Figures(
            freshness.probes(types),
            freshness.probes(types, freshness.VISIBLE),
            freshness.read(report_dir),
        ),
    }


def outcome(exit_code: int, verdict: dict[str, Any]) -> str:
    """``PASSED``, or ``FAILED (why)``: the causes the verdict names, else the exit code."""
    if exit_code == 0:
        return "PASSED"
    if exit_code == 124:
        return "FAILED (timed out)"
    why = causes(verdict)
    return f"FAILED ({'; '.join(why)})" if why else f"FAILED (locust exit {exit_code})"


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
    # A space between every two columns: a figure wider than its column pushes the rest
    # right but never runs into its neighbour.
    lines.append(f"{'request type':<39} {'reqs':>9} {'fail':>8} {'req/s':>9} "
                 f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")  # fmt: skip
    for name, t in rep["types"].items():
        lines.append(
            f"{name[:39]:<39} {t['requests']:>9} {t['failures']:>8} {t['rps']:>9.1f} "
            f"{t['p50_ms']:>8.0f} {t['p95_ms']:>8.0f} {t['p99_ms']:>8.0f}"
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
    for crash in rep["verdict"].get("exceptions") or []:
        at = f" (at {crash['where']})" if crash.get("where") else ""
        lines.append(f"EXCEPTION IN USERS: {crash['count']} x {crash['type']}: "
                     f"{str(crash['message'])[:150]}{at}")  # fmt: skip
    lines += [f"THRESHOLD BROKEN: {v}" for v in rep["verdict"].get("violations") or []]
    lines.append(f"{outcome(exit_code, rep['verdict'])}; reports: {report_dir} ({REPORTS})")
    return "\n".join(lines)
