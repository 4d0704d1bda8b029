"""A GPU cache's index lookups and row writes, one kernel launch per batch.

On CuPy, :class:`hps.cache.rows.RowStore` hands its lookups, its overwrites of resident rows
(an upsert's resident keys, ``EmbeddingCache.update``: the Kafka refresh) and its placement
of new keys (miss fill, warm-up) to these kernels (:mod:`hps.cache.cuda_write`) instead of
the probe rounds of :class:`hps.index.KeyIndex`, a few array operations each. They run on
the current stream, as the cache's other array operations, so they are ordered with them
(and, that stream being CUDA's legacy default one, with the device's: :mod:`hps.cache.device`).
What to write where (victims, admission, the pinned set) is still decided by
:class:`hps.cache.placement.Placement`; the kernels only execute it, with the same result.
Evictions still remove keys with ``KeyIndex.remove``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hps.cache.device import Device, address
from hps.cache.kernels_cupy import NULL, THREADS, blocks_for, tile_for
from hps.types import Array

if TYPE_CHECKING:
    from hps.cache.rows import RowStore


def _word(row_bytes: int, *arrays: Array) -> int:
    """The widest word (16, 4 or 1 bytes) that divides the row and every array's address."""
    for word in (16, 4):
        if row_bytes % word == 0 and all(address(a) % word == 0 for a in arrays):
            return word
    return 1


class RowKernels:
    """The ``write_rows`` and ``place_rows`` kernels of a RowStore, launched on ``device``
    (``tile`` forces the lanes per key, for tests)."""

    def __init__(self, device: Device, tile: int | None = None) -> None:
        self.device = device
        self.tile = tile

    def _geometry(self, store: RowStore, n: int) -> tuple[int, int, np.int32]:
        tile = int(tile_for(store.dim)) if self.tile is None else self.tile
        return blocks_for(-(-n // (32 // tile)), self.device), THREADS, np.int32(tile)

    def lookup(self, store: RowStore, keys: Array) -> Array:
        """Row of each key (int64), -1 where absent."""
        return self.overwrite(store, keys, None, None, None)

    def overwrite(self, store: RowStore, keys: Array, values: Array | None, allow: Array | None,
                  tick: int | None) -> Array:  # fmt: skip
        """:meth:`RowStore.overwrite` (``values`` None: a lookup)."""
        xp = store.xp
        keys = xp.ascontiguousarray(keys, dtype=xp.int64)
        n = int(keys.size)
        rows = xp.empty(n, dtype=xp.int64)
        if n == 0:
            return rows
        row_bytes = store.fmt.row_bytes(store.dim)
        src: Array | np.uint64 = NULL
        word = 1
        if values is not None:
            stored = xp.ascontiguousarray(values, dtype=store.fmt.dtype)
            src, word = stored, _word(row_bytes, stored, store.values)
        mask = NULL if allow is None else xp.ascontiguousarray(allow).view(xp.uint8)
        index = store.index
        blocks, threads, tile = self._geometry(store, n)
        args = (
            index.slot_keys, index.slot_rows, np.int64(index.gmask), keys, np.int64(n), rows,
            mask, src, store.values, np.int64(row_bytes), np.int32(word),
            store.ticks.view(np.uint64), np.uint64(tick or 0), np.int32(tick is not None), tile,
        )  # fmt: skip
        self.device.launch("write_rows", blocks, threads, args, own_stream=False)
        return rows

    def place(self, store: RowStore, keys: Array, rows: Array, values: Array, tick: int) -> int:
        """Index ``keys`` (absent, unique, not reserved) at ``rows`` and write their stored
        rows, keys, ticks and pinned flags; returns the tombstones the index reused (the
        caller keeps the index's counts and grows it first when needed)."""
        xp = store.xp
        n = int(keys.size)
        if n == 0:
            return 0
        keys = xp.ascontiguousarray(keys, dtype=xp.int64)
        rows = xp.ascontiguousarray(rows, dtype=xp.int64)
        src = xp.ascontiguousarray(values, dtype=store.fmt.dtype)
        row_bytes = store.fmt.row_bytes(store.dim)
        reused = xp.zeros(1, dtype=xp.uint64)
        index = store.index
        blocks, threads, tile = self._geometry(store, n)
        args = (
            index.slot_keys, index.slot_rows, np.int64(index.gmask), keys, rows, np.int64(n),
            src, store.values, np.int64(row_bytes), np.int32(_word(row_bytes, src, store.values)),
            store.row_keys, store.ticks.view(np.uint64), np.uint64(tick),
            store.pinned.view(np.uint8), tile, reused,
        )  # fmt: skip
        self.device.launch("place_rows", blocks, threads, args, own_stream=False)
        return int(reused[0])
