"""``hps.updates.Publisher`` driven from gevent: its blocking calls off the event loop.

librdkafka blocks the calling OS thread: ``prepare()`` waits for metadata (up to 15 s on a
broker that does not answer), ``publish()`` waits for room when the local queue is full, and
``flush()`` / ``close()`` wait for delivery. In the Locust process every user shares one
gevent loop, so a blocking call there froze every reader (their latency took it). Each
call here runs in gevent's threadpool (:func:`off_loop`): the user that made it waits, the
others run on.

``publish_acked`` waits for the broker's acknowledgement of every message of the batch
(``Publisher.flush``): ``Publisher.publish`` only queues, and delivery errors surface in
``flush``, so timing ``publish`` alone would time a queue and miss a broker that refuses
every update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np
from gevent import get_hub

T = TypeVar("T")
ACK_TIMEOUT_S = 10.0


def off_loop(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in gevent's threadpool: its result or its exception, in this greenlet,
    while the other greenlets run."""

    def run() -> tuple[object, BaseException | None]:
        try:
            return fn(*args), None
        except Exception as exc:  # raised here, not printed by the pool's hub
            return None, exc

    value, exc = get_hub().threadpool.apply(run)
    if exc is not None:
        raise exc
    return value


class Driver(Protocol):
    """What is used of ``hps.updates.producer.Publisher``."""

    def prepare(self, model: str, tables: Sequence[str], timeout_s: float = ...) -> None: ...
    def publish(self, model: str, table: str, keys: np.ndarray, vectors: np.ndarray) -> int: ...
    def flush(self, timeout_s: float = ...) -> None: ...
    def close(self, timeout_s: float = ...) -> None: ...


class OffLoopPublisher:
    """A publisher for one Locust user: every call waits in a threadpool thread, never on
    the gevent loop. Calls of one user come one at a time (the Publisher is not shared)."""

    def __init__(self, publisher: Driver) -> None:
        self.publisher = publisher

    def prepare(self, model: str, tables: Sequence[str]) -> None:
        off_loop(self.publisher.prepare, model, tables)

    def publish(self, model: str, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Queue the update (delivery is not waited for)."""
        off_loop(self.publisher.publish, model, table, keys, vectors)

    def deliver(self, timeout_s: float = ACK_TIMEOUT_S) -> None:
        """Wait for the delivery of what was queued; raise its delivery errors, or
        ``BackendUnavailable`` when some is not acknowledged within ``timeout_s``."""
        off_loop(self.publisher.flush, timeout_s)

    def publish_acked(
        self,
        model: str,
        table: str,
        keys: np.ndarray,
        vectors: np.ndarray,
        timeout_s: float = ACK_TIMEOUT_S,
    ) -> None:
        """Publish and wait for the broker's acknowledgement of the whole batch (one trip
        to the threadpool); raise as :meth:`deliver`."""

        def both() -> None:
            self.publisher.publish(model, table, keys, vectors)
            self.publisher.flush(timeout_s)

        off_loop(both)

    def close(self, timeout_s: float = ACK_TIMEOUT_S) -> None:
        off_loop(self.publisher.close, timeout_s)
