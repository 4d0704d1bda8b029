"""The consumer loop with an in-memory message source: batching, retries, dead letters, commits."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import PSConfig, UpdateSourceConfig
from hps.errors import BackendUnavailable
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.types import TableSpec
from hps.updates import codec
from hps.updates.applier import Applier
from hps.updates.consumer import MAX_BACKOFF_S, UpdateConsumer, backoff_s
from hps.updates.freshness import L1Refresher, Offset
from hps.updates.listener import applied_by_group

SPEC = TableSpec("m", "t", 2)
TOPIC = codec.topic_name("m", "t")


class Msg:
    def __init__(self, value: bytes, offset: int, topic: str = TOPIC, key: bytes | None = None):
        self._v, self._o, self._t, self._k = value, offset, topic, key

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes:
        return self._v

    def key(self) -> bytes | None:
        return self._k

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._o)

    def error(self) -> None:
        return None


class FakeSource:
    def __init__(self, msgs: list[Msg]) -> None:
        self.queue = deque(msgs)
        self.stored: list[int] = []
        self.commits = 0
        self.topics = [TOPIC]
        self.position = 0  # the offset after the last message handed out
        self.commit_failed = False
        self.high = max((m.offset() + 1 for m in msgs), default=0)

    def poll(self, timeout_s: float) -> Msg | None:
        out = self.drain(1)
        return out[0] if out else None

    def drain(self, n: int) -> list[Msg]:
        out = []
        while self.queue and len(out) < n:
            out.append(self.queue.popleft())
            self.position = out[-1].offset() + 1
        return out

    def store(self, msgs: list[Msg]) -> None:
        self.stored.extend(m.offset() for m in msgs)

    def rewind(self, msgs: list[Msg]) -> None:
        self.queue.extendleft(reversed(msgs))
        self.position = msgs[0].offset()

    def commit(self, *, asynchronous: bool) -> None:
        self.commits += 1

    def lag(
        self, unapplied: dict[tuple[str, int], int] | None = None
    ) -> dict[tuple[str, int], int]:
        at = min(self.position, (unapplied or {}).get((TOPIC, 0), self.position))
        return {(TOPIC, 0): self.high - at}

    def close(self) -> None:
        pass


class FakeDead:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []
        self.flushes = 0

    def send(self, msg: Msg, reason: str) -> None:
        self.sent.append((msg.offset(), reason))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


class FlakyStore(HashMapStore):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def insert(self, table: str, keys: Any, values: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("redis: connection refused")
        super().insert(table, keys, values)


def upsert(keys: list[int], version: int, offset: int) -> Msg:
    k = np.array(keys)
    return Msg(codec.encode(k, np.stack([k, k], 1).astype(np.float32), version), offset)


def settings(**kw: Any) -> UpdateSourceConfig:
    base = {"type": "kafka", "failure_backoff_ms": 1, "max_batch_size": 25}
    return UpdateSourceConfig(**{**base, **kw})


def make(msgs: list[Msg], l2: HashMapStore | None = None, **kw: Any) -> tuple[Any, ...]:
    l2 = l2 or HashMapStore()
    l3 = HashMapStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(l2, l3))
    source, dead = FakeSource(msgs), FakeDead()
    consumer = UpdateConsumer(source, applier, settings(**kw), dead_letters=dead)  # type: ignore[arg-type]
    return consumer, source, dead, l2, l3


def test_batches_stop_at_max_batch_size_rows() -> None:
    msgs = [upsert(list(range(i * 10, i * 10 + 10)), i + 1, i) for i in range(5)]
    consumer, source, *_ = make(msgs)
    stop = threading.Event()
    assert consumer.run_once(stop) == 3  # 30 rows >= 25
    assert source.stored == [0, 1, 2]
    assert consumer.run_once(stop) == 2
    assert consumer.run_once(stop) == 0


def test_batches_of_messages_without_rows_stop_at_max_batch_size_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HugeCTR beacons and junk add no rows: a backlog of them is cut into batches of
    max_batch_size messages (it was one batch of them all), and of MAX_BATCH_BYTES."""
    beacon = codec.encode_hugectr(np.zeros(0, np.int64), np.zeros((0, 2), np.float32))
    msgs = [Msg(beacon if i % 2 else b"junk", i) for i in range(60)]
    consumer, source, dead, *_ = make(msgs)
    stop = threading.Event()
    assert [consumer.run_once(stop) for _ in range(4)] == [25, 25, 10, 0]
    assert source.stored == list(range(60)) and len(dead.sent) == 30
    monkeypatch.setattr("hps.updates.consumer.MAX_BATCH_BYTES", 3 * len(b"junk"))
    consumer, *_ = make([Msg(b"junk", i) for i in range(10)])
    assert consumer.run_once(stop) == 3


def test_bad_messages_are_dead_lettered_and_the_rest_applied() -> None:
    bad_dim = Msg(codec.encode(np.array([3]), np.ones((1, 5), np.float32), 1), 1)
    nan = Msg(codec.encode(np.array([4]), np.full((1, 2), np.nan, np.float32), 1), 2)
    msgs = [upsert([1], 1, 0), bad_dim, nan, Msg(b"junk", 3), upsert([2], 1, 4)]
    consumer, source, dead, l2, l3 = make(msgs)
    consumer.run_once(threading.Event())
    assert [o for o, _ in dead.sent] == [1, 2, 3] and dead.flushes == 1
    reasons = [r for _, r in dead.sent]
    assert reasons[0].startswith("ShapeError") and "dim 5" in reasons[0]
    assert reasons[1].startswith("InvalidValueError") and reasons[2].startswith("DecodeError")
    assert source.stored == [0, 1, 2, 3, 4]
    assert l3.fetch(SPEC.name, np.array([1, 2, 3, 4]))[1].tolist() == [True, True, False, False]


def test_reserved_keys_are_dead_lettered_and_no_tier_grows() -> None:
    """The index's empty and deleted markers cannot be stored: an upsert of one would take
    a row no lookup finds, every time it came again."""
    lowest = np.iinfo(np.int64).min
    msgs = [
        upsert([1], 1, 0),
        Msg(codec.encode(np.array([lowest, 5]), np.ones((2, 2), np.float32), 2), 1),
        Msg(codec.encode(np.array([lowest + 1]), None, 3, delete=True), 2),
        upsert([2], 4, 3),
    ]
    consumer, source, dead, l2, l3 = make(msgs)
    consumer.run_once(threading.Event())
    assert [o for o, _ in dead.sent] == [1, 2] and source.stored == [0, 1, 2, 3]
    assert all(r.startswith("InvalidValueError: m.t: keys [") for _, r in dead.sent)
    assert "are reserved" in dead.sent[0][1]
    # keys 1 and 2; key 5 went with its message
    assert l2.size(SPEC.name) == l3.size(SPEC.name) == 2
    assert l3.fetch(SPEC.name, np.array([1, 2, 5]))[1].tolist() == [True, True, False]


def test_values_beyond_float16_are_dead_lettered_for_a_float16_table() -> None:
    spec = TableSpec("m", "h", 2, row_dtype="float16")
    topic = codec.topic_name("m", "h")
    ok = np.array([[1.5, -65504.0]], np.float32)
    msgs = [
        Msg(codec.encode(np.array([1]), ok, 1), 0, topic),
        Msg(codec.encode(np.array([2, 3]), np.array([[0, 1], [7e4, 0]], np.float32), 1), 1, topic),
    ]
    l2, l3 = HashMapStore(), HashMapStore()
    applier = Applier({spec.name: spec}, Tiers(l2, l3))
    source, dead = FakeSource(msgs), FakeDead()
    consumer = UpdateConsumer(source, applier, settings(), dead_letters=dead)  # type: ignore[arg-type]
    consumer.run_once(threading.Event())
    assert [o for o, _ in dead.sent] == [1] and source.stored == [0, 1]
    reason = dead.sent[0][1]
    assert reason.startswith("InvalidValueError: m.h: 1 value(s) outside float16's range")
    got, found = l3.fetch(spec.name, np.array([1, 2, 3]))
    assert found.tolist() == [True, False, False] and got.dtype == np.float16
    np.testing.assert_array_equal(got[:1], ok.astype(np.float16))


def test_an_unforeseen_error_reads_the_batch_again_and_skips_nothing() -> None:
    class Once(HashMapStore):
        def __init__(self) -> None:
            super().__init__()
            self.failed = False

        def insert(self, table: str, keys: Any, values: Any) -> None:  # type: ignore[override]
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug in a tier")
            super().insert(table, keys, values)

    msgs = [upsert([i], 1, i) for i in range(3)]
    consumer, source, dead, l2, l3 = make(msgs, l2=Once())
    with pytest.raises(RuntimeError, match="a bug in a tier"):
        consumer.run_once(threading.Event())
    assert source.stored == [] and [m.offset() for m in source.queue] == [0, 1, 2]
    assert consumer.run_once(threading.Event()) == 3
    assert source.stored == [0, 1, 2] and dead.sent == []
    assert l2.fetch(SPEC.name, np.array([0, 1, 2]))[1].all()


def test_an_int8_row_too_wide_is_dead_lettered_and_the_rest_applied() -> None:
    spec = TableSpec("m", "q", 2, row_dtype="int8")
    topic = codec.topic_name("m", "q")
    msgs = [
        Msg(codec.encode(np.array([1]), np.array([[3e38, -3e38]], np.float32), 1), 0, topic),
        Msg(codec.encode(np.array([2]), np.array([[1.0, 2.0]], np.float32), 1), 1, topic),
    ]
    l2, l3 = HashMapStore(), HashMapStore()
    source, dead = FakeSource(msgs), FakeDead()
    applier = Applier({spec.name: spec}, Tiers(l2, l3))
    consumer = UpdateConsumer(source, applier, settings(), dead_letters=dead)  # type: ignore[arg-type]
    consumer.run_once(threading.Event())
    assert [o for o, _ in dead.sent] == [0] and source.stored == [0, 1]
    assert dead.sent[0][1].startswith("InvalidValueError: m.q: 1 row(s) span more than")
    assert l3.fetch(spec.name, np.array([1, 2]))[1].tolist() == [False, True]


def test_a_failing_tier_is_retried_and_nothing_is_skipped() -> None:
    consumer, source, _, l2, l3 = make([upsert([1, 2], 1, 0)], l2=FlakyStore(failures=3))
    assert consumer.run_once(threading.Event()) == 1
    assert l2.fetch(SPEC.name, np.array([1, 2]))[1].all()
    assert source.stored == [0]


def test_the_lag_counts_the_batch_a_failing_tier_holds_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a tier fails, the lag gauge is exported and counts the unapplied batch (it
    read 0 through the outage: exported only after stored batches, from the position)."""
    from hps.updates import metrics

    monkeypatch.setattr("hps.updates.consumer.LAG_INTERVAL_S", 0.0)
    msgs = [upsert([i], 1, i) for i in range(3)]
    consumer, *_ = make(msgs, l2=FlakyStore(failures=2), max_batch_size=2)
    seen: list[float] = []
    gauge = metrics.CONSUMER_LAG.labels(TOPIC, "0")
    monkeypatch.setattr(gauge, "set", seen.append)
    consumer.run_once(threading.Event())  # offsets 0 and 1: two failures, then applied
    assert seen[:2] == [3, 3] and seen[-1] == 1  # the batch counted till it is applied


class HeldSource(FakeSource):
    """A source whose partitions and lag the test sets (``None``: the read fails)."""

    def __init__(self) -> None:
        super().__init__([])
        self.lags: dict[tuple[str, int], int] | None = {}

    def lag(
        self, unapplied: dict[tuple[str, int], int] | None = None
    ) -> dict[tuple[str, int], int]:
        if self.lags is None:
            raise BackendUnavailable("kafka: the broker is away")
        return dict(self.lags)


def test_lag_series_of_partitions_no_longer_held_are_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition revoked by a rebalance (or lost) kept its last lag for ever: the sum of
    the lag stayed high though the new owner had caught up."""
    import uuid

    from prometheus_client import REGISTRY

    monkeypatch.setattr("hps.updates.consumer.LAG_INTERVAL_S", 0.0)
    topic = codec.topic_name(f"m{uuid.uuid4().hex[:8]}", "t")
    source = HeldSource()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), None))
    consumer = UpdateConsumer(source, applier, settings())  # type: ignore[arg-type]

    def exported() -> dict[str, float]:
        out = {}
        for p in ("0", "1", "2"):
            v = REGISTRY.get_sample_value(
                "hps_updates_consumer_lag", {"topic": topic, "partition": p}
            )
            if v is not None:
                out[p] = v
        return out

    source.lags = {(topic, 0): 5, (topic, 1): 3}
    consumer.run_once(threading.Event())  # idle: exports
    assert exported() == {"0": 5, "1": 3}
    source.lags = {(topic, 0): 4}  # partition 1 went to another member
    consumer.run_once(threading.Event())
    assert exported() == {"0": 4}
    source.lags = None  # the client cannot say: the series stay as they were
    consumer.run_once(threading.Event())
    assert exported() == {"0": 4}
    source.lags = {(topic, 2): 1}
    consumer.run_once(threading.Event())
    assert exported() == {"2": 1}


def test_a_serving_process_loop_hands_its_batch_times_to_its_recorder() -> None:
    """The embedded applier's recorder is drained into Triton's /metrics: the durable apply
    of each batch (hps_updates_batch_seconds) goes there too."""
    from hps.updates.metrics import BufferedRecorder

    rec = BufferedRecorder()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), HashMapStore()))
    source = FakeSource([upsert([1], 1, 0), upsert([2], 1, 1)])
    consumer = UpdateConsumer(source, applier, settings(max_batch_size=1), recorder=rec)  # type: ignore[arg-type]
    consumer.run_once(threading.Event())
    consumer.run_once(threading.Event())
    assert len(rec.drain().batches) == 2


def test_without_a_dead_letter_topic_a_refused_message_is_logged_as_invalid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    k = np.array([1])
    wrong_dim = Msg(codec.encode(k, np.ones((1, 3), np.float32), 1), 0)  # decodes; dim 3 != 2
    consumer, *_ = make([wrong_dim])
    consumer.dead_letters = None  # the embedded applier's case
    with caplog.at_level("ERROR", logger="hps.updates.consumer"):
        consumer.run_once(threading.Event())
    (line,) = [r.getMessage() for r in caplog.records if "ShapeError" in r.getMessage()]
    assert line.startswith("dropping invalid message ") and "undecodable" not in line


def test_stop_during_backoff_stores_nothing() -> None:
    consumer, source, _, l2, _ = make(
        [upsert([1], 1, 0)], l2=FlakyStore(failures=10**6), failure_backoff_ms=10
    )
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert consumer.run_once(stop) == 0
    assert source.stored == []


class SimulatedWait(threading.Event):
    """A stop event whose backoff waits take no time: it records what was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def test_a_tier_down_for_hours_is_retried_at_the_capped_backoff() -> None:
    """2**attempt overflowed a float after 1024 attempts (about 85 minutes of a tier down):
    hps consume died with a traceback instead of retrying."""
    consumer, source, _, l2, _ = make(
        [upsert([1], 1, 0)], l2=FlakyStore(failures=1100), failure_backoff_ms=50
    )
    stop = SimulatedWait()
    assert consumer.run_once(stop) == 1  # applied once the tier came back
    assert source.stored == [0] and l2.size(SPEC.name) == 1
    assert len(stop.waits) == 1100 and stop.waits[0] == pytest.approx(0.05)
    assert max(stop.waits) == MAX_BACKOFF_S == stop.waits[-1]


@pytest.mark.parametrize(("first_ms", "attempt", "expected"), [
    (50, 0, 0.05), (50, 3, 0.4), (50, 7, MAX_BACKOFF_S), (50, 10**6, MAX_BACKOFF_S),
    (1, 0, 0.001), (0, 0, 0.001), (0, 5000, MAX_BACKOFF_S),
])  # fmt: skip
def test_the_backoff_doubles_from_at_least_a_millisecond_up_to_the_cap(
    first_ms: int, attempt: int, expected: float
) -> None:
    assert backoff_s(first_ms, attempt) == pytest.approx(expected)


def test_commits_every_max_commit_interval_batches_and_when_idle() -> None:
    msgs = [upsert([i], 1, i) for i in range(5)]
    consumer, source, *_ = make(msgs, max_batch_size=1, max_commit_interval=2)
    stop = threading.Event()
    for _ in range(5):
        consumer.run_once(stop)
    assert source.commits == 2  # after batches 2 and 4
    consumer.run_once(stop)  # idle: commits batch 5
    assert source.commits == 3
    consumer.run_once(stop)  # idle, nothing new
    assert source.commits == 3
    source.commit_failed = True  # the broker refused that asynchronous commit
    consumer.run_once(stop)  # idle: sent again
    assert source.commits == 4


class FakeCache:
    def __init__(self, calls: list[tuple[list[int], Any]]) -> None:
        self.rows: dict[int, np.ndarray] = {}
        self.calls = calls

    def evict(self, keys: np.ndarray) -> None:
        for k in keys.tolist():
            self.rows.pop(k, None)

    def resident(self, keys: np.ndarray) -> np.ndarray:
        return np.array([k in self.rows for k in keys.tolist()], dtype=bool)

    def update(self, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        self.calls.append((keys.tolist(), rows.tolist()))
        return self.resident(keys)


class FakeSession:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], Any]] = []
        self.caches = {SPEC.name: FakeCache(self.calls)}
        self.tiers = Tiers(None, None)

    def refresh(self, table: str, keys: np.ndarray, values: Any = None, **_: Any) -> None:
        self.calls.append((keys.tolist(), None if values is None else values.tolist()))


def test_refresher_passes() -> None:
    session = FakeSession()
    r = L1Refresher(session, grace_s=0.0)  # type: ignore[arg-type]
    r.now(SPEC.name, np.array([5, 3, 5]), np.array([[1, 1], [2, 2], [3, 3]], np.float32))
    # stored rows passed on as received: the cache keeps the last row of a key
    assert session.calls == [([5, 3, 5], [[1, 1], [2, 2], [3, 3]])]
    r.now("unknown.table", np.array([1]), np.ones((1, 2), np.float32))
    assert len(session.calls) == 1
    r.later(SPEC.name, np.array([3, 5]), token=Offset("t", 0, 7))
    assert r.run_due(applied_by_group({("t", 0): 7})) == 0 and r.pending == 1
    assert r.run_due(applied_by_group({("t", 0): 8})) == 1 and r.pending == 0
    assert session.calls[-1] == ([3, 5], None)  # pass 2 re-reads from L2/L3


def test_pass_two_rereads_each_table_once_for_all_its_due_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hps.updates import freshness

    session = FakeSession()
    r = L1Refresher(session, grace_s=0.0)  # type: ignore[arg-type]
    for offset in range(6):  # six messages of two keys, one key shared by all
        r.later(SPEC.name, np.array([100, offset]), token=Offset("t", 0, offset))
    monkeypatch.setattr(freshness, "MAX_PASS_KEYS", 8)  # four messages a pass at most
    assert r.run_due(applied_by_group({("t", 0): 6})) == 4 and r.pending == 2
    assert session.calls == [([0, 1, 2, 3, 100], None)]  # one merged re-read
    assert r.run_due(applied_by_group({("t", 0): 6})) == 2 and r.pending == 0
    assert session.calls[-1] == ([4, 5, 100], None)


def test_only_keys_resident_in_l1_count_as_refreshed(tmp_path: Path) -> None:
    """hps_updates_l1_refreshed_keys_total counts the keys L1 held (each once), not every
    key of the update: an upsert changes resident rows only, a delete evicts them."""
    from hps.build import build_session
    from hps.updates import metrics

    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    cache = session.caches[SPEC.name]
    cache.insert(np.array([1, 2, 3]), np.ones((3, 2), np.float32))
    counted = metrics.L1_REFRESHED.labels(SPEC.name)
    before = counted._value.get()
    r = L1Refresher(session, grace_s=60.0)
    r.now(SPEC.name, np.array([1, 2, 2, 50, 51]), np.full((5, 2), 4, np.float32))
    assert counted._value.get() - before == 2  # keys 1 and 2; 50 and 51 are not in L1
    assert not cache.resident(np.array([50, 51])).any()  # an upsert inserts nothing
    r.now(SPEC.name, np.array([3, 3, 60]), None)
    assert counted._value.get() - before == 3  # key 3 evicted; 60 was not there
    assert not cache.resident(np.array([3])).any()
    session.close()


def _one_table_config(tmp_path: Path) -> PSConfig:
    """Model m, table t of dim 2, a NumPy L1 of 100 rows."""
    from tests.helpers import make_config

    return make_config(
        tmp_path,
        models=[{"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2],
                 "gpucache": True, "hps_cache": {"capacity": 100, "device": "numpy"}}],
    )  # fmt: skip


def test_held_keys_are_served_from_l2_and_cached_once_ready(tmp_path: Path) -> None:
    from hps.build import build_session

    cfg = _one_table_config(tmp_path)
    l2 = HashMapStore()
    tiers = Tiers(l2, None)
    tiers.open_tables([SPEC])
    session = build_session(cfg, tiers=tiers)
    cache = session.caches[SPEC.name]
    keys = np.array([4, 9], dtype=np.int64)
    l2.insert(SPEC.name, keys, np.ones((2, 2), np.float32))
    r = L1Refresher(session, grace_s=60.0)
    # pass 1 of a message whose rows another process has not written to L2 yet
    r.now(SPEC.name, keys, np.full((2, 2), 7, np.float32))
    r.later(SPEC.name, keys, token=Offset("t", 0, 3), held=True)
    np.testing.assert_array_equal(session.lookup(SPEC.name, keys), np.ones((2, 2)))
    assert not cache.resident(keys).any()  # the old rows were served, not cached
    l2.insert(SPEC.name, keys, np.full((2, 2), 7, np.float32))  # the writer applies it
    np.testing.assert_array_equal(session.lookup(SPEC.name, keys), np.full((2, 2), 7))
    assert r.run_due(applied_by_group({("t", 0): 3})) == 0 and cache.held == 2
    assert r.run_due(applied_by_group({("t", 0): 4})) == 0 and cache.held == 0  # pass 2 waits
    session.lookup(SPEC.name, keys)
    assert cache.resident(keys).all()
    r.later(SPEC.name, keys, token=Offset("t", 0, 4), held=True)
    r.release_all()  # the listener stops
    assert cache.held == 0 and r.pending == 2  # pass 2 still runs for both
    session.close()


def test_holds_end_partition_by_partition_asking_each_only_up_to_its_first_unready(
    tmp_path: Path,
) -> None:
    from hps.build import build_session

    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    cache = session.caches[SPEC.name]
    r = L1Refresher(session, grace_s=60.0)
    for offset in range(100):  # partition 0: one key a message
        r.later(SPEC.name, np.array([offset]), token=Offset("t", 0, offset), held=True)
    r.later(SPEC.name, np.array([500, 501]), token=Offset("t", 1, 7), held=True)
    asked: list[Offset | None] = []
    committed = {("t", 0): 10, ("t", 1): 8}

    def ready(token: Offset | None) -> bool:
        asked.append(token)
        return applied_by_group(committed)(token)

    assert r.run_due(ready) == 0 and cache.held == 90  # offsets 0-9 and partition 1 ended
    # ready asked: 11 of partition 0 (the 11th is not ready), 1 of partition 1; pass 2
    # asked nothing (the grace has not passed)
    assert len(asked) == 12
    session.close()


def test_versions_far_ahead_of_the_timestamp_are_dead_lettered_not_pinned() -> None:
    ts_ns = Msg(b"", 3).timestamp()[1] * 1_000_000  # the broker timestamp of offset 3
    bound = ts_ns + 300 * 10**9  # hps_max_version_ahead_s defaults to 300
    msgs = [
        upsert([1], 2**64 - 1, 0),  # would pin key 1 forever
        upsert([2], bound + 1_000_000 * 2, 1),  # just past its own bound (its ts is +1 ms)
        upsert([1, 2], 5, 2),  # so keys 1 and 2 take this later, ordinary update
        upsert([3], bound, 3),  # exactly at the bound: accepted
    ]
    consumer, source, dead, l2, l3 = make(msgs)
    consumer.run_once(threading.Event())
    assert [o for o, _ in dead.sent] == [0, 1]
    assert all(r.startswith("VersionError: update version") for _, r in dead.sent)
    assert "hps_max_version_ahead_s" in dead.sent[0][1]
    assert source.stored == [0, 1, 2, 3]
    for store in (l2, l3):
        values, found = store.fetch(SPEC.name, np.array([1, 2, 3]))
        assert found.all()
        np.testing.assert_array_equal(values[:, 0], [1, 2, 3])


def test_the_version_bound_is_configurable() -> None:
    ts_ns = Msg(b"", 0).timestamp()[1] * 1_000_000
    consumer, _, dead, _, l3 = make(
        [upsert([1], ts_ns + 2 * 10**9, 0)], hps_max_version_ahead_s=1.0
    )
    consumer.run_once(threading.Event())
    assert len(dead.sent) == 1 and "at most 1s" in dead.sent[0][1]
    consumer, _, dead, _, l3 = make(
        [upsert([1], ts_ns + 2 * 10**9, 0)], hps_max_version_ahead_s=3.0
    )
    consumer.run_once(threading.Event())
    assert not dead.sent and l3.fetch(SPEC.name, np.array([1]))[1].all()


class CatchUpCounter(HashMapStore):
    """An L3 that counts catch-ups (a secondary RocksDB's cost: a WAL re-read each)."""

    catch_ups = 0

    def catch_up(self) -> None:
        self.catch_ups += 1


def test_pass_two_catches_l3_up_once_and_only_when_l2_misses(tmp_path: Path) -> None:
    from hps.build import build_session

    cfg = _one_table_config(tmp_path)
    l2, l3 = HashMapStore(), CatchUpCounter()
    tiers = Tiers(l2, l3)
    tiers.open_tables([SPEC])
    session = build_session(cfg, tiers=tiers)
    keys = np.arange(1, 7, dtype=np.int64)
    l3.insert(SPEC.name, keys, np.ones((6, 2), np.float32))
    l2.insert(SPEC.name, keys[:3], np.ones((3, 2), np.float32))
    session.lookup(SPEC.name, keys)  # all six resident in L1 now (L3 caught up first)
    base = l3.catch_ups
    r = L1Refresher(session, grace_s=0.0)
    r.later(SPEC.name, keys[:3])  # L2 holds these: L3 is not read, nor caught up
    assert r.run_due() == 1 and l3.catch_ups == base
    new = np.full((6, 2), 7, np.float32)
    l3.insert(SPEC.name, keys, new)
    l2.insert(SPEC.name, keys[:3], new[:3])
    r.later(SPEC.name, keys[3:5])  # only in L3
    r.later(SPEC.name, keys[5:])
    assert r.run_due() == 2 and l3.catch_ups == base + 1  # one for the whole pass
    np.testing.assert_array_equal(session.lookup(SPEC.name, keys[3:]), new[3:])  # re-read
    session.close()
