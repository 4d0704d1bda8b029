"""The metric exporter against a stand-in for the Python backend's metric API."""

from __future__ import annotations

import os
from typing import Any

import pytest

from hps.cache import device
from hps.cache.device import Staging
from hps.triton.model.metrics import LATENCY_BUCKETS_US, MetricsExporter


class FakeMetric:
    def __init__(self, labels: dict[str, str], kw: dict[str, Any]) -> None:
        self.labels, self.kw = labels, kw
        self.value = 0.0
        self.observed: list[float] = []

    def increment(self, n: float) -> None:
        self.value += n

    def set(self, v: float) -> None:
        self.value = v

    def observe(self, v: float) -> None:
        self.observed.append(v)


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: list[FakeFamily] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.metrics: list[FakeMetric] = []
        FakeFamily.created.append(self)

    def Metric(self, labels: dict[str, str], **kw: Any) -> FakeMetric:  # noqa: N802 (Triton's)
        metric = FakeMetric(labels, kw)
        self.metrics.append(metric)
        return metric


class FakePbUtils:
    MetricFamily = FakeFamily


class FakeSession:
    def __init__(self) -> None:
        self.counts = {"lookups": 0, "keys": 0, "l1": 0, "l2": 0, "l3": 0, "default": 0}
        self.damaged = 0
        self.refused = 0
        self.dropped = 0

    def stats(self) -> dict[str, Any]:
        return {
            "tables": {"m.t": dict(self.counts)},
            "l3_damaged_keys": self.damaged,
            "l2_read_errors": self.refused,
            "background_dropped": self.dropped,
        }


def values(name: str) -> dict[tuple[tuple[str, str], ...], Any]:
    fam = next(f for f in reversed(FakeFamily.created) if f.name == name)
    return {tuple(sorted(m.labels.items())): m for m in fam.metrics}


def test_deltas_reach_the_families() -> None:
    session = FakeSession()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_1", session, interval=0.0)
    process = ("process", f"emb_0_1:{os.getpid()}")
    session.counts.update(lookups=2, keys=10, l1=3, l2=4, default=1)
    exporter.observe(0.002)
    exporter.observe(0.004)
    exporter.error("INVALID_ARG")
    exporter.maybe_flush()
    session.counts.update(lookups=3, keys=15, l1=6)
    exporter.observe(0.001)
    exporter.flush()
    base = (("model", "emb"), process)
    assert values("hps_requests_total")[base].value == 3
    errors = values("hps_request_errors_total")
    assert errors[tuple(sorted((*base, ("code", "INVALID_ARG"))))].value == 1
    keys = values("hps_keys_total")[tuple(sorted((*base, ("table", "t"))))]
    assert keys.value == 15
    hits = values("hps_hits_total")
    l1 = hits[tuple(sorted((*base, ("table", "t"), ("level", "l1"))))]
    assert l1.value == 6
    rate = values("hps_hit_rate")[tuple(sorted((*base, ("table", "t"), ("level", "l1"))))]
    assert rate.value == 6 / 11
    latency = values("hps_lookup_latency_us")[base]
    assert latency.kw == {"buckets": LATENCY_BUCKETS_US}
    assert [round(v) for v in latency.observed] == [2000, 4000, 1000]
    exporter.close()


def test_observations_go_a_budget_per_execute_call_and_all_at_finalize() -> None:
    from hps.triton.model.metrics import OBSERVE_BUDGET
    from hps.updates.metrics import BufferedRecorder

    updates = BufferedRecorder()
    exporter = MetricsExporter(
        FakePbUtils, "emb", "emb_0_9", FakeSession(), interval=3600.0, updates=updates
    )
    n = OBSERVE_BUDGET * 2 + 10
    for i in range(n):  # a Kafka catch-up: many messages observed at once
        updates.fresh("m.t", 0, 10**9 * (i + 1))
    exporter.maybe_flush()  # the interval's flush: the counters, one budget of observations
    (fresh,) = values("hps_update_freshness_seconds").values()
    assert len(fresh.observed) == OBSERVE_BUDGET
    exporter.observe(0.001)  # a request, queued behind them
    exporter.maybe_flush()  # the next execute calls send the rest, a budget at a time
    assert len(fresh.observed) == 2 * OBSERVE_BUDGET
    exporter.observe(0.002)
    exporter.flush()  # finalize: everything
    assert fresh.observed == [float(i + 1) for i in range(n)]  # in order, none lost
    (latency,) = values("hps_lookup_latency_us").values()
    assert [round(v) for v in latency.observed] == [1000, 2000]
    exporter.close()


def test_interval_batches_the_updates() -> None:
    session = FakeSession()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_0", session, interval=3600.0)
    exporter.observe(0.001)
    exporter.maybe_flush()  # the first call sends
    exporter.observe(0.001)
    exporter.maybe_flush()  # within the interval: kept
    requests = next(iter(values("hps_requests_total").values()))
    assert requests.value == 1
    exporter.flush()
    assert requests.value == 2


@pytest.mark.parametrize(
    ("field", "family"),
    [
        ("damaged", "hps_l3_damaged_keys_total"),
        ("refused", "hps_l2_read_errors_total"),
        ("dropped", "hps_background_dropped_total"),
    ],
)
def test_damaged_l3_keys_refused_l2_reads_and_dropped_fills_are_counted(
    field: str, family: str
) -> None:
    session = FakeSession()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_2", session, interval=0.0)
    exporter.flush()
    assert values(family) == {}
    setattr(session, field, 45)
    exporter.flush()
    setattr(session, field, 50)
    exporter.flush()
    exporter.flush()
    (metric,) = values(family).values()
    assert metric.value == 50


def test_the_l1_device_and_its_medians_are_exported() -> None:
    from hps.cache.auto import L1Device

    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_3", FakeSession(), interval=0.0)
    base = (("model", "emb"), ("process", f"emb_0_3:{os.getpid()}"))
    exporter.l1_device(L1Device("emb", "cupy", "calibrated", 864, 0.0008, 0.0036))
    ((key, metric),) = values("hps_l1_device").items()
    assert key == tuple(sorted((*base, ("device", "cupy"), ("reason", "calibrated"))))
    assert metric.value == 1
    paths = {dict(k)["path"]: m.value for k, m in values("hps_l1_calibration_seconds").items()}
    assert paths == {"cupy": 0.0008, "numpy": 0.0036}
    exporter.close()

    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_4", FakeSession(), interval=0.0)
    exporter.l1_device(L1Device("emb", "numpy", "no_gpu"))
    ((key, metric),) = values("hps_l1_device").items()
    assert dict(key)["device"] == "numpy" and dict(key)["reason"] == "no_gpu" and metric.value == 1
    assert values("hps_l1_calibration_seconds") == {}  # nothing was timed
    exporter.close()


class HeldStaging:
    """Stands in for a GPU's staging device: holds what the test says."""

    def __init__(self) -> None:
        self.now = Staging(0, 0)

    def held(self) -> Staging:
        return self.now


def test_the_gpu_staging_held_is_exported_when_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = {0: HeldStaging(), 1: HeldStaging()}
    monkeypatch.setattr(device, "_gpu_devices", gpus)
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_5", FakeSession(), interval=0.0)
    exporter.flush()
    assert values("hps_l1_staging_bytes") == {}  # an L1 on NumPy holds none: no series
    gpus[0].now, gpus[1].now = Staging(8192, 16384), Staging(4096, 4096)
    exporter.flush()
    held = {dict(k)["memory"]: m.value for k, m in values("hps_l1_staging_bytes").items()}
    assert held == {"pinned": 12288, "device": 20480}  # both GPUs of the process
    gpus[1].now = Staging(0, 0)
    exporter.flush()
    held = {dict(k)["memory"]: m.value for k, m in values("hps_l1_staging_bytes").items()}
    assert held == {"pinned": 8192, "device": 16384}
    exporter.close()


def test_the_update_threads_own_metrics_reach_triton() -> None:
    """In a serving process the update thread's hps_updates_* metrics live in the process's
    own registry, which nothing serves: they are sent on to Triton's /metrics (counters as
    deltas, the lag gauge as it stands, series it removed removed; the batch histogram
    through the recorder)."""
    import uuid

    from hps.updates import metrics as um
    from hps.updates.metrics import BATCH_BUCKETS, BufferedRecorder

    rec = BufferedRecorder()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_6", FakeSession(), 0.0, updates=rec)
    base = (("model", "emb"), ("process", f"emb_0_6:{os.getpid()}"))
    model, table = f"emb{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}"
    topic = f"hps_et.{model}.{table}"
    um.APPLIED_ROWS.labels(f"{model}.{table}", "upsert").inc(7)
    um.DEAD_LETTERS.labels("ShapeError").inc()
    um.FAILURES.inc()
    um.CONSUMER_LAG.labels(topic, "0").set(5)
    um.CONSUMER_LAG.labels(topic, "1").set(3)
    rec.batch(0.02)
    exporter.flush()
    applied = values("hps_updates_applied_rows_total")
    rows = applied[tuple(sorted((*base, ("table", table), ("kind", "upsert"))))]
    assert rows.value == 7  # the table without the model's name, as for freshness
    dead = values("hps_updates_dead_letters_total")
    shape = dead[tuple(sorted((*base, ("reason", "ShapeError"))))]
    assert shape.value == um.DEAD_LETTERS.labels("ShapeError")._value.get()
    (failures,) = values("hps_updates_apply_failures_total").values()
    assert failures.value == um.FAILURES._value.get()
    lag = values("hps_updates_consumer_lag")
    key = tuple(sorted((*base, ("topic", topic), ("partition", "1"))))
    assert lag[key].value == 3
    (batch,) = values("hps_updates_batch_seconds").values()
    assert batch.observed == [0.02] and batch.kw["buckets"] == list(BATCH_BUCKETS)

    um.APPLIED_ROWS.labels(f"{model}.{table}", "upsert").inc(2)
    um.DEAD_LETTERS.labels("ShapeError").inc()
    um.CONSUMER_LAG.remove(topic, "1")  # a partition the update thread no longer holds
    um.CONSUMER_LAG.labels(topic, "0").set(0)
    exporter.flush()
    exporter.flush()  # nothing new: nothing sent twice
    assert rows.value == 9
    assert shape.value == um.DEAD_LETTERS.labels("ShapeError")._value.get()
    # what the exporter still holds for Triton: (family, partition, topic) -> metric
    held = {k[1]: m.value for k, m in exporter._metrics.items() if k[0] == "lag" and k[2] == topic}
    assert held == {"0": 0}  # the removed series is released: Triton drops it
    exporter.close()


def test_a_process_without_kafka_sends_no_update_metrics() -> None:
    from hps.updates import metrics as um

    um.APPLIED_ROWS.labels("other.t", "upsert").inc()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0_7", FakeSession(), interval=0.0)
    exporter.flush()
    assert values("hps_updates_applied_rows_total") == {}
    exporter.close()
