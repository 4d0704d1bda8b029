"""A count-min sketch in ``xp`` arrays: approximate access counts of keys the cache does not hold.

The ``frequency`` policy uses it to know how often a key was asked for while it was not
resident (TinyLFU's admission test), in a fixed amount of memory. Counters are halved by
:meth:`CountMinSketch.age`, so old popularity fades and the policy follows a drifting hot set.
"""

from __future__ import annotations

import numpy as np

from hps.index import mix
from hps.types import Array, ArrayModule

DEPTH = 4
_SALT = np.int64(0x5DEECE66D)


def sketch_width(capacity: int) -> int:
    """Counters per row: a power of two of at least 4 per cache row (1,024 at least)."""
    return 1 << (max(1024, 4 * capacity) - 1).bit_length()


def sketch_nbytes(capacity: int) -> int:
    return DEPTH * sketch_width(capacity) * 4


def scatter_max(xp: ArrayModule, target: Array, index: Array, value: Array) -> None:
    """``target[index] = max(target[index], value)`` with repeated indices all applied."""
    if xp is np:
        np.maximum.at(target, index, value)
    else:
        import cupyx

        cupyx.scatter_max(target, index, value)


class CountMinSketch:
    """``DEPTH`` rows of int32 counters; a key's estimate is the minimum of its counters."""

    def __init__(self, capacity: int, xp: ArrayModule = np) -> None:
        self.xp = xp
        self.width = sketch_width(capacity)
        self._mask = np.uint64(self.width - 1)
        self.table = xp.zeros(DEPTH * self.width, dtype=xp.int32)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def _slots(self, keys: Array) -> Array:
        """Flat counter index of each key in each row, shape ``(DEPTH, n)`` (double hashing)."""
        xp = self.xp
        h1 = mix(keys, xp)
        h2 = mix(keys ^ _SALT, xp) | np.uint64(1)
        rows = xp.arange(DEPTH, dtype=xp.uint64)[:, None]
        idx = (h1[None, :] + rows * h2[None, :]) & self._mask
        offsets = rows * np.uint64(self.width)
        return (idx + offsets).astype(xp.int64)

    def add(self, keys: Array, count: Array | int = 1) -> None:
        """Count unique ``keys`` once each, or ``count[i]`` times for key ``i``.

        Conservative update: only the counters at a key's current minimum grow (each becomes
        at least estimate + count), which keeps collisions from inflating estimates.
        """
        if keys.size == 0:
            return
        xp = self.xp
        slots = self._slots(keys)
        est = self.table[slots].min(axis=0)
        new = est + (count if isinstance(count, int) else count.astype(xp.int32))
        vals = xp.broadcast_to(new.astype(xp.int32)[None, :], slots.shape)
        scatter_max(xp, self.table, slots.ravel(), vals.ravel())

    def raise_to(self, keys: Array, counts: Array) -> None:
        """Make every counter of each key at least its count (keeps an evicted row's history)."""
        if keys.size:
            slots = self._slots(keys)
            vals = self.xp.broadcast_to(counts.astype(self.xp.int32)[None, :], slots.shape)
            scatter_max(self.xp, self.table, slots.ravel(), vals.ravel())

    def estimate(self, keys: Array) -> Array:
        if keys.size == 0:
            return self.xp.zeros(0, dtype=self.xp.int32)
        return self.table[self._slots(keys)].min(axis=0)

    def age(self) -> None:
        """Halve every counter."""
        self.table >>= 1

    def clear(self) -> None:
        self.table.fill(0)
