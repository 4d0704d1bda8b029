"""A vectorised open-addressing index: int64 key → int32 row, in NumPy or CuPy arrays.

The L2 hash map and the L1 cache store their rows in dense arenas and use this index to
find a key's row. Every operation takes a whole batch and runs a handful of array
operations per probe round (triangular probing over a power-of-two table), never a Python
loop over keys.

Two key values are reserved as slot markers (``EMPTY`` and ``TOMBSTONE``, the two smallest
int64 values); ``check_keys`` rejects them with a clear error.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from hps.errors import InvalidValueError

EMPTY = np.int64(np.iinfo(np.int64).min)
TOMBSTONE = np.int64(np.iinfo(np.int64).min + 1)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def check_keys(keys: Any, xp: ModuleType = np) -> None:
    """Reject the two reserved key values."""
    if keys.size and bool((keys <= TOMBSTONE).any()):
        raise InvalidValueError(f"keys {int(EMPTY)} and {int(TOMBSTONE)} are reserved")


def mix(keys: Any, xp: ModuleType = np) -> Any:
    """splitmix64's finaliser: a well-spread uint64 hash of int64 keys."""
    x = keys.astype(xp.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


class KeyIndex:
    """Map unique int64 keys to int32 rows; grows by doubling past ``max_load``."""

    def __init__(self, capacity: int = 1024, *, xp: ModuleType = np, max_load: float = 0.7):
        self.xp = xp
        self.max_load = max_load
        self._used = 0
        self._tombs = 0
        self._alloc(max(16, int(capacity / max_load) + 1))

    def _alloc(self, slots: int) -> None:
        size = 1 << (slots - 1).bit_length()
        self._mask = np.uint64(size - 1)
        self.slot_keys = self.xp.full(size, EMPTY, dtype=self.xp.int64)
        self.slot_rows = self.xp.full(size, -1, dtype=self.xp.int32)

    def __len__(self) -> int:
        return self._used

    @property
    def slots(self) -> int:
        return int(self.slot_keys.size)

    @property
    def nbytes(self) -> int:
        return int(self.slot_keys.nbytes + self.slot_rows.nbytes)

    def _positions(self, keys: Any) -> Any:
        """Slot position of each key, -1 where absent."""
        xp = self.xp
        n = keys.size
        out = xp.full(n, -1, dtype=xp.int64)
        if n == 0:
            return out
        pending = xp.arange(n)
        pos = mix(keys, xp) & self._mask
        k = keys
        for r in range(1, self.slots + 1):
            tk = self.slot_keys[pos]
            hit = tk == k
            out[pending[hit]] = pos[hit].astype(xp.int64)
            go_on = ~hit & (tk != EMPTY)
            pending, pos, k = pending[go_on], pos[go_on], k[go_on]
            if pending.size == 0:
                break
            pos = (pos + np.uint64(r)) & self._mask
        return out

    def lookup(self, keys: Any) -> Any:
        """Row of each key (int64), -1 where absent."""
        pos = self._positions(keys)
        rows = self.xp.full(keys.size, -1, dtype=self.xp.int64)
        found = pos >= 0
        rows[found] = self.slot_rows[pos[found]]
        return rows

    def insert(self, keys: Any, rows: Any) -> None:
        """Add keys that are unique and not yet present, pointing at ``rows``."""
        xp = self.xp
        n = int(keys.size)
        if n == 0:
            return
        if (self._used + self._tombs + n) > self.max_load * self.slots:
            self._rehash(self._used + n)
        pending = xp.arange(n)
        pos = mix(keys, xp) & self._mask
        for r in range(1, self.slots + 1):
            tk = self.slot_keys[pos]
            free = (tk == EMPTY) | (tk == TOMBSTONE)
            cand, cpos = pending[free], pos[free]
            # Several keys may claim one slot: whichever write lands wins, the rest probe on.
            self.slot_keys[cpos] = keys[cand]
            won = self.slot_keys[cpos] == keys[cand]
            self.slot_rows[cpos[won]] = rows[cand[won]].astype(xp.int32)
            self._tombs -= int((tk[free][won] == TOMBSTONE).sum())
            placed = xp.zeros(n, dtype=bool)
            placed[cand[won]] = True
            keep = ~placed[pending]
            pending, pos = pending[keep], pos[keep]
            if pending.size == 0:
                break
            pos = (pos + np.uint64(r)) & self._mask
        self._used += n

    def remove(self, keys: Any) -> Any:
        """Remove keys; returns the row each pointed at (-1 where absent)."""
        pos = self._positions(keys)
        found = pos >= 0
        fpos = pos[found]
        rows = self.xp.full(keys.size, -1, dtype=self.xp.int64)
        rows[found] = self.slot_rows[fpos]
        self.slot_keys[fpos] = TOMBSTONE
        self.slot_rows[fpos] = -1
        removed = int(found.sum())
        self._used -= removed
        self._tombs += removed
        return rows

    def items(self) -> tuple[Any, Any]:
        """All live (keys, rows)."""
        live = self.slot_keys > TOMBSTONE
        return self.slot_keys[live], self.slot_rows[live].astype(self.xp.int64)

    def _rehash(self, need: int) -> None:
        keys, rows = self.items()
        self._alloc(max(int(need / self.max_load) + 1, 16))
        self._used = 0
        self._tombs = 0
        self.insert(keys, rows)

    def clear(self) -> None:
        self.slot_keys.fill(EMPTY)
        self.slot_rows.fill(-1)
        self._used = 0
        self._tombs = 0
