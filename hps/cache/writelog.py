"""The cache's write log: which keys each write touched, so late writes of old reads lose.

A background insert carries vectors read from L2/L3 some time before it runs. The caller
reads ``version`` before that read and passes it back as ``since``; :meth:`WriteLog.since`
then tells which keys a later write (a Kafka update, an eviction, another insert) touched,
and those keys are skipped. The log keeps at least the last ``limit`` keys; a ``since``
older than that is answered "all keys", which drops the write (it is only a cache).
"""

from __future__ import annotations

import logging
from collections import deque

from hps.types import Array, ArrayModule

log = logging.getLogger(__name__)


class WriteLog:
    """Versions and the keys (``xp`` arrays) written at each; not thread-safe on its own."""

    def __init__(self, xp: ArrayModule, limit: int) -> None:
        self.xp = xp
        self.limit = limit
        self.version = 0
        self._entries: deque[tuple[int, Array]] = deque()
        self._keys = 0
        self._floor = 0  # versions up to this one are no longer in the log

    def record(self, keys: Array) -> None:
        """A write touched ``keys``: a new version."""
        self.version += 1
        if keys.size == 0:
            return
        self._entries.append((self.version, keys))
        self._keys += int(keys.size)
        while self._keys > self.limit and len(self._entries) > 1:
            version, old = self._entries.popleft()
            self._keys -= int(old.size)
            self._floor = version

    def since(self, keys: Array, version: int) -> Array:
        """Mask of ``keys`` written after ``version`` (all of them when the log lost track)."""
        xp = self.xp
        if version < self._floor:
            log.debug("L1 write log no longer covers version %d (floor %d)", version, self._floor)
            return xp.ones(keys.size, dtype=bool)
        recent = [k for v, k in self._entries if v > version]
        if not recent:
            return xp.zeros(keys.size, dtype=bool)
        return xp.isin(keys, xp.concatenate(recent))

    def clear(self) -> None:
        """Forget every entry: any earlier version now counts as lost."""
        self.version += 1
        self._entries.clear()
        self._keys = 0
        self._floor = self.version
