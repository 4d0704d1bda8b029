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

Costs, under the cache's lock: a ``since`` check of ``q`` keys reads the writes after its
token (``R`` keys, newest first) and the held keys (``H``, kept sorted):
O(q log H + R log q), never a sort of what is held or written. A hold or release merges into
or cuts out of the sorted held keys: O(H) of memory moves. (Each ``since`` used to sort every
held key again: 15-35 ms for 65,536 held keys, under the lock a request's probe waits on.)
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
        self._held: Array = xp.empty(0, dtype=xp.int64)  # every hold's keys, merged, sorted
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
            self._held = _merged(self.xp, self._held, keys)
            while self._held_keys > self.limit and len(self._holds) > 1:
                self.release(next(iter(self._holds)))
        return self._next_hold

    def release(self, handle: int) -> None:
        """End a hold (a handle already released, or dropped past ``limit``, is ignored)."""
        keys = self._holds.pop(handle, None)
        if keys is None:
            return
        self._held_keys -= int(keys.size)
        self._held = _without(self.xp, self._held, keys)
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
        out = _in_sorted(xp, keys, self._held)
        if recent:
            out |= _written(xp, keys, xp.concatenate(recent))
        return out

    def clear(self) -> None:
        """Forget every entry: any earlier version now counts as lost."""
        self.version += 1
        self._entries.clear()
        self._keys = 0
        self._floor = self.version


def _merged(xp: ArrayModule, held: Array, keys: Array) -> Array:
    """Sorted ``held`` with ``keys`` added: two sorted runs, which a stable sort merges."""
    return xp.sort(xp.concatenate([held, xp.sort(keys)]), kind="stable")


def _without(xp: ArrayModule, held: Array, keys: Array) -> Array:
    """Sorted ``held`` less one occurrence of each of ``keys`` (all of them in it)."""
    k = xp.sort(keys)
    rank = xp.arange(k.size) - xp.searchsorted(k, k, side="left")  # nth copy within keys
    keep = xp.ones(held.size, dtype=bool)
    keep[xp.searchsorted(held, k, side="left") + rank] = False
    return held[keep]


def _in_sorted(xp: ArrayModule, keys: Array, ordered: Array) -> Array:
    """Mask of ``keys`` found in the sorted ``ordered``."""
    if ordered.size == 0:
        return xp.zeros(keys.size, dtype=bool)
    pos = xp.minimum(xp.searchsorted(ordered, keys), ordered.size - 1)
    return ordered[pos] == keys


def _written(xp: ArrayModule, keys: Array, written: Array) -> Array:
    """Mask of ``keys`` in ``written`` (unsorted; it may be a whole refresh's keys): each
    written key is looked up among the sorted query keys, O(|written| log |keys|)."""
    if keys.size == 0 or written.size <= keys.size:
        return xp.isin(keys, written)
    uniq, inverse = xp.unique(keys, return_inverse=True)
    pos = xp.minimum(xp.searchsorted(uniq, written), uniq.size - 1)
    found = xp.zeros(uniq.size, dtype=bool)
    found[pos[uniq[pos] == written]] = True
    return found[inverse.reshape(-1)]
