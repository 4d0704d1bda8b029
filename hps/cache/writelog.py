"""The cache's write log: which keys each write touched, so late writes of old reads lose.

A background insert carries vectors read from L2/L3 some time before it runs. The caller
reads ``version`` before that read and passes it back as ``since``; :meth:`WriteLog.since`
then tells which keys a later write (a Kafka update, an eviction, another insert) touched,
and those keys are skipped. The log keeps at least the last ``limit`` keys; a ``since``
older than that is answered "all keys", which drops the write (it is only a cache).

Held keys (:meth:`WriteLog.hold`) count as written after every version until released: an
update this process has seen but L2/L3 may not hold yet, so a read of them from L2/L3 may be
older than it. Releasing records them once more, which drops a fill whose read came before
the release. At most ``limit`` keys are held; past that the oldest holds are released.
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
        self._holds: dict[int, Array] = {}  # in the order they were taken
        self._held_keys = 0
        self._held: Array | None = None  # all held keys, sorted; None: to be rebuilt
        self._next_hold = 0

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

    def hold(self, keys: Array) -> int:
        """Count ``keys`` as written after every version until :meth:`release` of the
        returned handle."""
        self._next_hold += 1
        if keys.size:
            self._holds[self._next_hold] = keys
            self._held_keys += int(keys.size)
            self._held = None
            while self._held_keys > self.limit and len(self._holds) > 1:
                self.release(next(iter(self._holds)))
        return self._next_hold

    def release(self, handle: int) -> None:
        """End a hold (a handle already released, or dropped past ``limit``, is ignored)."""
        keys = self._holds.pop(handle, None)
        if keys is None:
            return
        self._held_keys -= int(keys.size)
        self._held = None
        self.record(keys)

    @property
    def held(self) -> int:
        """Keys held now (a key held twice counts twice)."""
        return self._held_keys

    def since(self, keys: Array, version: int) -> Array:
        """Mask of ``keys`` written after ``version`` (all of them when the log lost track),
        held keys included."""
        xp = self.xp
        if version < self._floor:
            log.debug("L1 write log no longer covers version %d (floor %d)", version, self._floor)
            return xp.ones(keys.size, dtype=bool)
        recent = []
        for v, k in reversed(self._entries):  # newest first: stop at the first one not after
            if v <= version:
                break
            recent.append(k)
        if self._holds:
            if self._held is None:
                self._held = xp.unique(xp.concatenate(list(self._holds.values())))
            recent.append(self._held)
        if not recent:
            return xp.zeros(keys.size, dtype=bool)
        return xp.isin(keys, xp.concatenate(recent))

    def clear(self) -> None:
        """Forget every entry: any earlier version now counts as lost."""
        self.version += 1
        self._entries.clear()
        self._keys = 0
        self._floor = self.version
