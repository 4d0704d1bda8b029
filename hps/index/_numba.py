"""The numba loops of :class:`hps.index.KeyIndex` (imported only when numba is installed).

One pass over the keys, each probed to its end before the next: the same probe sequence,
slot markers and layout as the NumPy rounds in :mod:`hps.index` (the device kernels and the
NumPy path read the slots these write), without their per-round temporaries.
"""

from __future__ import annotations

import numba
import numpy as np

from hps.index import _M1, _M2, EMPTY, GROUP, TOMBSTONE

_EMPTY = np.int64(EMPTY)
_TOMB = np.int64(TOMBSTONE)
_GROUP = GROUP


@numba.njit(cache=True, nogil=True, inline="always")
def _home(key: np.int64, gmask: np.uint64) -> np.int64:
    x = np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return np.int64(x & gmask)


@numba.njit(cache=True, nogil=True)
def find(
    slot_keys: np.ndarray, slot_rows: np.ndarray, gmask: np.uint64, keys: np.ndarray, rows: bool
) -> np.ndarray:
    """Row (``rows``) or slot position of each key, -1 where absent (reserved keys too)."""
    out = np.full(keys.size, -1, dtype=np.int64)
    groups = np.int64(gmask) + 1
    for i in range(keys.size):
        key = keys[i]
        if key <= _TOMB:
            continue
        g = _home(key, gmask)
        for r in range(1, groups + 1):
            base = g * _GROUP
            empty = False
            for j in range(_GROUP):
                s = slot_keys[base + j]
                if s == key:
                    out[i] = slot_rows[base + j] if rows else base + j
                    break
                empty |= s == _EMPTY
            if out[i] >= 0 or empty:
                break
            g = (g + r) & np.int64(gmask)
    return out


@numba.njit(cache=True, nogil=True)
def insert(
    slot_keys: np.ndarray, slot_rows: np.ndarray, gmask: np.uint64, keys: np.ndarray,
    rows: np.ndarray,
) -> int:  # fmt: skip
    """Put unique absent keys into the first free slot (EMPTY or TOMBSTONE) of their probe
    sequence; returns how many took a tombstone's place. The caller has made room."""
    reused = 0
    for i in range(keys.size):
        key = keys[i]
        g = _home(key, gmask)
        step = 0
        while True:
            base = g * _GROUP
            j = 0
            while j < _GROUP and slot_keys[base + j] > _TOMB:
                j += 1
            if j < _GROUP:
                reused += slot_keys[base + j] == _TOMB
                slot_keys[base + j] = key
                slot_rows[base + j] = rows[i]
                break
            step += 1
            g = (g + step) & np.int64(gmask)
    return reused
