"""A read that reports share: made at most once per interval, however often they ask."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class _Read(Generic[K, T]):
    """One read of ``key``: running until ``done``, then its value or its error (neither
    when it was abandoned: a ``BaseException`` such as ``KeyboardInterrupt`` ended it)."""

    __slots__ = ("done", "ended", "error", "key", "value")

    def __init__(self, key: K) -> None:
        self.key = key
        self.done = False
        self.ended = 0.0  # the clock when the read returned or raised
        self.value: tuple[T] | None = None
        self.error: Exception | None = None

    @property
    def answered(self) -> bool:
        return self.value is not None or self.error is not None

    def answer(self) -> T:
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value[0]


class Recent(Generic[K, T]):
    """The last answer of a read, reused while it is younger than ``max_age_s`` and asked for
    with the same key; one read at a time.

    - Its age counts from when the read *ended*, so a read slower than ``max_age_s`` is still
      reused for ``max_age_s`` after it returns.
    - A caller arriving while a read of its key runs waits for that read and takes its answer
      (one read, not one per caller, however long it takes); a caller asking for another key
      waits for the running read to end, then reads (or joins a read of its key begun since).
    - A read that raises is kept as well, as a back-off: for ``max_age_s`` after it ended, the
      callers asking for that key, and those that waited for it, get the same exception
      without a new read; then the next caller reads again. (A read that ends in a
      ``BaseException`` that is not an ``Exception`` is not kept: its waiters read again.)
    - Only the last key's answer is kept: asking for another key replaces it.
    """

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.reads = 0  # reads made (a test reads it)
        self.waiting = 0  # callers waiting now for another caller's read (a test reads it)
        self._clock = clock
        self._changed = threading.Condition(threading.Lock())
        self._kept: _Read[K, T] | None = None
        self._running: _Read[K, T] | None = None

    def get(self, key: K, read: Callable[[K], T]) -> T:
        with self._changed:
            while True:
                kept = self._kept
                if (
                    kept is not None
                    and kept.key == key
                    and self._clock() - kept.ended < self.max_age_s
                ):
                    return kept.answer()
                running = self._running
                if running is None:
                    break
                self.waiting += 1
                try:
                    while not running.done:
                        self._changed.wait()
                finally:
                    self.waiting -= 1
                if running.key == key and running.answered:
                    return running.answer()
            mine: _Read[K, T] = _Read(key)
            self._running = mine
        try:
            mine.value = (read(key),)
        except Exception as exc:
            mine.error = exc
        finally:
            with self._changed:
                mine.ended = self._clock()
                mine.done = True
                self.reads += 1
                if mine.answered:
                    self._kept = mine
                self._running = None
                self._changed.notify_all()
        return mine.answer()
