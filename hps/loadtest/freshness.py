"""Freshness as the serving processes measure it, beside the probes' figure.

The probes (:class:`hps.loadtest.users.kafka.Prober`) time ``publish()`` to the first lookup
that returns the new vectors (``kafka freshness`` in Locust's statistics) and to the moment
Triton began serving them (``kafka visible``: without the lookup's own latency). The serving
processes export ``hps_update_freshness_seconds`` (every update message, bulk ones too, from
its publish timestamp to the moment the process serves it; docs/updates.md). ``hps loadtest``
reads that histogram from Triton's /metrics once the warm-up is over and after the run
(:func:`snapshot`, :class:`Baseline`), keeps the run's observations (:func:`window`) and
writes both figures to ``freshness.json`` in the report folder (with the run's
``hps_update_stage_seconds`` per stage, of the serving processes and of the stack's ``hps
consume``: :func:`stage_windows`); the summary prints the figures side by side, and the
metric over ``kafka visible``, which times the same instant.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from hps.errors import HPSError
from hps.updates.metrics import Buckets, histograms, merged, subtract, summary

REPORT = "freshness.json"
TIMEOUT_S = 5.0

Snapshot = dict[tuple[str, str, str], Buckets]
"""(family, Triton model, table or stage) -> buckets; family ``fresh`` or ``stage``."""


CONSUMER = "hps consume"
"""The model column of ``hps consume``'s stages in a :data:`Snapshot` (it has no model label:
one consumer applies every model's updates)."""


def snapshot(metrics_url: str, consumer_url: str = "") -> Snapshot | str:
    """``hps_update_freshness_seconds`` per (model, table) and ``hps_update_stage_seconds``
    per (model, stage) from Triton's /metrics (summed over processes), and, with
    ``consumer_url``, ``hps consume``'s stages (model :data:`CONSUMER`); or why not read."""
    from hps.service.triton_admin import metrics_text

    try:
        text = metrics_text(metrics_url, TIMEOUT_S)
        consumer = metrics_text(consumer_url, TIMEOUT_S) if consumer_url else ""
    except HPSError as exc:
        return str(exc)
    out: Snapshot = {}
    for family, name, label in (
        ("fresh", "hps_update_freshness_seconds", "table"),
        ("stage", "hps_update_stage_seconds", "stage"),
    ):
        for (model, value), buckets in histograms(text, name, ("model", label)).items():
            out[(family, model, value)] = buckets
    for (stage,), buckets in histograms(consumer, "hps_update_stage_seconds", ("stage",)).items():
        out[("stage", CONSUMER, stage)] = buckets
    return out


class Baseline:
    """What a run's metric figures count from: a snapshot at the start, replaced by one taken
    when the warm-up ends (a timer thread), so that, like the probes
    (:class:`hps.loadtest.users.kafka.Prober`), they describe the run after its warm-up. Its
    clock starts when Locust is started, the probes' at Locust's first tick, a second or two
    later: the metric's window begins that much sooner."""

    def __init__(self, metrics_url: str, consumer_url: str, warmup_s: float) -> None:
        self._read = partial(snapshot, metrics_url, consumer_url)
        self.snapshot = self._read()
        self._timer = threading.Timer(warmup_s, self._retake)
        self._timer.daemon = True
        self._timer.start()

    def _retake(self) -> None:
        taken = self._read()
        if not isinstance(taken, str):  # unreadable now: the start's snapshot stands
            self.snapshot = taken

    def stop(self) -> Snapshot | str:
        """The baseline, once no snapshot is being taken any more."""
        self._timer.cancel()
        self._timer.join()
        return self.snapshot


@dataclass(frozen=True)
class Figure:
    """Freshness over a run: how many updates (probes or messages), p50 and p99 in ms."""

    count: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    error: str | None = None  # why the figure could not be read

    @classmethod
    def of(cls, doc: object) -> Figure | None:
        if not isinstance(doc, dict):
            return None
        return cls(**{k: v for k, v in doc.items() if k in FIELDS})


FIELDS = ("count", "p50_ms", "p99_ms", "error")


def window(before: Snapshot | str, after: Snapshot | str, model: str) -> Figure:
    """The freshness of ``model`` (and ``<model>_ctr``) observed between two snapshots."""
    if isinstance(after, str):
        return Figure(error=after)
    return _figure(_run(before, after, model, "fresh").values())


def stage_windows(before: Snapshot | str, after: Snapshot | str, model: str) -> dict[str, Figure]:
    """Per stage, between two snapshots: what the run's updates spent where, in the serving
    processes (their embedded appliers, or their L1 refresh) and in ``hps consume``. No stage
    is recorded by both: a process that applies updates itself has no ``hps consume``."""
    if isinstance(after, str):
        return {}
    run = _run(before, after, model, "stage")
    return {stage: _figure([b]) for stage, b in sorted(run.items())}


def _run(before: Snapshot | str, after: Snapshot, model: str, family: str) -> dict[str, Buckets]:
    prior = before if isinstance(before, dict) else {}
    served = (model, f"{model}_ctr", CONSUMER)
    by_label: dict[str, list[Buckets]] = {}
    for key, b in after.items():
        if key[0] == family and key[1] in served:
            by_label.setdefault(key[2], []).append(subtract(b, prior.get(key, [])))
    return {label: merged(parts) for label, parts in by_label.items()}


def _figure(parts: Iterable[Buckets]) -> Figure:
    s = summary(merged(parts))
    return Figure(int(s["count"] or 0), _ms(s["p50_s"]), _ms(s["p99_s"]))


def _ms(seconds: float | int | None) -> float | None:
    return None if seconds is None else round(float(seconds) * 1000.0, 1)


PROBES = "kafka freshness"
VISIBLE = "kafka visible"
WARMUP = " (warm-up)"
"""Appended to the names of the probes started during the warm-up (reported apart)."""


def probes(types: dict[str, dict[str, float]], name: str = PROBES) -> Figure | None:
    """A probes' figure from Locust's statistics (``read_report(...)["types"]``): ``PROBES``
    (publish to the first lookup returned with the update) or ``VISIBLE`` (publish to when
    Triton began serving it, :func:`visible_after`)."""
    t = types.get(name)
    if not t or not t["requests"]:
        return None
    return Figure(int(t["requests"]), t["p50_ms"], t["p99_ms"])


def visible_after(publish_ns: int, lookups: list[tuple[int, bool]]) -> float | None:
    """Seconds from ``publish_ns`` to when the update became visible, from the probe's
    lookups as (start in Triton, ns since the epoch; returned the update): the middle of the
    interval between the last start that missed it (or the publish) and the first start
    that returned it. None when no lookup returned it."""
    fresh = [start for start, seen in lookups if seen]
    if not fresh:
        return None
    first = min(fresh)
    missed = [start for start, seen in lookups if not seen and start < first]
    lower = max([publish_ns, *missed])
    return max(0.0, ((lower + first) / 2 - publish_ns) / 1e9)


def write(report_dir: Path, metric: Figure, stages: dict[str, Figure] | None = None) -> None:
    doc = {"metric": asdict(metric), "stages": {k: asdict(f) for k, f in (stages or {}).items()}}
    (report_dir / REPORT).write_text(json.dumps(doc, indent=1) + "\n")


def read(report_dir: Path) -> Figure | None:
    """The metric's figure of a run (None when the run read none)."""
    path = report_dir / REPORT
    if not path.exists():
        return None
    return Figure.of(json.loads(path.read_text()).get("metric"))


@dataclass(frozen=True)
class Figures:
    """The figures of a run. ``ratio``: the metric's p50 or p99 over the ``visible`` probe
    figure's, which times the same instant (publish to served); ``probes`` adds one lookup."""

    probes: Figure | None
    visible: Figure | None
    metric: Figure | None

    def ratio(self, q: str) -> float | None:
        a = getattr(self.metric, q) if self.metric else None
        b = getattr(self.visible, q) if self.visible else None
        return round(a / b, 3) if a is not None and b else None

    def line(self) -> str | None:
        """One summary line, or None when no figure exists."""
        probe, visible, metric = self.probes, self.visible, self.metric
        if probe is None and metric is None:
            return None
        parts = []
        if probe is not None:
            parts.append(f"probes p50 {probe.p50_ms or 0:.0f} ms p99 {probe.p99_ms or 0:.0f} ms "
                         f"({probe.count} probes)")  # fmt: skip
        if visible is not None:
            parts.append(f"visible p50 {visible.p50_ms or 0:.0f} ms p99 "
                         f"{visible.p99_ms or 0:.0f} ms")  # fmt: skip
        if metric is not None and metric.error:
            parts.append(f"hps_update_freshness_seconds unread: {metric.error}")
        elif metric is not None and metric.count:
            parts.append(f"hps_update_freshness_seconds p50 {metric.p50_ms or 0:.0f} ms p99 "
                         f"{metric.p99_ms or 0:.0f} ms ({metric.count} messages)")  # fmt: skip
        elif metric is not None:
            parts.append("hps_update_freshness_seconds: no update served during the run")
        p50, p99 = self.ratio("p50_ms"), self.ratio("p99_ms")
        if p50 is not None and p99 is not None:
            parts.append(f"metric/visible p50 x{p50:.2f} p99 x{p99:.2f}")
        return "freshness: " + "; ".join(parts)
