"""A table's key index in the shared segment: extendible hashing over fixed-size buckets.

The in-process :class:`hps.index.KeyIndex` grows by rehashing into a bigger array; a segment
of fixed extents cannot do that without fragmenting. So each table keeps a fixed directory
of ``DIR_LEN`` bucket ids (in its table entry), indexed by the low bits of the key's hash,
and each bucket is one extent holding a fixed-size open-addressing table (the probing of
KeyIndex: triangular steps over a power-of-two slot array, the high hash bits choosing the
start). A bucket of local depth ``ld`` owns every directory entry whose low ``ld`` bits equal
its ``pattern``; when it fills up it splits in two (``ld + 1``), which rehashes one bucket,
never the whole table. Every operation works on whole batches across all buckets at once:
slot addresses are global indices into the segment's int64 / int32 views.

Bucket extent layout: ``[used, tombs, ld, pattern, 0, 0, 0, 0]`` (int64) · ``slot_keys``
int64[S] · ``slot_rows`` int32[S] (the table's global row of each key).
"""

from __future__ import annotations

import numpy as np

from hps.errors import BackendError
from hps.index import EMPTY, TOMBSTONE, TOMBSTONE_ROOM, mix
from hps.storage._shm_layout import EntryView, EntryWord
from hps.storage._shm_segment import Segment

BUCKET_HEADER = 64
GROUP = 8  # slots per probe group: one 64-byte cache line of keys
MAX_LOAD = 0.8
_USED, _TOMBS, _LD, _PATTERN = 0, 1, 2, 3


_BYTE_INDEX = np.uint64(0x0706050403020100)


def _words(mask: np.ndarray) -> np.ndarray:
    """A contiguous ``(n, GROUP)`` bool mask as n uint64 words, one byte per slot."""
    return np.ascontiguousarray(mask).view(np.uint64).reshape(-1)


def _first_byte(words: np.ndarray) -> np.ndarray:
    """Index (0-7) of the lowest non-zero byte of each non-zero little-endian word."""
    low = words & (~words + np.uint64(1))
    return 7 - ((low * _BYTE_INDEX) >> np.uint64(56)).astype(np.int64)


def bucket_slots(extent: int) -> int:
    return 1 << (((extent - BUCKET_HEADER) // 12).bit_length() - 1)


class BucketIndex:
    """int64 key → int32 row of one table, in buckets of the shared segment."""

    def __init__(self, seg: Segment, entry: EntryView) -> None:
        self.seg = seg
        self.entry = entry
        self.slots = bucket_slots(seg.extent)
        self.capacity = int(self.slots * MAX_LOAD)
        # live keys and tombstones past this: the bucket is rebuilt without its tombstones
        # (as KeyIndex: a fixed share of room, not a rebuild per insert of a near-full one)
        self.fill_limit = self.capacity + int(TOMBSTONE_ROOM * (self.slots - self.capacity))
        self.depth = seg.dir_len.bit_length() - 1
        self._gmask = np.uint64(self.slots // GROUP - 1)
        self._dmask = np.uint64(seg.dir_len - 1)

    # -- addressing (vectorised over bucket ids) -----------------------------------------

    def _meta(self, ext: np.ndarray | np.integer) -> np.ndarray:
        """Word index of each bucket's header in the segment's int64 view."""
        return self.seg.extents.offset(ext) // 8

    def _kbase(self, ext: np.ndarray | np.integer) -> np.ndarray:
        return (self.seg.extents.offset(ext) + BUCKET_HEADER) // 8

    def _rbase(self, ext: np.ndarray | np.integer) -> np.ndarray:
        off = self.seg.extents.offset(ext) + BUCKET_HEADER + 8 * self.slots
        return off // 4

    def _home(self, h: np.ndarray, ext: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First group of each key (global group index) and its bucket's first group."""
        gbase = self._kbase(ext) // GROUP
        return gbase + ((h >> np.uint64(32)) & self._gmask).astype(np.int64), gbase

    def _route(self, h: np.ndarray) -> np.ndarray:
        return self.entry.dir[(h & self._dmask).astype(np.int64)].astype(np.int64)

    # -- probing -------------------------------------------------------------------------

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(bucket, global slot word)`` of each key; slot word -1 where absent."""
        n = keys.size
        slot = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.entry.meta[EntryWord.N_BUCKETS] == 0:
            return np.zeros(n, dtype=np.int64), slot
        h = mix(keys)
        ext = self._route(h)
        pending = np.flatnonzero(keys > TOMBSTONE)  # reserved keys would match free slots
        if pending.size == n:
            g, gbase = self._home(h, ext)
            k = keys
        else:
            g, gbase = self._home(h[pending], ext[pending])
            k = keys[pending]
        groups, gmask = self.seg.groups, int(self._gmask)
        for r in range(1, gmask + 2):
            block = groups.take(g, axis=0)
            match = _words(block == k[:, None])
            fi = np.flatnonzero(match)
            slot[pending[fi]] = g[fi] * GROUP + _first_byte(match[fi])
            if fi.size == k.size:
                break
            # A group with an EMPTY slot ends the probe: the key would have gone there.
            rest = np.flatnonzero((match == 0) & (_words(block == EMPTY) == 0))
            if rest.size == 0:
                break
            pending, k, gbase = pending[rest], k[rest], gbase[rest]
            g = gbase + ((g[rest] - gbase + r) & gmask)
        return ext, slot

    def _row_index(self, ext: np.ndarray, word: np.ndarray) -> np.ndarray:
        """Index in the int32 view of the row stored next to slot ``word`` of ``ext``."""
        # rows start 8 * slots bytes after the keys: int32 index = 2 * key base + 2S + local
        return word + self._kbase(ext) + 2 * self.slots

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key (int64), -1 where absent."""
        ext, word = self.locate(keys)
        f = word >= 0
        if f.all():
            return self.seg.i32[self._row_index(ext, word)].astype(np.int64)
        rows = np.full(keys.size, -1, dtype=np.int64)
        rows[f] = self.seg.i32[self._row_index(ext[f], word[f])]
        return rows

    def set_rows(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Point present ``keys`` at new ``rows`` (after the arena moved them)."""
        ext, word = self.locate(keys)
        self.seg.i32[self._row_index(ext, word)] = rows

    def remove(self, keys: np.ndarray) -> np.ndarray:
        """Remove unique keys; returns the row each pointed at (-1 where absent)."""
        ext, word = self.locate(keys)
        f = word >= 0
        rows = np.full(keys.size, -1, dtype=np.int64)
        e, w = ext[f], word[f]
        rows[f] = self.seg.i32[self._row_index(e, w)]
        self.seg.i64[w] = TOMBSTONE
        b, count = np.unique(e, return_counts=True)
        meta = self._meta(b)
        self.seg.i64[meta + _USED] -= count
        self.seg.i64[meta + _TOMBS] += count
        return rows

    # -- inserting -----------------------------------------------------------------------

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add unique keys not yet present. Splits full buckets first; raises NoSpace."""
        if keys.size == 0:
            return
        h = mix(keys)
        if self.entry.meta[EntryWord.N_BUCKETS] == 0:
            first = int(self.seg.extents.alloc(1)[0])
            self._init_bucket(first, 0, 0)
            self.entry.dir[:] = first
            self.entry.meta[EntryWord.N_BUCKETS] = 1
        while True:
            ext = self._route(h)
            b, count = np.unique(ext, return_counts=True)
            meta = self._meta(b)
            used, tombs = self.seg.i64[meta + _USED], self.seg.i64[meta + _TOMBS]
            over = used + count > self.capacity
            if not over.any():
                break
            for bucket in b[over].tolist():  # one split per full bucket, not per key
                self._split(bucket)
        for bucket in b[used + tombs + count > self.fill_limit].tolist():
            self._rebuild(bucket)
        self._place(ext, h, keys, rows)

    def _place(self, ext: np.ndarray, h: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
        """Write keys into the first free slot along their probe sequence.

        The bucket capacity is checked beforehand, so every key finds one. A key lands in
        the first group of its sequence that has a free (EMPTY or TOMBSTONE) slot; slots
        only turn EMPTY again when the whole bucket is rewritten, so lookups may stop at the
        first group holding an EMPTY slot.
        """
        sk, sr, groups = self.seg.i64, self.seg.i32, self.seg.groups
        gmask = int(self._gmask)
        rbase = self._rbase(ext) - self._kbase(ext)  # int32 index = slot word + rbase
        pending = np.arange(keys.size)
        g, gbase = self._home(h, ext)
        step = np.zeros(keys.size, dtype=np.int64)
        reused = np.zeros(keys.size, dtype=bool)
        for _ in range(keys.size + gmask + 2):
            free = _words(groups.take(g, axis=0) <= TOMBSTONE)
            claim = np.flatnonzero(free)
            word = g[claim] * GROUP + _first_byte(free[claim])
            # Keys sharing a group claim the same first free slot: one write lands, the
            # others try the same group again; keys whose group is full move on.
            who = pending[claim]
            was_tomb = sk[word] == TOMBSTONE
            sk[word] = keys[who]
            won = sk[word] == keys[who]
            winners = who[won]
            sr[word[won] + rbase[winners]] = rows[winners]
            reused[winners] = was_tomb[won]
            keep = np.ones(pending.size, dtype=bool)
            keep[claim[won]] = False
            full = np.flatnonzero(free == 0)
            step[full] += 1
            g[full] = gbase[full] + ((g[full] - gbase[full] + step[full]) & gmask)
            pending, g, gbase, step = pending[keep], g[keep], gbase[keep], step[keep]
            if pending.size == 0:
                break
        b, inverse = np.unique(ext, return_inverse=True)
        meta = self._meta(b)
        self.seg.i64[meta + _USED] += np.bincount(inverse, minlength=b.size)
        self.seg.i64[meta + _TOMBS] -= np.bincount(inverse[reused], minlength=b.size)

    def _init_bucket(self, bucket: int, ld: int, pattern: int) -> None:
        m = int(self._meta(np.int64(bucket)))
        self.seg.i64[m : m + 8] = (0, 0, ld, pattern, 0, 0, 0, 0)
        k0 = m + BUCKET_HEADER // 8
        self.seg.i64[k0 : k0 + self.slots] = EMPTY

    def _items(self, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        k0 = int(self._kbase(np.int64(bucket)))
        r0 = int(self._rbase(np.int64(bucket)))
        keys = self.seg.i64[k0 : k0 + self.slots]
        live = np.flatnonzero(keys > TOMBSTONE)
        return keys[live], self.seg.i32[r0 + live].astype(np.int64)

    def _rebuild(self, bucket: int) -> None:
        """Rehash a bucket in place to clear its tombstones."""
        m = int(self._meta(np.int64(bucket)))
        ld, pattern = int(self.seg.i64[m + _LD]), int(self.seg.i64[m + _PATTERN])
        keys, rows = self._items(bucket)
        self._init_bucket(bucket, ld, pattern)
        self._place(np.full(keys.size, bucket, dtype=np.int64), mix(keys), keys, rows)

    def _split(self, bucket: int) -> None:
        m = int(self._meta(np.int64(bucket)))
        ld, pattern = int(self.seg.i64[m + _LD]), int(self.seg.i64[m + _PATTERN])
        if ld >= self.depth:
            raise BackendError(
                f"multi_process_hash_map: table {self.entry.name}: a bucket of "
                f"{self.capacity} keys is full at the deepest directory level"
            )
        new = int(self.seg.extents.alloc(1)[0])
        keys, rows = self._items(bucket)
        self._init_bucket(bucket, ld + 1, pattern)
        self._init_bucket(new, ld + 1, pattern | (1 << ld))
        self.entry.dir[pattern | (1 << ld) :: 1 << (ld + 1)] = new
        h = mix(keys)
        upper = ((h >> np.uint64(ld)) & np.uint64(1)).astype(bool)
        self._place(np.where(upper, new, bucket), h, keys, rows)
        self.entry.meta[EntryWord.N_BUCKETS] += 1

    def release(self) -> None:
        """Free every bucket (the table is empty)."""
        d = self.entry.dir
        buckets = np.unique(d[d >= 0]).astype(np.int64)
        self.seg.extents.free(buckets)
        d[:] = -1
        self.entry.meta[EntryWord.N_BUCKETS] = 0
