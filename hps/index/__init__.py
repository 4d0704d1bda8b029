"""A vectorised open-addressing index: int64 key → int32 row, in NumPy or CuPy arrays.

The L2 hash map and the L1 cache store their rows in dense arenas and use this index to
find a key's row. Slots come in groups of ``GROUP`` (8 keys: one 64-byte cache line); a key
hashes to a group and the probe sequence visits whole groups (triangular steps over a
power-of-two number of groups). One probe round reads one group per pending key as a
``(n, GROUP)`` block, so most keys resolve in the first round and every operation is a
handful of array operations per round, never a Python loop over keys.

Invariant: a key sits in the first group of its probe sequence that had a free slot when it
was inserted, and slots never turn back to ``EMPTY`` (removal leaves a ``TOMBSTONE``), so a
lookup stops at the first group that still has an ``EMPTY`` slot.

Growth and clean-up: the index doubles when its live keys would pass ``max_load``, and it is
rebuilt at the same size, without its tombstones, when live keys and tombstones would pass
``max_load`` plus ``TOMBSTONE_ROOM`` of the slots above it. That room is a fixed share of the
slots, so a full cache that evicts on every insert rebuilds once per that many removals (a
rebuild is O(slots)); rebuilding as soon as ``max_load`` was reached left a cache of 65,535
rows one slot of room, and a rebuild on every insert.

Where numba is installed (and :mod:`hps.jit` allows it), a host index runs
:meth:`KeyIndex.lookup` and :meth:`KeyIndex.insert` as compiled loops
(:mod:`hps.index._numba`): the same probe sequence and layout, several times faster on the
L2 hash map's update and read paths.

Two key values are reserved as slot markers (``EMPTY`` and ``TOMBSTONE``, the two smallest
int64 values); writes of them are refused (:func:`hps.validate.as_rows`) and lookups never
find them.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np
import numpy.typing as npt

from hps.jit import compiled_allowed, not_compiled
from hps.types import RESERVED_KEYS, Array, ArrayModule

EMPTY = np.int64(RESERVED_KEYS[0])
TOMBSTONE = np.int64(RESERVED_KEYS[1])
GROUP = 8
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing's multiplier
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

CACHE_LINE = 64
TOMBSTONE_ROOM = 0.25  # share of the slots above max_load that tombstones may take


def aligned_full(
    xp: ArrayModule, shape: int | tuple[int, ...], fill: float | np.generic, dtype: npt.DTypeLike
) -> Array:
    """``xp.full`` whose data starts on a cache line (NumPy's large arrays start 16 bytes
    into a page, so a 64-byte row or slot group straddled two lines: twice the memory
    traffic of a random probe or gather). Device arrays are aligned already."""
    if xp is not np:
        return xp.full(shape, fill, dtype=dtype)
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    out = raw[start : start + count * dtype.itemsize].view(dtype).reshape(shape)
    out.fill(fill)
    return out


def mix(keys: Array, xp: ArrayModule = np) -> Array:
    """splitmix64's finaliser: a well-spread uint64 hash of int64 keys."""
    x = keys.astype(xp.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def _bytes(mask: Array) -> Array:
    """A ``(n, GROUP)`` bool mask as n uint64 words, one byte (0 or 1) per slot."""
    return mask.view(np.uint64).reshape(-1)


_BYTE_INDEX = np.uint64(0x0706050403020100)


def _only_byte(words: Array, xp: ArrayModule) -> Array:
    """Index (0-7) of the one byte set to 1 in each word (garbage where none or several)."""
    return 7 - ((words * _BYTE_INDEX) >> np.uint64(56)).astype(xp.int64)


def _first_byte(words: Array, xp: ArrayModule) -> Array:
    """Index (0-7) of the lowest non-zero byte of each non-zero little-endian word."""
    return _only_byte(words & (~words + np.uint64(1)), xp)  # lowest set bit: 1 << (8 * i)


@functools.lru_cache(maxsize=1)
def compiled() -> ModuleType | None:
    """The compiled loops for host indexes, or ``None`` (no numba, or ``HPS_KERNELS=numpy``)."""
    if not compiled_allowed():
        return None
    try:  # any failure (no numba; no folder to cache the loops in): the NumPy loops
        from hps.index import _numba as _index_numba

        # Load (or compile) both loops now, not inside the first write (about 0.2 s).
        slot_keys = np.full(16, EMPTY, dtype=np.int64)
        slot_rows = np.full(16, -1, dtype=np.int32)
        one = np.ones(1, dtype=np.int64)
        _index_numba.insert(slot_keys, slot_rows, np.uint64(1), one, np.zeros(1, np.int32))
        _index_numba.find(slot_keys, slot_rows, np.uint64(1), one, True)
    except Exception as exc:
        not_compiled("the key index", exc)
        return None
    return _index_numba


def slots_for(capacity: int, max_load: float = 0.7) -> int:
    """Slots a KeyIndex allocates for ``capacity`` keys: a power of two, at least 16."""
    slots = max(16, int(capacity / max_load) + 1)
    return 1 << (slots - 1).bit_length()


class KeyIndex:
    """Map unique int64 keys to int32 rows; grows by doubling past ``max_load``."""

    def __init__(
        self,
        capacity: int = 1024,
        *,
        xp: ArrayModule = np,
        max_load: float = 0.7,
        compiled_loops: bool = True,
    ):
        """``compiled_loops=False`` keeps a host index on the NumPy rounds (the tests compare
        both)."""
        self.xp = xp
        self.max_load = max_load
        self._jit = compiled() if xp is np and compiled_loops else None
        self._used = 0
        self._tombs = 0
        self._min_slots = slots_for(capacity, max_load)
        self._alloc(self._min_slots)

    def _alloc(self, slots: int) -> None:
        size = max(16, 1 << (slots - 1).bit_length())
        self._gmask = np.uint64(size // GROUP - 1)
        self.slot_keys = aligned_full(self.xp, size, EMPTY, np.int64)  # a group: one line
        self.slot_rows = self.xp.full(size, -1, dtype=self.xp.int32)
        self._groups = self.slot_keys.reshape(-1, GROUP)

    def __len__(self) -> int:
        return self._used

    @property
    def slots(self) -> int:
        return int(self.slot_keys.size)

    @property
    def nbytes(self) -> int:
        return int(self.slot_keys.nbytes + self.slot_rows.nbytes)

    @property
    def gmask(self) -> int:
        """Groups - 1: a key's home group is ``mix(key) & gmask`` (compiled probes use it)."""
        return int(self._gmask)

    def _home(self, keys: Array) -> Array:
        return (mix(keys, self.xp) & self._gmask).astype(self.xp.int64)

    def _find(self, keys: Array, *, rows: bool) -> Array:
        """Row (``rows``) or slot position of each key, -1 where absent (reserved keys too)."""
        xp = self.xp
        if keys.size == 0:
            return xp.full(0, -1, dtype=xp.int64)
        if self._jit is not None:
            keys = np.ascontiguousarray(keys, dtype=np.int64)
            found: Array = self._jit.find(self.slot_keys, self.slot_rows, self._gmask, keys, rows)
            return found
        gmask = int(self._gmask)
        g, k, pending = self._home(keys), keys, None
        for r in range(1, gmask + 2):
            block = self._groups.take(g, axis=0)
            match = _bytes(block == k[:, None])
            # A key sits in at most one slot; a reserved key may match several marker slots,
            # so its byte index is clipped into the group and it is never "found".
            pos = g * GROUP + (_only_byte(match, xp) & 7)
            found = match != 0
            if pending is None:
                valid = keys > TOMBSTONE
                found &= valid
                out = xp.where(found, self.slot_rows.take(pos) if rows else pos, np.int64(-1))
                rest = xp.flatnonzero(~found & valid)
            else:
                out[pending[found]] = (self.slot_rows.take(pos) if rows else pos)[found]
                rest = xp.flatnonzero(~found)
            if rest.size == 0:
                break
            # A group with an EMPTY slot ends the probe: the key would have gone there.
            rest = rest[_bytes(block.take(rest, axis=0) == EMPTY) == 0]
            if rest.size == 0:
                break
            pending = rest if pending is None else pending[rest]
            g, k = (g[rest] + r) & gmask, k[rest]
        return out

    def _positions(self, keys: Array) -> Array:
        """Slot position of each key, -1 where absent (reserved keys are always absent)."""
        return self._find(keys, rows=False)

    def lookup(self, keys: Array) -> Array:
        """Row of each key (int64), -1 where absent."""
        return self._find(keys, rows=True)

    def insert(self, keys: Array, rows: Array) -> None:
        """Add keys that are unique and not yet present, pointing at ``rows``."""
        xp = self.xp
        n = int(keys.size)
        if n == 0:
            return
        self.reserve(n)
        if self._jit is not None:
            keys = np.ascontiguousarray(keys, dtype=np.int64)
            rows = np.ascontiguousarray(rows, dtype=np.int32)
            self._tombs -= int(
                self._jit.insert(self.slot_keys, self.slot_rows, self._gmask, keys, rows)
            )
            self._used += n
            return
        gmask = int(self._gmask)
        pending = xp.arange(n)
        g = self._home(keys)
        step = xp.zeros(n, dtype=xp.int64)
        for _ in range(n + gmask + 2):
            free = _bytes(self._groups.take(g, axis=0) <= TOMBSTONE)  # EMPTY or TOMBSTONE
            claim = xp.flatnonzero(free != 0)
            slot = g[claim] * GROUP + _first_byte(free[claim], xp)
            # Keys sharing a group claim the same first free slot: one write lands, the
            # others try the same group again; keys whose group is full move on.
            want = keys[pending[claim]]
            was_tomb = self.slot_keys[slot] == TOMBSTONE
            self.slot_keys[slot] = want
            won = self.slot_keys[slot] == want
            self.slot_rows[slot[won]] = rows[pending[claim[won]]].astype(xp.int32)
            self._tombs -= int(was_tomb[won].sum())
            keep = xp.ones(pending.size, dtype=bool)
            keep[claim[won]] = False
            full = xp.flatnonzero(free == 0)
            step[full] += 1
            g[full] = (g[full] + step[full]) & gmask
            pending, g, step = pending[keep], g[keep], step[keep]
            if pending.size == 0:
                break
        self._used += n

    def reserve(self, n: int) -> None:
        """Grow first if ``n`` new keys would take the live keys past the load; rebuild
        without tombstones if live keys and tombstones would fill more than the fill limit."""
        slots = self.slots
        fill_limit = self.max_load + TOMBSTONE_ROOM * (1 - self.max_load)
        if self._used + n > self.max_load * slots or (
            self._used + self._tombs + n > fill_limit * slots
        ):
            self._rehash(self._used + n)

    def inserted_elsewhere(self, n: int, reused: int) -> None:
        """Count ``n`` keys that a device kernel put into the slot arrays after
        :meth:`reserve` (``reused`` of them into tombstones), as :meth:`insert` counts its own."""
        self._used += n
        self._tombs -= reused

    def remove(self, keys: Array) -> Array:
        """Remove keys; returns the row each pointed at (-1 where absent)."""
        pos = self._positions(keys)
        found = pos >= 0
        rows = self.xp.full(keys.size, -1, dtype=self.xp.int64)
        fpos = pos[found]
        rows[found] = self.slot_rows[fpos]
        # A key listed twice is removed once, counted without a sort: of the writes to one
        # slot one lands, so exactly one position per distinct slot reads back its own mark.
        mark = self.xp.arange(fpos.size, dtype=self.xp.int32)
        self.slot_rows[fpos] = mark
        removed = int((self.slot_rows[fpos] == mark).sum())
        self.slot_keys[fpos] = TOMBSTONE
        self.slot_rows[fpos] = -1
        self._used -= removed
        self._tombs += removed
        return rows

    def items(self) -> tuple[Array, Array]:
        """All live (keys, rows)."""
        live = self.slot_keys > TOMBSTONE
        return self.slot_keys[live], self.slot_rows[live].astype(self.xp.int64)

    def _rehash(self, need: int) -> None:
        keys, rows = self.items()
        self._alloc(max(self._min_slots, slots_for(need, self.max_load)))
        self._used = 0
        self._tombs = 0
        self.insert(keys, rows)

    def clear(self) -> None:
        self.slot_keys.fill(EMPTY)
        self.slot_rows.fill(-1)
        self._used = 0
        self._tombs = 0
