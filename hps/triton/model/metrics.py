"""HPS counters in Triton's own /metrics, through the Python backend's custom metrics.

Every metric call of the stub is a round trip to the server process (about 12 us), and
calls from two threads at once crashed the stub, so nothing is sent per key or per
request: requests are tallied locally and the deltas of ``LookupSession.stats()`` are sent
from the thread that runs ``execute`` at most every ``interval`` seconds (and at
``finalize``). Histogram observations (each request's latency, each update's freshness and
stages) queue here and go at most ``OBSERVE_BUDGET`` per ``execute`` call, the rest at the
next calls: sent all at once, the observations of a second at 5,000 requests/s cost one
request 60 ms, and those of a Kafka catch-up (up to 100,000) over a second.

Every series carries ``model`` (the Triton model) and ``process`` (``<instance>:<pid>``):
two stubs holding a metric of identical labels share one Prometheus series, and the
first to let go of it frees it under the other (Triton counts references per stub), which
crashed the server. Sum over ``process`` for a model's totals. Families:

- ``hps_requests_total``, ``hps_request_errors_total{code}``
- ``hps_lookups_total{table}``, ``hps_keys_total{table}``
- ``hps_hits_total{table,level}``: unique keys of each lookup by the level that answered
  (l1, l2, l3, default); ``hps_hit_rate{table,level}``: their share since the process
  started
- ``hps_lookup_latency_us``: a histogram of the time a request spends in HPS.
- ``hps_l3_damaged_keys_total``: keys L3 could not read (damaged blocks, docs/storage.md),
  answered from L2 or the table's default.
- ``hps_l2_read_errors_total``: L2 reads refused (credentials, permissions: not an L2 that
  cannot be reached), answered from L3.
- ``hps_background_dropped_total``: L1 fills and L2 backfills dropped because the
  background worker was behind (what waited held ``MAX_BACKGROUND_BYTES``).
- ``hps_update_freshness_seconds{table}``: a histogram, per Kafka update message, of the time
  from its publish timestamp to the moment this process serves it (docs/updates.md,
  "Freshness in production"); ``hps_update_stage_seconds{stage}``: the stages of an embedded
  applier; ``hps_update_clock_skew_total{where}``: ages clamped to 0 (the publishing clock
  ran ahead); ``hps_updates_batch_seconds``: the embedded applier's durable apply of each
  batch. Observed by the update thread into a
  :class:`hps.updates.metrics.BufferedRecorder` and sent from here.
- The update thread's counters, as ``hps consume`` serves them (docs/updates.md,
  "Metrics"), read from this process's own registry (which nothing else serves) and sent
  as deltas: ``hps_updates_applied_rows_total{table,kind}``,
  ``hps_updates_stale_rows_total{table}``, ``hps_updates_messages_total{format}``,
  ``hps_updates_dead_letters_total{reason}``, ``hps_updates_apply_failures_total``,
  ``hps_updates_l1_refreshed_keys_total{table}``; and the gauge
  ``hps_updates_consumer_lag{topic,partition}`` (a series the update thread removed goes
  here too). ``table`` without the model's name, as in the freshness histogram.
- ``hps_l1_device{device,reason}``: 1 for the array module this process's L1 caches run on
  (``numpy`` or ``cupy``) and why (``configured``, ``no_gpu``, ``calibrated``,
  ``gpu_failed``: :mod:`hps.cache.auto`); ``hps_l1_calibration_seconds{path}``: the medians that
  ``hps_cache.device: auto`` compared (``path`` ``cupy``, ``numpy``), when it calibrated.
  Set once, at start-up.
- ``hps_l1_staging_bytes{memory}``: the bytes of the GPU host path's staging buffers this
  process holds (``memory`` ``pinned``: page-locked host memory, ``device``: GPU memory;
  :func:`hps.cache.device.held_staging`), what ``hps plan`` predicts per instance; sent when
  it changes, never for an L1 on NumPy.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from hps.cache.device import Staging, held_staging
from hps.lookup import LEVELS
from hps.updates import metrics as update_metrics
from hps.updates.metrics import BATCH_BUCKETS, BUCKETS, MAX_BUFFERED, BufferedRecorder

if TYPE_CHECKING:
    from hps.cache.auto import L1Device

LATENCY_BUCKETS_US = [100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000]
OBSERVE_BUDGET = 256  # histogram observations sent per execute call (about 3 ms)
Labels = tuple[tuple[str, str], ...]


FAMILIES = {
    "requests": ("hps_requests_total", "COUNTER", "Lookup requests answered"),
    "errors": ("hps_request_errors_total", "COUNTER", "Requests answered with an error"),
    "lookups": ("hps_lookups_total", "COUNTER", "Table lookups"),
    "keys": ("hps_keys_total", "COUNTER", "Keys looked up (duplicates included)"),
    "hits": ("hps_hits_total", "COUNTER", "Unique keys of lookups by the level answering"),
    "rate": ("hps_hit_rate", "GAUGE", "Share of unique keys answered by level"),
    "latency": ("hps_lookup_latency_us", "HISTOGRAM", "Time a request spends in HPS"),
    "fresh": (
        "hps_update_freshness_seconds",
        "HISTOGRAM",
        "Publish timestamp of an update to the moment this process serves it",
    ),
    "stage": (
        "hps_update_stage_seconds",
        "HISTOGRAM",
        "Time an update spends in each stage of this process's applier",
    ),
    "damaged": (
        "hps_l3_damaged_keys_total",
        "COUNTER",
        "Keys L3 could not read (damaged blocks), answered from L2 or the table's default",
    ),
    "l2_refused": (
        "hps_l2_read_errors_total",
        "COUNTER",
        "L2 reads refused (credentials, permissions), answered from L3",
    ),
    "dropped": (
        "hps_background_dropped_total",
        "COUNTER",
        "L1 fills and L2 backfills dropped because the background worker was behind",
    ),
    "skew": (
        "hps_update_clock_skew_total",
        "COUNTER",
        "Update ages that came out negative (the publishing clock ahead) and were clamped to 0",
    ),
    "l1_device": (
        "hps_l1_device",
        "GAUGE",
        "1 for the device the L1 caches run on (numpy or cupy) and why it was chosen",
    ),
    "l1_calibration": (
        "hps_l1_calibration_seconds",
        "GAUGE",
        "Median time of one request's L1 probe per path, timed at start-up (device: auto)",
    ),
    "l1_staging": (
        "hps_l1_staging_bytes",
        "GAUGE",
        "Bytes of the L1 GPU host path's staging buffers held by this process",
    ),
    # the update thread's own metrics (hps.updates.metrics), as hps consume serves them
    "applied_rows": (
        "hps_updates_applied_rows_total",
        "COUNTER",
        "Rows this process's embedded applier applied to L2/L3",
    ),
    "stale_rows": (
        "hps_updates_stale_rows_total",
        "COUNTER",
        "Rows the embedded applier skipped because a newer version was applied",
    ),
    "messages": ("hps_updates_messages_total", "COUNTER", "Update messages decoded"),
    "dead_letters": (
        "hps_updates_dead_letters_total",
        "COUNTER",
        "Update messages refused (logged and dropped by the embedded applier)",
    ),
    "apply_failures": (
        "hps_updates_apply_failures_total",
        "COUNTER",
        "Batch applications that failed and were retried (embedded applier)",
    ),
    "l1_refreshed": (
        "hps_updates_l1_refreshed_keys_total",
        "COUNTER",
        "Keys resident in L1 that an update gave a new row or evicted",
    ),
    "lag": (
        "hps_updates_consumer_lag",
        "GAUGE",
        "Messages published but not yet applied by the embedded applier, per partition",
    ),
    "batch": (
        "hps_updates_batch_seconds",
        "HISTOGRAM",
        "Time the embedded applier took to apply one batch (durably)",
    ),
}
BUCKETS_OF = {
    "latency": LATENCY_BUCKETS_US,
    "fresh": list(BUCKETS),
    "stage": list(BUCKETS),
    "batch": list(BATCH_BUCKETS),
}


class MetricsExporter:
    """Sends the deltas of a session's counters to Triton's metric families."""

    def __init__(
        self,
        pb_utils: Any,
        model: str,
        instance: str,
        session: Any,
        interval: float = 1.0,
        updates: BufferedRecorder | None = None,
    ) -> None:
        self.session = session
        self.updates = updates  # what the update thread observed since the last flush
        self.labels = {"model": model, "process": f"{instance}:{os.getpid()}"}
        self.interval = interval
        fam = pb_utils.MetricFamily
        self._families = {
            key: fam(name=name, description=text, kind=getattr(fam, kind))
            for key, (name, kind, text) in FAMILIES.items()
        }
        self._metrics: dict[tuple[str, ...], Any] = {}
        self._last: dict[str, dict[str, int]] = {}
        self._damaged = 0
        self._l2_refused = 0
        self._dropped = 0
        # (family, its labels, value) to observe; the oldest go past MAX_BUFFERED
        self._observations: deque[tuple[str, Labels, float]] = deque(maxlen=MAX_BUFFERED)
        self._requests = 0
        self._errors: dict[str, int] = {}
        self._staging = Staging(0, 0)
        self._next = 0.0
        # the update thread's counters as last sent, by (family, its registry labels)
        self._sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lag: set[tuple[str, ...]] = set()  # the lag series sent (keys of _metrics)

    def _metric(self, family: str, **labels: str) -> Any:
        key = (family, *labels.values())
        metric = self._metrics.get(key)
        if metric is None:
            fam = self._families[family]
            buckets = BUCKETS_OF.get(family)
            kw = {"buckets": buckets} if buckets is not None else {}
            metric = self._metrics[key] = fam.Metric(labels={**self.labels, **labels}, **kw)
        return metric

    def l1_device(self, choice: L1Device) -> None:
        """Export where the L1 caches run and why (:mod:`hps.cache.auto`), once."""
        self._metric("l1_device", device=choice.device, reason=choice.reason).set(1)
        for path, seconds in (("cupy", choice.cupy_s), ("numpy", choice.numpy_s)):
            if seconds is not None:
                self._metric("l1_calibration", path=path).set(seconds)

    def observe(self, seconds: float) -> None:
        self._observations.append(("latency", (), seconds * 1e6))
        self._requests += 1

    def error(self, code: str) -> None:
        self._errors[code] = self._errors.get(code, 0) + 1

    def maybe_flush(self) -> None:
        """Once per ``execute``: the counters every ``interval`` s, queued observations up to
        ``OBSERVE_BUDGET`` on every call."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            self.flush(OBSERVE_BUDGET)
        elif self._observations:
            self._send_observations(OBSERVE_BUDGET)

    def _send_observations(self, budget: int | None) -> None:
        """Observe the oldest ``budget`` queued values (None: all of them)."""
        queue = self._observations
        for _ in range(len(queue) if budget is None else min(budget, len(queue))):
            family, labels, value = queue.popleft()
            self._metric(family, **dict(labels)).observe(value)

    def flush(self, budget: int | None = None) -> None:
        """Send what accumulated since the last flush: every counter, and ``budget`` queued
        observations (None: all, as at ``finalize``)."""
        if self._requests:
            self._metric("requests").increment(self._requests)
            self._requests = 0
        for code, n in self._errors.items():
            self._metric("errors", code=code).increment(n)
        self._errors.clear()
        if self.updates is not None:
            self._flush_updates(self.updates)
        self._send_observations(budget)
        staging = held_staging()
        if staging != self._staging:
            self._metric("l1_staging", memory="pinned").set(staging.pinned)
            self._metric("l1_staging", memory="device").set(staging.device)
            self._staging = staging
        stats = self.session.stats()
        damaged = int(stats.get("l3_damaged_keys", 0))
        if damaged > self._damaged:
            self._metric("damaged").increment(damaged - self._damaged)
            self._damaged = damaged
        refused = int(stats.get("l2_read_errors", 0))
        if refused > self._l2_refused:
            self._metric("l2_refused").increment(refused - self._l2_refused)
            self._l2_refused = refused
        dropped = int(stats.get("background_dropped", 0))
        if dropped > self._dropped:
            self._metric("dropped").increment(dropped - self._dropped)
            self._dropped = dropped
        for table, counts in stats["tables"].items():
            last = self._last.get(table, {})
            short = table.split(".", 1)[1]
            for name in ("lookups", "keys", *LEVELS):
                delta = counts[name] - last.get(name, 0)
                if delta:
                    family = "hits" if name in LEVELS else name
                    labels = {"table": short, "level": name} if name in LEVELS else {"table": short}
                    self._metric(family, **labels).increment(delta)
            unique = sum(counts[level] for level in LEVELS)
            if unique and counts != last:
                for level in LEVELS:
                    self._metric("rate", table=short, level=level).set(counts[level] / unique)
            self._last[table] = dict(counts)

    def _flush_updates(self, updates: BufferedRecorder) -> None:
        data = updates.drain()
        queue = self._observations
        for table, seconds in data.fresh:
            queue.append(("fresh", (("table", table.split(".", 1)[-1]),), seconds))
        queue.extend(("stage", (("stage", stage),), seconds) for stage, seconds in data.stages)
        queue.extend(("batch", (), seconds) for seconds in data.batches)
        for where, n in data.skew.items():
            self._metric("skew", where=where).increment(n)
        self._forward_counters()
        self._forward_lag()

    def _forward_counters(self) -> None:
        """What the update thread counted since the last flush (this process's registry)."""
        for family, counter in update_metrics.FORWARDED_COUNTERS.items():
            for sample in _samples(counter, "_total"):
                ident = (family, tuple(sorted(sample.labels.items())))
                delta = sample.value - self._sent.get(ident, 0.0)
                if delta > 0:
                    self._metric(family, **_short(sample.labels)).increment(delta)
                    self._sent[ident] = sample.value

    def _forward_lag(self) -> None:
        """The lag gauge as the update thread left it: its series set, the ones it removed
        (partitions no longer held) removed here too."""
        now: set[tuple[str, ...]] = set()
        for sample in _samples(update_metrics.CONSUMER_LAG, ""):
            labels = _short(sample.labels)
            self._metric("lag", **labels).set(sample.value)
            now.add(("lag", *labels.values()))
        for key in self._lag - now:
            self._metrics.pop(key, None)  # released: Triton drops the series
        self._lag = now

    def close(self) -> None:
        # Metrics must go before their families (the stub refuses the other order).
        self._metrics.clear()
        self._families.clear()


def _samples(metric: Any, suffix: str) -> list[Any]:
    """The samples of a prometheus_client metric named as the metric plus ``suffix`` (a
    counter's ``_total``, not its ``_created``)."""
    out: list[Any] = []
    for family in metric.collect():
        name = family.name + suffix
        out.extend(sample for sample in family.samples if sample.name == name)
    return out


def _short(labels: dict[str, str]) -> dict[str, str]:
    """Labels for Triton, in a fixed order; ``table`` without the model's name."""
    out = {k: labels[k] for k in sorted(labels)}
    if "table" in out:
        out["table"] = out["table"].split(".", 1)[-1]
    return out
