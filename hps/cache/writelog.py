"""The cache's write log: which keys each write touched, so late writes of old reads lose.

A background insert carries vectors read from L2/L3 some time before it runs. The caller
reads ``version`` before that read and passes it back as ``since``; :meth:`WriteLog.since`
then tells which keys a later write (a Kafka update, an eviction, another insert) touched,
and those keys are skipped. The log keeps the writes of the last ``limit`` keys, and of the
last ``limit // KEYS_PER_ENTRY`` writes (whichever is fewer); a ``since`` older than what it
keeps is answered "all keys", which drops the write (it is only a cache). A single write of
more than ``limit`` keys cannot be kept: every token before it is answered "all keys".

Held keys (:meth:`WriteLog.hold`) count as written after every version until released: an
update this process has seen but L2/L3 may not hold yet, so a read of them from L2/L3 may be
older than it. Releasing records them once more, which drops a fill whose read came before
the release. At most ``limit`` keys are held; past that the oldest holds are released.

Layout: the keys of the kept writes, in order, in a ring of ``limit`` int64 slots (``xp``),
and per write, in two NumPy rings of ``limit // KEYS_PER_ENTRY`` entries, its version and
where its keys start: :func:`writelog_nbytes`, allocated once, whatever the writes' sizes
(12 bytes per key slot). It used to keep a tuple and an array per write: ~327 bytes a key
with one-key writes, 20.5 MiB per cache.

Costs, under the cache's lock: a ``since`` check of ``q`` keys finds the first write after
its token by a binary search of the kept writes' versions (``E``), then matches the keys
written since (``R``, one slice of the ring) and the held keys (``H``, kept sorted):
O(log E + q log H + R log q), as array operations, no Python step per write. (It used to
walk the writes in Python: 10-15 ms for a token 65,535 one-key writes old.) A record is
O(log E) plus the copy of its keys; a hold or release merges into or cuts out of the
sorted held keys: O(H) of memory moves.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np

from hps.types import Array, ArrayModule

log = logging.getLogger(__name__)

MIN_KEYS = 1 << 16  # a cache's log keeps at least this many keys (max with its capacity)
KEYS_PER_ENTRY = 4  # key slots per entry slot: a write of one key costs as much as four
KEY_BYTES = 8  # a key slot (int64)
ENTRY_BYTES = 16  # an entry: version and first key (int64 each)


def log_limit(capacity: int) -> int:
    """Keys kept by the write log of a cache of ``capacity`` rows."""
    return max(MIN_KEYS, capacity)


def writelog_nbytes(limit: int) -> int:
    """Exact bytes a :class:`WriteLog` of ``limit`` keys allocates, held keys aside (a hold
    keeps its holder's key array, and adds a sorted copy, 8 bytes a key, and ~72 bytes)."""
    return KEY_BYTES * limit + ENTRY_BYTES * _entry_slots(limit)


def _entry_slots(limit: int) -> int:
    return max(1, limit // KEYS_PER_ENTRY)


class WriteLog:
    """Versions and the keys (``xp`` arrays) written at each; not thread-safe on its own."""

    def __init__(self, xp: ArrayModule, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the write log needs a limit of at least 1 key, got {limit}")
        self.xp = xp
        self.limit = limit
        self.version = 0
        self._ring: Array = xp.zeros(limit, dtype=xp.int64)  # the kept writes' keys, in order
        slots = _entry_slots(limit)
        self._versions = np.zeros(slots, dtype=np.int64)  # per write, a ring too
        self._starts = np.zeros(slots, dtype=np.int64)  # its first key's number (below)
        # Writes are numbered from the first one logged, keys too; writes [_head, _tail)
        # are kept, and _end is the number of the next key.
        self._head = self._tail = self._end = 0
        self._floor = 0  # versions up to this one are no longer in the log
        self._holds: dict[int, Array] = {}  # in the order they were taken
        self._held_keys = 0
        self._held: Array = xp.empty(0, dtype=xp.int64)  # every hold's keys, merged, sorted
        self._next_hold = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the log's rings (:func:`writelog_nbytes`)."""
        return int(self._ring.nbytes) + self._versions.nbytes + self._starts.nbytes

    def record(self, keys: Array) -> None:
        """A write touched ``keys``: a new version."""
        self.version += 1
        n = int(keys.size)
        if n == 0:
            return
        if n > self.limit:
            self._forget()
            return
        slots = self._versions.size
        # Room for one more write and n more keys: the oldest writes go.
        keep = max(self._head, self._tail + 1 - slots)
        overwritten = self._end + n - self.limit  # keys numbered below it leave the ring
        if keep < self._tail and self._starts[keep % slots] < overwritten:
            keep = _search(self._starts, keep, self._tail, overwritten, "left")
        if keep > self._head:
            self._floor = int(self._versions[(keep - 1) % slots])
            self._head = keep
        at = self._end % self.limit
        first = min(n, self.limit - at)
        self._ring[at : at + first] = keys[:first]
        if first < n:
            self._ring[: n - first] = keys[first:]
        self._versions[self._tail % slots] = self.version
        self._starts[self._tail % slots] = self._end
        self._tail += 1
        self._end += n

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
        out = _in_sorted(xp, keys, self._held)
        after = _search(self._versions, self._head, self._tail, version, "right")
        if after < self._tail:
            start = int(self._starts[after % self._starts.size])
            out |= _written(xp, keys, self._keys_from(start))
        return out

    def clear(self) -> None:
        """Forget every entry: any earlier version now counts as lost."""
        self.version += 1
        self._forget()

    def _forget(self) -> None:
        """Drop every kept write: versions up to now count as lost."""
        self._head = self._tail = self._end = 0
        self._floor = self.version

    def _keys_from(self, start: int) -> Array:
        """The keys logged from key number ``start`` on: a slice of the ring (two, joined,
        where it wraps)."""
        at, n = start % self.limit, self._end - start
        if at + n <= self.limit:
            return self._ring[at : at + n]
        return self.xp.concatenate([self._ring[at:], self._ring[: at + n - self.limit]])


def _search(ring: np.ndarray, lo: int, hi: int, value: int, side: Literal["left", "right"]) -> int:
    """``searchsorted`` over the entries numbered ``[lo, hi)`` of ``ring`` (entry ``i`` at
    ``i % ring.size``), ascending in that order: the number of the first one >= ``value``
    (``side="left"``) or > it (``"right"``); ``hi`` when there is none."""
    at = lo % ring.size
    first = ring[at : min(ring.size, at + hi - lo)]
    i = int(np.searchsorted(first, value, side=side))
    if i < first.size or first.size == hi - lo:
        return lo + i
    rest = ring[: hi - lo - first.size]
    return lo + first.size + int(np.searchsorted(rest, value, side=side))


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
