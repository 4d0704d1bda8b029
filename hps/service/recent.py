"""A read that reports share: made at most once per interval, however often they ask."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Recent(Generic[K, T]):
    """The last answer of a read, reused while it is younger than ``max_age_s`` and asked for
    with the same key; a caller arriving while the read runs waits for its answer (one read,
    not one per caller). A read that raises is not kept: the next caller reads again."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.reads = 0  # reads made (a test reads it)
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: tuple[K, float, T] | None = None

    def get(self, key: K, read: Callable[[K], T]) -> T:
        with self._lock:
            kept = self._kept
            if kept is not None and kept[0] == key and self._clock() - kept[1] < self.max_age_s:
                return kept[2]
            started = self._clock()
            value = read(key)
            self.reads += 1
            self._kept = (key, started, value)
            return value
