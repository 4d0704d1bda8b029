"""RowStore: where one cache keeps its rows, in ``xp`` arrays; no policy and no lock.

``C`` = capacity rows: a :class:`hps.index.KeyIndex` maps a key to its row, ``values[C, width]``
is the arena of stored rows in the table's :class:`hps.rowformat.RowFormat` (float32 ``dim``,
float16 ``dim``, int8 ``dim`` codes + scale and offset: ``fmt.width(dim)`` of ``fmt.dtype``),
``row_keys`` / ``ticks`` (last access) / ``pinned`` describe each row, and a stack holds the
free rows. :class:`hps.cache.EmbeddingCache` decides what goes where; this
class only executes, a whole batch at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hps.cache.xp import to_host
from hps.index import TOMBSTONE, KeyIndex, aligned_full, slots_for
from hps.rowformat import FLOAT32, RowFormat
from hps.types import Array, ArrayModule

if TYPE_CHECKING:
    from hps.cache.gpu_rows import RowKernels

MAX_LOAD = 0.5  # fixed capacity: a sparser index ends most probes in the first group
# Per row beyond the arena and the index: row key 8, tick 8, pinned flag 1, free-stack slot 8.
ROW_OVERHEAD = 8 + 8 + 1 + 8


def rows_nbytes(capacity: int, dim: int, fmt: RowFormat = FLOAT32) -> int:
    """Exact bytes a RowStore allocates: arena, row metadata and the index (12 per slot)."""
    return capacity * (fmt.row_bytes(dim) + ROW_OVERHEAD) + slots_for(capacity, MAX_LOAD) * 12


class RowStore:
    def __init__(self, capacity: int, dim: int, xp: ArrayModule, fmt: RowFormat = FLOAT32) -> None:
        self.capacity, self.dim, self.xp, self.fmt = capacity, dim, xp, fmt
        self.width = fmt.width(dim)
        self.index = KeyIndex(capacity, xp=xp, max_load=MAX_LOAD)
        self.values = aligned_full(xp, (capacity, self.width), 0, fmt.dtype)
        # What the compiled kernels read: the same memory, float16 as its bits (uint16:
        # numba has no float16 on the CPU; the kernels convert the bits themselves).
        self.kernel_values = self.values.view(np.uint16) if fmt.dtype == np.float16 else self.values
        self.row_keys = xp.full(capacity, TOMBSTONE, dtype=xp.int64)
        self.ticks = xp.zeros(capacity, dtype=xp.int64)
        self.pinned = xp.zeros(capacity, dtype=bool)
        self.free = xp.arange(capacity - 1, -1, -1, dtype=xp.int64)  # a stack; top at the end
        self.n_free = capacity
        # On a GPU: lookups, overwrites and placements as one kernel per batch (gpu_rows)
        self.ops: RowKernels | None = None

    def __len__(self) -> int:
        return self.capacity - self.n_free

    @property
    def nbytes(self) -> int:
        arrays = (self.values, self.row_keys, self.ticks, self.pinned, self.free)
        return sum(int(a.nbytes) for a in arrays) + self.index.nbytes

    def lookup(self, keys: Array) -> Array:
        """Row of each key (``xp`` int64), -1 where absent."""
        if self.ops is not None:
            return self.ops.lookup(self, keys)
        return self.index.lookup(keys)

    def overwrite(self, keys: Array, values: Array, allow: Array | None, tick: int | None) -> Array:
        """Row of each key (-1: absent); the resident ones where ``allow`` (None: all) get
        their stored row from ``values`` and, unless ``tick`` is None, that tick."""
        if self.ops is not None:
            return self.ops.overwrite(self, keys, values, allow, tick)
        rows = self.index.lookup(keys)
        write = rows >= 0 if allow is None else allow & (rows >= 0)
        target = rows[write]
        self.values[target] = values[write]
        if tick is not None:
            self.ticks[target] = tick
        return rows

    def resident_into(self, lo: int, hi: int, out: np.ndarray) -> int:
        """Copy the keys of the occupied rows among ``lo:hi`` to the start of the host array
        ``out`` (room for ``hi - lo`` keys), in row order; returns how many."""
        keys = self.row_keys[lo:hi]
        held = keys != TOMBSTONE
        n = int(self.xp.count_nonzero(held))
        if isinstance(keys, np.ndarray):  # into place: no array per call
            np.compress(held, keys, out=out[:n])
        else:
            out[:n] = to_host(keys[held])
        return n

    def occupied(self, rows: Array | None = None) -> Array:
        """Whether each row (of ``rows``; None: all) holds a key."""
        return (self.row_keys if rows is None else self.row_keys[rows]) != TOMBSTONE

    def place(self, keys: Array, values: Array, tick: int) -> Array:
        """Put absent, unique ``keys`` with their stored rows into free rows (at most
        ``n_free``); returns the rows."""
        n = int(keys.size)
        rows = self.free[self.n_free - n : self.n_free].copy()
        self.n_free -= n
        if self.ops is not None:
            self._place_kernel(keys, rows, values, tick)
            return rows
        self.index.insert(keys, rows)
        self.values[rows] = values
        self.row_keys[rows] = keys
        self.ticks[rows] = tick
        self.pinned[rows] = False
        return rows

    def _place_kernel(self, keys: Array, rows: Array, values: Array, tick: int) -> None:
        """:meth:`place` by the GPU kernel; the index's counts are kept here, as its own
        ``insert`` keeps them (it grows first when the new keys would pass its load)."""
        assert self.ops is not None
        index, n = self.index, int(keys.size)
        if n == 0:
            return
        index.reserve(n)
        reused = self.ops.place(self, keys, rows, values, tick)
        index.inserted_elsewhere(n, reused)

    def release(self, rows: Array) -> None:
        """Free occupied ``rows`` (unique): their keys leave the index."""
        if rows.size == 0:
            return
        self.index.remove(self.row_keys[rows])
        self.row_keys[rows] = TOMBSTONE
        self.pinned[rows] = False
        self.free[self.n_free : self.n_free + rows.size] = rows
        self.n_free += int(rows.size)

    def clear(self) -> None:
        self.index.clear()
        self.row_keys.fill(TOMBSTONE)
        self.pinned.fill(False)
        self.free[:] = self.xp.arange(self.capacity - 1, -1, -1, dtype=self.xp.int64)
        self.n_free = self.capacity
