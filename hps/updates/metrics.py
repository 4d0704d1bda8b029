"""Prometheus metrics of the update path (``hps consume --metrics-port`` serves them), the
per-stage timing that travels with each update, and the histogram math that reads them back.

Timing (docs/updates.md, "Where the time goes"): every update message carries its publish
timestamp, the Kafka message timestamp (the broker's ``LogAppendTime`` where the topic uses
it, else the producer's ``CreateTime``). Each process that handles the message records what
it did with it through a :class:`Recorder`:

- ``hps consume`` and the embedded applier: stage durations (:data:`STAGES`) in
  ``hps_update_stage_seconds{stage}``;
- every serving process: ``hps_update_freshness_seconds{table}``, from the publish timestamp
  to the moment the process serves the update (:class:`BufferedRecorder`, flushed into
  Triton's /metrics by :mod:`hps.triton.model.metrics`, which also sends on the
  ``hps_updates_*`` counters and lag of the process's update thread:
  :data:`FORWARDED_COUNTERS`).

Ages measured against a timestamp from another machine's clock (:func:`age_s`) are clamped
at 0 when negative (that clock runs ahead of ours) and counted in
``hps_update_clock_skew_total``; ``hps_update_clock_ahead_seconds`` keeps the largest such
lead seen, an estimate of the skew that the figures may be short by.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram

CONSUMER_LAG = Gauge(
    "hps_updates_consumer_lag",
    "Messages published but not yet applied, per assigned partition",
    ["topic", "partition"],
)
APPLIED_ROWS = Counter("hps_updates_applied_rows_total", "Rows applied to L2/L3", ["table", "kind"])
STALE_ROWS = Counter(
    "hps_updates_stale_rows_total", "Rows skipped because a newer version was applied", ["table"]
)
MESSAGES = Counter("hps_updates_messages_total", "Update messages consumed", ["format"])
DEAD_LETTERS = Counter(
    "hps_updates_dead_letters_total",
    "Messages dead-lettered (sent to the dead-letter topic, or logged where there is none)",
    ["reason"],
)
FAILURES = Counter(
    "hps_updates_apply_failures_total", "Batch applications that failed and were retried"
)
BATCH_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
BATCH_SECONDS = Histogram(
    "hps_updates_batch_seconds",
    "Time to apply one batch to L2 and L3 (durably)",
    buckets=BATCH_BUCKETS,
)
RECORD_NODES = Gauge(
    "hps_updates_version_record_nodes",
    "Serving nodes whose version records this consumer merged at its last sync "
    "(hps consume --versions-from-l2)",
)
L1_REFRESHED = Counter(
    "hps_updates_l1_refreshed_keys_total",
    "Keys resident in L1 that an update gave a new row or evicted (serving processes)",
    ["table"],
)

FORWARDED_COUNTERS: dict[str, Counter] = {
    "applied_rows": APPLIED_ROWS,
    "stale_rows": STALE_ROWS,
    "messages": MESSAGES,
    "dead_letters": DEAD_LETTERS,
    "apply_failures": FAILURES,
    "l1_refreshed": L1_REFRESHED,
}
"""The counters a serving process's update thread keeps in this process's registry, which
nothing serves there: :mod:`hps.triton.model.metrics` sends them on to Triton's /metrics
(with :data:`CONSUMER_LAG`, and :data:`BATCH_SECONDS` through a :class:`BufferedRecorder`)."""

# -- per-stage timing -------------------------------------------------------------------------

STAGES: dict[str, str] = {
    "delivery": "publish timestamp -> the consumer's poll returned the message (per message)",
    "batch": "first message of a batch received -> the batch is complete (per batch)",
    "decode": "decoding and checking the batch's messages (per batch)",
    "l3_write": "the batch's rows and versions written to L3, unsynced (per table and batch)",
    "l2_write": "the batch's rows written to L2 (per table and batch)",
    "sync": "the synced watermark write that makes the batch durable (per table and batch)",
    "l1_refresh": "resident L1 rows refreshed from the batch (embedded applier, journal "
    "follower; per batch)",
    "journal": "hps consume appended the batch to the node's journal -> a serving process "
    "took it (per table part of an entry)",
    "l1_reread": "pass 2: resident L1 rows re-read from L2/L3 (serving processes; per pass)",
    "applied": "publish timestamp -> L2/L3 hold the message's rows (per message)",
}
"""What each ``stage`` label of ``hps_update_stage_seconds`` times."""

BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2,
    0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Bucket bounds (seconds) of the stage and freshness histograms: fine around 50-500 ms,
where the freshness goal lies, so that quantiles read back from them are close."""

STAGE_SECONDS = Histogram(
    "hps_update_stage_seconds",
    "Time an update spends in each stage of the update path (see docs/updates.md)",
    ["stage"],
    buckets=BUCKETS,
)
CLOCK_SKEW = Counter(
    "hps_update_clock_skew_total",
    "Ages that came out negative (the publishing clock ahead of ours) and were clamped to 0",
    ["where"],
)
CLOCK_AHEAD = Gauge(
    "hps_update_clock_ahead_seconds",
    "Largest lead of a publishing clock over this process's seen (the clock-skew estimate)",
)


def observe_batch(recorder: Recorder, seconds: float) -> None:
    """One batch's durable apply took ``seconds``: into this process's registry, and where
    the recorder is a serving process's, to be sent on to Triton's /metrics too."""
    BATCH_SECONDS.observe(seconds)
    if isinstance(recorder, BufferedRecorder):
        recorder.batch(seconds)


def age_s(since_ns: int, now_ns: int | None = None) -> tuple[float, bool]:
    """Seconds from ``since_ns`` (epoch ns, another clock) to ``now_ns`` (default: now) and
    whether the age was negative and clamped to 0."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    age = (now_ns - since_ns) / 1e9
    return (0.0, True) if age < 0 else (age, False)


class Recorder(Protocol):
    """Where stage durations and freshness observations go."""

    def stage(self, name: str, seconds: float) -> None: ...
    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None: ...
    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None: ...


class PrometheusRecorder:
    """Straight into this process's prometheus_client registry (``hps consume``, benches).

    A serving process outside Triton has no freshness family here: :meth:`fresh` only
    counts skew."""

    def stage(self, name: str, seconds: float) -> None:
        STAGE_SECONDS.labels(name).observe(seconds)

    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None:
        seconds, clamped = age_s(since_ns, now_ns)
        if clamped:
            _skew(name, since_ns, now_ns)
        self.stage(name, seconds)

    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None:
        if age_s(since_ns, now_ns)[1]:
            _skew("freshness", since_ns, now_ns)


_ahead = {"max": 0.0}


def _skew(where: str, since_ns: int, now_ns: int | None) -> None:
    CLOCK_SKEW.labels(where).inc()
    lead = (since_ns - (time.time_ns() if now_ns is None else now_ns)) / 1e9
    if lead > _ahead["max"]:  # the gauge keeps the largest lead seen
        _ahead["max"] = lead
        CLOCK_AHEAD.set(lead)


MAX_BUFFERED = 100_000


@dataclass
class Drained:
    """What a :class:`BufferedRecorder` held: observations in seconds, skew counts."""

    stages: list[tuple[str, float]] = field(default_factory=list)
    fresh: list[tuple[str, float]] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)  # hps_updates_batch_seconds
    skew: dict[str, int] = field(default_factory=dict)
    dropped: int = 0


class BufferedRecorder:
    """Keeps observations until :meth:`drain` (a serving process: Triton's metric calls must
    come from the thread that runs ``execute``, so the update thread only appends here).

    Bounded: past ``limit`` observations the oldest go (counted in ``dropped``)."""

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._data = Drained()

    def stage(self, name: str, seconds: float) -> None:
        with self._lock:
            self._data.stages.append((name, seconds))
            self._trim(self._data.stages)

    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None:
        seconds, clamped = age_s(since_ns, now_ns)
        if clamped:
            self._count_skew(name)
        self.stage(name, seconds)

    def batch(self, seconds: float) -> None:
        """The durable apply of one batch took ``seconds`` (``hps_updates_batch_seconds``)."""
        with self._lock:
            self._data.batches.append(seconds)
            if len(self._data.batches) > self.limit:
                del self._data.batches[0]
                self._data.dropped += 1

    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None:
        seconds, clamped = age_s(since_ns, now_ns)
        with self._lock:
            if clamped:
                self._data.skew["freshness"] = self._data.skew.get("freshness", 0) + 1
            self._data.fresh.append((table, seconds))
            self._trim(self._data.fresh)

    def _count_skew(self, where: str) -> None:
        with self._lock:
            self._data.skew[where] = self._data.skew.get(where, 0) + 1

    def _trim(self, items: list[tuple[str, float]]) -> None:
        if len(items) > self.limit:
            cut = len(items) - self.limit
            del items[:cut]
            self._data.dropped += cut

    def drain(self) -> Drained:
        with self._lock:
            data, self._data = self._data, Drained()
        return data


# -- histogram math ---------------------------------------------------------------------------

Buckets = list[tuple[float, float]]
"""A Prometheus histogram as ``(upper bound, cumulative count)`` pairs, ``inf`` last."""


def quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of a histogram, as Prometheus's ``histogram_quantile`` computes it:
    linear interpolation inside the bucket that holds it (from 0 for the first bucket); the
    highest finite bound when it falls in the ``+Inf`` bucket; None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within [0, 1]")
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > lower_count:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def subtract(after: Buckets, before: Buckets) -> Buckets:
    """The observations made between two reads of one histogram (``before`` may be empty:
    the histogram did not exist yet). A counter reset (a process restarted) shows as a
    negative difference: then ``after`` alone is returned."""
    prior = dict(before)
    diff = [(b, c - prior.get(b, 0.0)) for b, c in sorted(after)]
    if any(c < 0 for _, c in diff):
        return sorted(after)
    return diff


def parse_labels(text: str) -> dict[str, str]:
    """``a="x",b="y"`` -> {"a": "x", "b": "y"} (label values of HPS metrics hold no quotes
    or commas)."""
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def histograms(text: str, name: str, by: Iterable[str]) -> dict[tuple[str, ...], Buckets]:
    """The buckets of histogram ``name`` in a Prometheus text exposition, summed over every
    label but ``by`` (e.g. ``process``) and ``le``: label values of ``by`` -> buckets."""
    keys = tuple(by)
    prefix = f"{name}_bucket{{"
    sums: dict[tuple[str, ...], dict[float, float]] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels_text, _, value = line[len(prefix) :].rpartition("} ")
        labels = parse_labels(labels_text)
        le = labels.get("le")
        if le is None:
            continue
        group = tuple(labels.get(k, "") for k in keys)
        per = sums.setdefault(group, {})
        bound = float("inf") if le in ("+Inf", "Inf", "inf") else float(le)
        per[bound] = per.get(bound, 0.0) + float(value.split()[0])
    return {g: sorted(per.items()) for g, per in sums.items()}


def summary(buckets: Buckets) -> dict[str, float | int | None]:
    """``{"count", "p50_s", "p99_s"}`` of a histogram (quantiles None without observations)."""
    count = int(max((c for _, c in buckets), default=0.0))
    return {"count": count, "p50_s": quantile(0.5, buckets), "p99_s": quantile(0.99, buckets)}


def merged(groups: Iterable[Buckets]) -> Buckets:
    """The sum of several histograms of the same bounds."""
    total: dict[float, float] = {}
    for buckets in groups:
        for bound, count in buckets:
            total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())
