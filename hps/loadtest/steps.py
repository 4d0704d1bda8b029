"""Load shapes as stages, and per-stage statistics of the readers (the ramp's knee).

``stages`` turns a shape into ``(end second, reader users)`` stages:

- ``steady``: ``users`` readers for the whole run;
- ``ramp``: ``steps`` equal stages from ``users / steps`` up to ``users`` readers; the knee is
  the stage of highest reader throughput whose p99 stays under a bound;
- ``spike``: a quarter of ``users`` for 40 % of the run, all of them for 20 %, a quarter again
  (the last stage shows whether latency recovers).

Users of fixed count (publisher, freshness prober, control plane reader) come on top.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SHAPES = ("steady", "ramp", "spike")


def stages(
    shape: str, users: int, run_time: float, steps: int = 8, phases: int = 0
) -> list[tuple[float, int]]:
    """``(end time in s, reader users)`` per stage of ``shape`` (``phases``: see
    :func:`updates_on`; a steady run is cut into that many equal stages)."""
    users = max(1, users)
    if shape == "steady":
        n = max(1, phases)
        return [(run_time * (i + 1) / n, users) for i in range(n)]
    if shape == "ramp":
        steps = max(1, min(steps, users))
        return [
            (run_time * (i + 1) / steps, max(1, round(users * (i + 1) / steps)))
            for i in range(steps)
        ]
    if shape == "spike":
        base = max(1, users // 4)
        return [(run_time * 0.4, base), (run_time * 0.6, users), (run_time, base)]
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def updates_on(phases: int, stage: int | None) -> bool:
    """With ``phases`` (> 0), bulk updates flow in odd stages only (off, on, off, on, ...),
    so reads with and without updates are compared within one run; 0: always on."""
    return phases <= 0 or (stage is not None and stage % 2 == 1)


def stage_at(plan: list[tuple[float, int]], t: float) -> int | None:
    """Index of the stage running at ``t`` seconds, None once the plan is over."""
    for i, (end, _) in enumerate(plan):
        if t < end:
            return i
    return None


@dataclass
class StageStats:
    users: int
    start: float
    end: float = 0.0
    times_ms: list[float] = field(default_factory=list)
    failures: int = 0

    def row(self, index: int) -> dict[str, float | int]:
        t = np.asarray(self.times_ms) if self.times_ms else np.zeros(1)
        seconds = max(self.end - self.start, 1e-9)
        return {
            "stage": index,
            "users": self.users,
            "seconds": round(seconds, 2),
            "requests": len(self.times_ms),
            "failures": self.failures,
            "rps": round(len(self.times_ms) / seconds, 2),
            "p50_ms": round(float(np.percentile(t, 50)), 1),
            "p99_ms": round(float(np.percentile(t, 99)), 1),
        }


class StageRecorder:
    """Reader response times per stage (fed by Locust's request event). A request that
    finishes after the plan's end (started in its last seconds, or slow) counts in the last
    stage, whose ``seconds`` then run to it."""

    def __init__(self, plan: list[tuple[float, int]], readers: set[str]) -> None:
        self.plan = plan
        self.readers = readers  # request types ("grpc lookup", ...) that count as reads
        self.stats: list[StageStats] = []

    def record(self, t: float, request_type: str, response_ms: float, failed: bool) -> None:
        if request_type not in self.readers:
            return
        index = stage_at(self.plan, t)
        if index is None:
            index = len(self.plan) - 1
        while len(self.stats) <= index:
            i = len(self.stats)
            start = self.plan[i - 1][0] if i else 0.0
            if self.stats:
                self.stats[-1].end = start
            self.stats.append(StageStats(self.plan[i][1], start))
        stage = self.stats[index]
        stage.end = max(stage.end, t)
        stage.times_ms.append(response_ms)
        stage.failures += int(failed)

    def compare_updates(self, phases: int) -> dict[str, dict[str, float | int]]:
        """Reads pooled over the stages without bulk updates and over those with them."""
        if phases <= 0:
            return {}
        out = {}
        for label, on in (("without", False), ("with", True)):
            picked = [s for i, s in enumerate(self.stats) if updates_on(phases, i) == on]
            pooled = StageStats(picked[0].users if picked else 0, 0.0)
            for s in picked:
                pooled.times_ms += s.times_ms
                pooled.failures += s.failures
            pooled.end = sum(s.end - s.start for s in picked)
            row = pooled.row(0)
            del row["stage"]
            out[label] = row
        return out

    def rows(self) -> list[dict[str, float | int]]:
        return [s.row(i) for i, s in enumerate(self.stats)]

    def write(self, path: Path) -> list[dict[str, float | int]]:
        rows = self.rows()
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(StageStats(0, 0).row(0)))
            w.writeheader()
            w.writerows(rows)
        return rows


def knee(rows: list[dict[str, float | int]], p99_bound_ms: float) -> dict[str, float | int] | None:
    """The stage of highest throughput whose p99 stays under the bound (None: no such stage)."""
    ok = [r for r in rows if r["requests"] and float(r["p99_ms"]) <= p99_bound_ms]
    return max(ok, key=lambda r: float(r["rps"])) if ok else None
