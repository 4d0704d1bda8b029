"""The Kafka users' publisher: its blocking calls run off the gevent loop, and a batch is
timed to the broker's acknowledgement, its delivery errors raised."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest

gevent = pytest.importorskip("gevent")

from hps.errors import BackendError  # noqa: E402
from hps.loadtest.users.publisher import OffLoopPublisher  # noqa: E402

BLOCK_S = 0.3


class _Blocking:
    """A Publisher whose calls block their OS thread, as librdkafka's do; ``refuse``: every
    delivery fails, as from a broker that rejects every update."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.calls: list[str] = []

    def prepare(self, model: str, tables: Sequence[str], timeout_s: float = 15.0) -> None:
        time.sleep(BLOCK_S)  # metadata of a broker that does not answer
        self.calls.append("prepare")

    def publish(self, model: str, table: str, keys: np.ndarray, vectors: np.ndarray) -> int:
        self.calls.append("publish")
        return 1

    def flush(self, timeout_s: float = 60.0) -> None:
        time.sleep(BLOCK_S / 3)
        self.calls.append("flush")
        if self.refuse:
            raise BackendError("kafka: 1 update messages not delivered: t[0]: POLICY_VIOLATION")

    def close(self, timeout_s: float = 60.0) -> None:
        self.flush(timeout_s)


def _ticks_while(call: object) -> int:
    """How often another greenlet ran (every 10 ms) while ``call`` ran in this one."""
    ticks = 0

    def ticker() -> None:
        nonlocal ticks
        while True:
            gevent.sleep(0.01)
            ticks += 1

    t = gevent.spawn(ticker)
    gevent.sleep(0)
    try:
        call()  # type: ignore[operator]
    finally:
        t.kill()
    return ticks


def test_blocking_calls_leave_the_other_users_running() -> None:
    pub = OffLoopPublisher(_Blocking())
    # 0 if it blocked the loop; how many more depends on how busy the machine is
    assert _ticks_while(lambda: pub.prepare("m", ["a", "b"])) >= 1
    assert _ticks_while(lambda: pub.close()) >= 1
    assert pub.publisher.calls == ["prepare", "flush"]  # type: ignore[attr-defined]


def test_a_batch_waits_for_its_acknowledgement_and_raises_delivery_errors() -> None:
    keys, vectors = np.arange(4), np.ones((4, 2), np.float32)
    ok = OffLoopPublisher(_Blocking())
    start = time.perf_counter()
    ok.publish_acked("m", "t", keys, vectors)
    assert time.perf_counter() - start >= BLOCK_S / 3  # timed to the acknowledgement
    assert ok.publisher.calls == ["publish", "flush"]  # type: ignore[attr-defined]
    refused = OffLoopPublisher(_Blocking(refuse=True))
    with pytest.raises(BackendError, match="not delivered"):
        refused.publish_acked("m", "t", keys, vectors)
    refused.publish("m", "t", keys, vectors)  # only queued: the error comes with delivery
    with pytest.raises(BackendError, match="POLICY_VIOLATION"):
        refused.deliver(1.0)
