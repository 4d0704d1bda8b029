"""The consumer loop with an in-memory message source: batching, retries, dead letters, commits."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from hps.config import UpdateSourceConfig
from hps.errors import BackendUnavailable
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.types import TableSpec
from hps.updates import codec
from hps.updates.applier import Applier
from hps.updates.consumer import UpdateConsumer
from hps.updates.freshness import L1Refresher

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

    def poll(self, timeout_s: float) -> Msg | None:
        return self.queue.popleft() if self.queue else None

    def drain(self, n: int) -> list[Msg]:
        out = []
        while self.queue and len(out) < n:
            out.append(self.queue.popleft())
        return out

    def store(self, msgs: list[Msg]) -> None:
        self.stored.extend(m.offset() for m in msgs)

    def commit(self, *, asynchronous: bool) -> None:
        self.commits += 1

    def lag(self) -> dict[tuple[str, int], int]:
        return {(TOPIC, 0): len(self.queue)}

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


def test_a_failing_tier_is_retried_and_nothing_is_skipped() -> None:
    consumer, source, _, l2, l3 = make([upsert([1, 2], 1, 0)], l2=FlakyStore(failures=3))
    assert consumer.run_once(threading.Event()) == 1
    assert l2.fetch(SPEC.name, np.array([1, 2]))[1].all()
    assert source.stored == [0]


def test_stop_during_backoff_stores_nothing() -> None:
    consumer, source, _, l2, _ = make(
        [upsert([1], 1, 0)], l2=FlakyStore(failures=10**6), failure_backoff_ms=10
    )
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert consumer.run_once(stop) == 0
    assert source.stored == []


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


class FakeCache:
    def __init__(self) -> None:
        self.rows: dict[int, np.ndarray] = {}

    def evict(self, keys: np.ndarray) -> None:
        for k in keys.tolist():
            self.rows.pop(k, None)


class FakeSession:
    def __init__(self) -> None:
        self.caches = {SPEC.name: FakeCache()}
        self.tiers = Tiers(None, None)
        self.calls: list[tuple[list[int], Any]] = []

    def refresh(self, table: str, keys: np.ndarray, values: Any = None) -> None:
        self.calls.append((keys.tolist(), None if values is None else values.tolist()))


def test_refresher_passes() -> None:
    session = FakeSession()
    r = L1Refresher(session, grace_s=0.0)  # type: ignore[arg-type]
    r.now(SPEC.name, np.array([5, 3, 5]), np.array([[1, 1], [2, 2], [3, 3]], np.float32))
    # passed on as received: session.refresh de-duplicates (last row of a key wins)
    assert session.calls == [([5, 3, 5], [[1, 1], [2, 2], [3, 3]])]
    r.now("unknown.table", np.array([1]), np.ones((1, 2), np.float32))
    assert len(session.calls) == 1
    r.later(SPEC.name, np.array([3, 5]), token=7)
    assert r.run_due(lambda tok: tok < 7) == 0 and r.pending == 1
    assert r.run_due(lambda tok: tok <= 7) == 1 and r.pending == 0
    assert session.calls[-1] == ([3, 5], None)  # pass 2 re-reads from L2/L3
