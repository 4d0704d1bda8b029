"""One table in the shared segment: a dense row arena in extents, found by a BucketIndex.

Rows ``[0, rows)`` of a table are always dense: removing rows moves the last ones into the
holes (and repoints their keys), so there is no free list to share between processes and
trailing row extents go back to the segment as the table shrinks. Row ``g`` lives in row
extent ``row_ext[g // rows_per_ext]``, laid out as ``row_keys`` int64[R] · ``ticks``
uint32[R] · padding · ``values`` (R stored rows of the table's format: ``width`` elements of
its dtype each, :mod:`hps.rowformat`), the values aligned to the stored row's bytes from the
segment's start so the whole segment can be read as one ``(-1, width)`` array.

Callers hold the segment's lock: shared for :meth:`ShmTable.fetch` and :meth:`dump`,
exclusive for the rest.
"""

from __future__ import annotations

import numpy as np

from hps.storage._shm_index import BucketIndex
from hps.storage._shm_layout import EntryView, EntryWord, NoSpace
from hps.storage._shm_segment import Segment
from hps.storage.overflow import choose_victims

SPARSE_BUCKETS = 4
"""A table whose buckets hold under 1/SPARSE_BUCKETS of the keys they could (rows removed
or evicted) rebuilds its index in fewer: the buckets go back to the segment, and the table
no longer counts as large when a full segment picks the table to evict from."""


def rows_per_extent(extent: int, row_bytes: int) -> int:
    """Stored rows of ``row_bytes`` bytes one row extent holds (worst-case alignment padding)."""
    return (extent - row_bytes) // (12 + row_bytes)


class ShmTable:
    """Rows of one table (views into the segment; cheap to build per call)."""

    def __init__(self, seg: Segment, slot: int) -> None:
        self.seg = seg
        self.entry = EntryView(seg, slot)
        self.meta = self.entry.meta
        self.index = BucketIndex(seg, self.entry)
        self.dim = self.entry.dim
        self.fmt = self.entry.fmt
        self.row_bytes = self.fmt.row_bytes(self.dim)
        self.rpe = int(self.meta[EntryWord.ROWS_PER_EXT])
        self.incarnation = int(self.meta[EntryWord.STATE])

    @property
    def stale(self) -> bool:
        """Whether the entry no longer holds the table this handle opened (dropped, maybe
        claimed again since: by another process's ``import --force``, a retire). Read under
        the segment's lock."""
        return int(self.meta[EntryWord.STATE]) != self.incarnation

    @property
    def rows(self) -> int:
        return int(self.meta[EntryWord.ROWS])

    @property
    def extents(self) -> int:
        return int(self.meta[EntryWord.N_ROW_EXT] + self.meta[EntryWord.N_BUCKETS])

    def _where(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of rows ``g`` in the int64 (key), uint32 (tick) and value views."""
        off, local = self._split(g)
        return off // 8 + local, self._ticks(off, local), self._values(off, local)

    def _split(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte offset of each row's extent, and the row's place in it."""
        j = g // self.rpe
        off = self.seg.extents.offset(self.entry.row_ext[j])
        return off, g - j * self.rpe

    def _ticks(self, off: np.ndarray, local: np.ndarray) -> np.ndarray:
        return (off + 8 * self.rpe) // 4 + local

    def _values(self, off: np.ndarray, local: np.ndarray) -> np.ndarray:
        return -(-(off + 12 * self.rpe) // self.row_bytes) + local

    def _arena(self) -> np.ndarray:
        """The whole segment as this table's stored rows."""
        return self.seg.values(self.fmt, self.dim)

    def fetch(self, keys: np.ndarray, tick: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Stored rows and found mask; ``tick`` (evict_least_used) stamps the rows found."""
        rows = self.index.lookup(keys)
        found = rows >= 0
        every = bool(found.all())
        off, local = self._split(rows if every else rows[found])
        got = self._arena().take(self._values(off, local), axis=0)
        if tick is not None:
            self.seg.u32[self._ticks(off, local)] = tick
        if every:
            return got, found
        values = np.zeros((keys.size, got.shape[1]), dtype=got.dtype)
        values[found] = got
        return values, found

    def upsert(self, keys: np.ndarray, values: np.ndarray, tick: int) -> None:
        """Insert or overwrite unique keys. Raises NoSpace with the table consistent."""
        self.seg.touch(self.entry)
        rows = self.index.lookup(keys)
        new = rows < 0
        n_new = int(new.sum())
        if n_new:
            n = self.rows
            g = np.arange(n, n + n_new, dtype=np.int64)
            try:
                self._reserve(n + n_new)
                self.index.insert(keys[new], g)
            except NoSpace:
                self._trim()
                raise
            self.meta[EntryWord.ROWS] = n + n_new
            rows[new] = g
        k, t, v = self._where(rows)
        self.seg.i64[k] = keys
        self.seg.u32[t] = tick
        self._arena()[v] = values

    def _reserve(self, n_rows: int) -> None:
        have = int(self.meta[EntryWord.N_ROW_EXT])
        need = -(-n_rows // self.rpe)
        if need > have:
            if need > self.seg.row_ext_cap:
                raise NoSpace(f"{n_rows} rows exceed the segment")
            self.entry.row_ext[have:need] = self.seg.extents.alloc(need - have)
            self.meta[EntryWord.N_ROW_EXT] = need

    def _trim(self) -> None:
        """Give back row extents past the last row, and buckets the rows no longer need:
        all of an empty table's; a sparse index (see :data:`SPARSE_BUCKETS`) is rebuilt."""
        keep = -(-self.rows // self.rpe)
        have = int(self.meta[EntryWord.N_ROW_EXT])
        if have > keep:
            self.seg.extents.free(self.entry.row_ext[keep:have].astype(np.int64))
            self.meta[EntryWord.N_ROW_EXT] = keep
        buckets = int(self.meta[EntryWord.N_BUCKETS])
        if self.rows == 0 and buckets:
            self.index.release()
        elif buckets > 1 and self.rows * SPARSE_BUCKETS < buckets * self.index.capacity:
            self._reindex()

    def _reindex(self) -> None:
        """Rebuild the index in as few buckets as the rows need. It needs fewer than it
        frees; should it still run out of extents, the table is emptied rather than left
        with rows its index cannot find (L2 is a cache)."""
        g = np.arange(self.rows, dtype=np.int64)
        keys = self.seg.i64[self._where(g)[0]]
        self.index.release()
        try:
            self.index.insert(keys, g)
        except NoSpace:
            self.index.release()
            self.meta[EntryWord.ROWS] = 0
            self._trim()

    def remove(self, keys: np.ndarray) -> int:
        """Remove unique keys (absent ones are ignored); returns how many were present."""
        self.seg.touch(self.entry)
        g = self.index.remove(keys)
        g = g[g >= 0]
        self._compact(g)
        return int(g.size)

    def evict(self, policy: str, count: int, rng: np.random.Generator) -> int:
        """Evict ``count`` rows chosen by ``policy``; returns how many went."""
        self.seg.touch(self.entry)
        n = self.rows
        ticks = None
        if policy != "evict_random":
            ticks = self.seg.u32[self._where(np.arange(n, dtype=np.int64))[1]]
        victims = choose_victims(policy, count, n, ticks, rng, self.seg.tick()).astype(np.int64)
        self.index.remove(self.seg.i64[self._where(victims)[0]])
        self._compact(victims)
        return int(victims.size)

    def _compact(self, gone: np.ndarray) -> None:
        """Rows ``gone`` (already out of the index): move the last rows into their holes."""
        if gone.size == 0:
            return
        n = self.rows
        m = n - gone.size
        gone = np.sort(gone)
        holes = gone[gone < m]
        stay = np.ones(n - m, dtype=bool)
        stay[gone[gone >= m] - m] = False
        movers = m + np.flatnonzero(stay)
        if holes.size:
            sk, st, sv = self._where(movers)
            dk, dt, dv = self._where(holes)
            i64, u32, vals = self.seg.i64, self.seg.u32, self._arena()
            keys = i64[sk]
            i64[dk] = keys
            u32[dt] = u32[st]
            vals[dv] = vals.take(sv, axis=0)
            self.index.set_rows(keys, holes)
        self.meta[EntryWord.ROWS] = m
        self._trim()

    def dump(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and stored rows of rows ``[lo, hi)``."""
        g = np.arange(lo, min(hi, self.rows), dtype=np.int64)
        k, _, v = self._where(g)
        return self.seg.i64[k], self._arena().take(v, axis=0)
