"""Stage timing and freshness of updates: the recorders, the histogram math, the loop's stages,
the serving process's freshness bookkeeping, the Triton export and the control plane's figure."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from hps.service.info import freshness_of
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.triton.model.metrics import MetricsExporter
from hps.types import TableSpec
from hps.updates import metrics
from hps.updates.applier import Applier
from hps.updates.consumer import UpdateConsumer
from hps.updates.freshness import Offset, Served
from hps.updates.listener import applied_by_group
from hps.updates.metrics import (
    BufferedRecorder,
    age_s,
    histograms,
    merged,
    quantile,
    subtract,
    summary,
)
from tests.unit.triton.model.test_metrics import FakePbUtils, FakeSession, values
from tests.unit.updates.test_update_consumer_loop import SPEC, FakeSource, settings, upsert

INF = float("inf")


class ListRecorder:
    """Keeps every observation (what a test reads back)."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, float]] = []
        self.fresh_seen: list[tuple[str, int]] = []
        self.served_at: list[int | None] = []  # the ``now_ns`` of each fresh()

    def stage(self, name: str, seconds: float) -> None:
        self.stages.append((name, seconds))

    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None:
        self.stage(name, age_s(since_ns, now_ns)[0])

    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None:
        self.fresh_seen.append((table, since_ns))
        self.served_at.append(now_ns)


# -- histogram math ---------------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    buckets = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (INF, 40.0)]
    assert quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: the top of bucket 1
    assert quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: half-way through 0.1-0.2
    assert quantile(0.875, buckets) == pytest.approx(0.35)  # rank 35: half-way through 0.2-0.5
    assert quantile(0.05, buckets) == pytest.approx(0.02)  # the first bucket starts at 0


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert quantile(0.99, [(0.1, 1.0), (1.0, 2.0), (INF, 10.0)]) == 1.0


def test_quantile_of_nothing_is_none_and_q_is_checked() -> None:
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    with pytest.raises(ValueError):
        quantile(1.5, [(INF, 1.0)])


def test_quantiles_of_the_buckets_are_close_to_the_samples() -> None:
    rng = np.random.default_rng(1)
    samples = rng.lognormal(np.log(0.08), 0.6, 20_000)
    counts = [(b, float((samples <= b).sum())) for b in (*metrics.BUCKETS, INF)]
    for q in (0.5, 0.99):
        exact = float(np.quantile(samples, q))
        got = quantile(q, counts)
        assert got is not None and abs(got - exact) <= 0.1 * exact


def test_subtract_keeps_a_window_and_survives_a_restart() -> None:
    before = [(0.1, 5.0), (INF, 6.0)]
    after = [(0.1, 7.0), (INF, 10.0)]
    assert subtract(after, before) == [(0.1, 2.0), (INF, 4.0)]
    assert subtract(after, []) == after
    restarted = [(0.1, 1.0), (INF, 1.0)]
    assert subtract(restarted, before) == restarted


def test_histograms_sum_processes_and_keep_the_labels_asked_for() -> None:
    text = "\n".join([
        "# TYPE hps_update_freshness_seconds histogram",
        'hps_update_freshness_seconds_bucket{model="m",process="a:1",table="t",le="0.1"} 2',
        'hps_update_freshness_seconds_bucket{model="m",process="a:1",table="t",le="+Inf"} 3',
        'hps_update_freshness_seconds_bucket{model="m",process="b:2",table="t",le="0.1"} 1',
        'hps_update_freshness_seconds_bucket{model="m",process="b:2",table="t",le="+Inf"} 4',
        'hps_update_freshness_seconds_count{model="m",process="b:2",table="t"} 4',
        'hps_update_freshness_seconds_bucket{model="m",process="a:1",table="u",le="+Inf"} 1',
        'hps_lookup_latency_us_bucket{model="m",process="a:1",le="100"} 9',
    ])  # fmt: skip
    got = histograms(text, "hps_update_freshness_seconds", ("model", "table"))
    assert got == {("m", "t"): [(0.1, 3.0), (INF, 7.0)], ("m", "u"): [(INF, 1.0)]}
    assert merged(got.values()) == [(0.1, 3.0), (INF, 8.0)]
    assert summary(got[("m", "t")])["count"] == 7


# -- recorders --------------------------------------------------------------------------------


def test_negative_ages_clamp_to_zero() -> None:
    assert age_s(1_000_000_000, 1_500_000_000) == (0.5, False)
    assert age_s(2_000_000_000, 1_500_000_000) == (0.0, True)


def test_buffered_recorder_counts_skew_drains_and_stays_bounded() -> None:
    rec = BufferedRecorder(limit=3)
    rec.fresh("m.t", 1_000_000_000, 1_250_000_000)
    rec.fresh("m.t", 2_000_000_000, 1_000_000_000)  # the publisher's clock is ahead
    rec.age("delivery", 1_000_000_000, 1_100_000_000)
    rec.stage("decode", 0.001)
    data = rec.drain()
    assert data.fresh == [("m.t", 0.25), ("m.t", 0.0)]
    assert data.skew == {"freshness": 1}
    assert data.stages == [("delivery", pytest.approx(0.1)), ("decode", 0.001)]
    assert rec.drain().fresh == []
    for i in range(5):
        rec.stage("sync", float(i))
    data = rec.drain()
    assert [s for _, s in data.stages] == [2.0, 3.0, 4.0] and data.dropped == 2


def test_prometheus_recorder_counts_clamped_ages() -> None:
    before = metrics.CLOCK_SKEW.labels("delivery")._value.get()
    metrics.PrometheusRecorder().age("delivery", 2_000_000_000, 1_000_000_000)
    assert metrics.CLOCK_SKEW.labels("delivery")._value.get() == before + 1


# -- the loop records its stages and, serving, each message's freshness --------------------------


def test_the_loop_records_every_stage_and_each_messages_freshness() -> None:
    rec = ListRecorder()
    msgs = [upsert([1, 2], 10, 0), upsert([3], 11, 1)]
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), HashMapStore()), recorder=rec)
    consumer = UpdateConsumer(
        FakeSource(msgs),  # type: ignore[arg-type]
        applier,
        settings(),
        recorder=rec,
        serving=True,
    )
    consumer.run_once(threading.Event())
    names = [n for n, _ in rec.stages]
    for stage in ("delivery", "batch", "decode", "l3_write", "l2_write", "sync", "applied"):
        assert stage in names, stage
    assert names.count("delivery") == 2 and names.count("applied") == 2
    assert set(names) <= set(metrics.STAGES)
    assert all(s >= 0 for _, s in rec.stages)
    published = [m.timestamp()[1] * 1_000_000 for m in msgs]
    assert rec.fresh_seen == [(SPEC.name, p) for p in published]


def test_a_consumer_that_does_not_serve_records_no_freshness() -> None:
    rec = ListRecorder()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), None), recorder=rec)
    consumer = UpdateConsumer(FakeSource([upsert([1], 5, 0)]), applier, settings(), recorder=rec)  # type: ignore[arg-type]
    consumer.run_once(threading.Event())
    names = {n for n, _ in rec.stages}
    assert "l2_write" in names and "l3_write" not in names  # L2 alone: its write is the first
    assert rec.fresh_seen == []


# -- a serving process's freshness (the L1 listener) --------------------------------------------


def test_served_records_at_once_or_when_l2_l3_hold_the_message() -> None:
    rec = ListRecorder()
    served = Served(rec, limit=3)
    served.now("m.t", 1)
    served.after("m.t", 2, Offset("topic", 0, 5))
    served.after("m.t", 3, Offset("topic", 1, 7))
    assert rec.fresh_seen == [("m.t", 1)] and served.waiting == 2
    committed = {("topic", 0): 6, ("topic", 1): 7}  # partition 1 not yet past offset 7

    assert served.run_ready(applied_by_group(committed)) == 1
    assert rec.fresh_seen == [("m.t", 1), ("m.t", 2)] and served.waiting == 1
    for i in range(5):
        served.after("m.t", 10 + i, Offset("topic", 2, i))
    assert served.waiting == 3  # bounded: the oldest went


def test_a_check_asks_each_partition_only_up_to_its_first_unready_message() -> None:
    served = Served(ListRecorder())
    for offset in range(1000):
        served.after("m.t", offset, Offset("a", 0, offset))
    served.after("m.t", 0, Offset("b", 3, 40))
    asked: list[Offset | None] = []
    committed = {("a", 0): 10, ("b", 3): 41}

    def ready(token: Offset | None) -> bool:
        asked.append(token)
        return applied_by_group(committed)(token)

    assert served.run_ready(ready) == 11 and served.waiting == 990
    assert sorted(asked) == [Offset("a", 0, o) for o in range(11)] + [Offset("b", 3, 40)]


def test_served_records_the_middle_of_the_interval_in_which_ready_turned_true(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = {"ns": 1_000}
    monkeypatch.setattr("hps.updates.freshness.time.time_ns", lambda: clock["ns"])
    rec = ListRecorder()
    served = Served(rec)
    served.after("m.t", 1, Offset("t", 0, 1))  # reached this process at 1_000
    clock["ns"] = 5_000
    served.after("m.t", 2, Offset("t", 0, 2))  # at 5_000, after the previous check (3_000)
    clock["ns"] = 9_000
    assert served.run_ready(lambda token: True, previous_ns=3_000) == 2
    # ready turned true in (3_000, 9_000] for the first; the second was served no earlier
    # than its pass 1, so in (5_000, 9_000]
    assert rec.served_at == [6_000, 7_000]

    served.after("m.t", 3, Offset("t", 0, 3))
    clock["ns"] = 13_000
    assert served.run_ready(lambda token: True) == 1  # never asked before: since pass 1
    assert rec.served_at[-1] == 11_000


# -- the Triton export and the control plane -----------------------------------------------------


def test_the_exporter_sends_freshness_stages_and_skew_to_triton() -> None:
    rec = BufferedRecorder()
    exporter = MetricsExporter(FakePbUtils, "emb", "emb_0", FakeSession(), 0.0, updates=rec)
    rec.fresh("emb.t", 1_000_000_000, 1_200_000_000)
    rec.fresh("emb.t", 3_000_000_000, 1_000_000_000)
    rec.stage("l1_refresh", 0.003)
    exporter.flush()
    base = (("model", "emb"), ("process", f"emb_0:{os.getpid()}"))
    fresh = values("hps_update_freshness_seconds")[tuple(sorted((*base, ("table", "t"))))]
    assert fresh.observed == [pytest.approx(0.2), 0.0]
    assert fresh.kw["buckets"] == list(metrics.BUCKETS)
    stage = values("hps_update_stage_seconds")[tuple(sorted((*base, ("stage", "l1_refresh"))))]
    assert stage.observed == [0.003]
    skew = values("hps_update_clock_skew_total")[tuple(sorted((*base, ("where", "freshness"))))]
    assert skew.value == 1
    exporter.flush()  # drained: nothing twice
    assert len(fresh.observed) == 2


def test_the_table_report_merges_the_model_and_its_ctr_model() -> None:
    spec = TableSpec("m", "t", 4)
    fresh = {
        ("m", "t"): [(0.1, 4.0), (0.2, 4.0), (INF, 4.0)],
        ("m_ctr", "t"): [(0.1, 0.0), (0.2, 4.0), (INF, 4.0)],
        ("m", "other"): [(0.1, 0.0), (0.2, 0.0), (INF, 100.0)],
    }
    got = freshness_of(spec, fresh, None)
    assert got["count"] == 8
    assert got["p50_s"] == pytest.approx(0.1)
    assert got["p99_s"] == pytest.approx(0.1 + 0.1 * (7.92 - 4) / 4)
    none = freshness_of(spec, {}, "Triton metrics at http://x: refused")
    assert none["p50_s"] is None and none["count"] == 0 and "refused" in str(none["error"])
