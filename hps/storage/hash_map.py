"""``hash_map``: the in-process L2, the embedded default (HugeCTR's ``parallel_hash_map`` too).

Each table is a :class:`hps.index.KeyIndex` over a dense arena of stored rows (the table's
row format: ``spec.width`` elements of ``spec.fmt.dtype``); per row it costs the key
(8 bytes), the stored row, about 17–34 bytes of index and, only when a finite
``overflow_margin`` is set, a 4-byte tick for the overflow policy. HugeCTR's paid ~10x the
raw bytes (its issue 412); this stays under 1.5x for float32 rows of dim >= 16.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from hps.config import NO_LIMIT, PersistentDBConfig, VolatileDBConfig
from hps.dedup import greater_rows, greatest_occurrence, last_occurrence
from hps.index import EMPTY, KeyIndex
from hps.io.chunks import rows_per_chunk
from hps.rowformat import Stored
from hps.storage.base import (
    AccessMode,
    EmbeddingStore,
    WriteMode,
    check_max_rows,
    check_rows,
    refused,
)
from hps.storage.overflow import TICK_MASK, choose_victims, rows_to_keep
from hps.types import Keys, Mask, TableSpec
from hps.validate import table_or_raise

GROWTH = 1.25


@dataclass
class _Table:
    spec: TableSpec
    index: KeyIndex
    values: np.ndarray
    row_keys: np.ndarray
    ticks: np.ndarray | None
    free: list[np.ndarray] = field(default_factory=list)
    top: int = 0  # rows [0, top) have been handed out at least once
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def capacity(self) -> int:
        return int(self.row_keys.size)

    def nbytes(self) -> int:
        ticks = self.ticks.nbytes if self.ticks is not None else 0
        free = sum(f.nbytes for f in self.free)
        return self.index.nbytes + self.values.nbytes + self.row_keys.nbytes + ticks + free


MIN_INSERT_SLICE = 1024


class HashMapStore(EmbeddingStore):
    """In-process L2: int64 keys → stored rows per table, vectorised over batches."""

    name = "hash_map"
    placement = "process"

    def __init__(
        self,
        *,
        overflow_margin: int = NO_LIMIT,
        overflow_policy: str = "evict_random",
        overflow_resolution_target: float = 0.8,
        seed: int | None = None,
    ) -> None:
        self.overflow_margin = overflow_margin
        self.overflow_policy = overflow_policy
        self.target = overflow_resolution_target
        self._tables: dict[str, _Table] = {}
        self._rng = np.random.default_rng(seed)
        self._tick = 0

    @classmethod
    def from_config(
        cls, cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
    ) -> HashMapStore:
        assert isinstance(cfg, VolatileDBConfig)
        return cls(
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )

    @classmethod
    def bytes_per_row(cls, row_bytes: int, *, bounded: bool = False) -> float:
        """Expected bytes per stored row (index at mid load, arena at mid growth)."""
        index = 12 / 0.525
        arena = (8 + row_bytes + (4 if bounded else 0)) * (1 + GROWTH) / 2
        return index + arena

    @property
    def _bounded(self) -> bool:
        return self.overflow_margin < NO_LIMIT

    def open_table(self, spec: TableSpec) -> None:
        held = self._tables.get(spec.name)
        if held is not None:
            if held.spec.row_dtype != spec.row_dtype or held.spec.dim != spec.dim:
                raise refused(spec, "hash_map", held.spec.fmt, held.spec.dim)
            return
        cap = 1024
        self._tables[spec.name] = _Table(
            spec=spec,
            index=KeyIndex(cap),
            values=spec.fmt.empty(cap, spec.dim),
            row_keys=np.full(cap, EMPTY, dtype=np.int64),
            ticks=np.zeros(cap, dtype=np.uint32) if self._bounded else None,
        )

    def _table(self, name: str) -> _Table:
        return table_or_raise(self._tables, name)

    def drop_table(self, table: str) -> None:
        self._tables.pop(table, None)

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        t = self._table(table)
        with t.lock:
            rows = t.index.lookup(keys)
            found = rows >= 0
            values = t.values.take(np.where(found, rows, 0), axis=0)
            if t.ticks is not None and self.overflow_policy == "evict_least_used":
                self._tick = (self._tick + 1) & TICK_MASK
                t.ticks[rows[found]] = self._tick
        return values, found

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        self._write(table, keys, values, how="upsert")

    def insert_absent(self, table: str, keys: Keys, values: Stored) -> None:
        self._write(table, keys, values, how="absent")

    def insert_max(self, table: str, keys: Keys, values: Stored) -> None:
        check_max_rows(table, keys, values)
        self._write(table, keys, values, how="max")

    def _write(self, table: str, keys: Keys, values: Stored, *, how: WriteMode) -> None:
        t = self._table(table)
        check_rows(t.spec, keys, values)
        keys, values = (greatest_occurrence if how == "max" else last_occurrence)(keys, values)
        step = self._insert_slice()
        for lo in range(0, keys.size, step):  # bounded: the overflow resolved per slice
            self._insert(t, keys[lo : lo + step], values[lo : lo + step], how)

    def _insert_slice(self) -> int:
        """Keys placed before an overflow resolution: with an ``overflow_margin``, a
        sixteenth of it (at least MIN_INSERT_SLICE), so that a large batch (a fill from L3)
        grows the table to about the margin, not the margin plus the batch (its arena
        never shrinks); unbounded, the whole batch."""
        if not self._bounded:
            return 1 << 62
        return max(MIN_INSERT_SLICE, self.overflow_margin // 16)

    def _insert(self, t: _Table, keys: Keys, values: Stored, how: WriteMode) -> None:
        with t.lock:
            rows = t.index.lookup(keys)
            new = rows < 0
            if how != "upsert":
                take = new.copy()
                if how == "max":
                    old = ~new
                    take[old] = greater_rows(values[old], t.values[rows[old]])
                keys, values, rows, new = keys[take], values[take], rows[take], new[take]
            n_new = int(new.sum())
            if n_new:
                new_rows = self._allocate(t, n_new)
                t.index.insert(keys[new], new_rows)
                t.row_keys[new_rows] = keys[new]
                rows[new] = new_rows
            t.values[rows] = values
            if t.ticks is not None:
                self._tick = (self._tick + 1) & TICK_MASK
                t.ticks[rows] = self._tick
            self._resolve_overflow(t)

    def _allocate(self, t: _Table, n: int) -> np.ndarray:
        # Freed rows first, from the end of the newest chunk: a view, never a copy of the
        # whole free list (which an overflow resolution makes a fifth of the margin long).
        taken: list[np.ndarray] = []
        want = n
        while want and t.free:
            last = t.free[-1]
            k = min(want, last.size)
            taken.append(last[last.size - k :])
            if k == last.size:
                t.free.pop()
            else:
                t.free[-1] = last[: last.size - k]
            want -= k
        extra = want
        if t.top + extra > t.capacity:
            self._grow(t, t.top + extra)
        taken.append(np.arange(t.top, t.top + extra, dtype=np.int64))
        t.top += extra
        return np.concatenate(taken)

    @staticmethod
    def _grow(t: _Table, need: int) -> None:
        # In place (realloc: the kernel remaps large blocks instead of copying them, and the
        # old and new arenas never coexist); no view of these arrays outlives a locked call.
        cap = max(need, int(t.capacity * GROWTH))
        t.values.resize((cap, t.values.shape[1]), refcheck=False)  # zero-filled
        old = t.capacity
        t.row_keys.resize(cap, refcheck=False)
        t.row_keys[old:] = EMPTY
        if t.ticks is not None:
            t.ticks.resize(cap, refcheck=False)

    def _resolve_overflow(self, t: _Table) -> None:
        size = len(t.index)
        if size <= self.overflow_margin:
            return
        keep = rows_to_keep(self.overflow_margin, self.target)
        live = np.flatnonzero(t.row_keys[: t.top] != EMPTY)
        ticks = t.ticks[live] if t.ticks is not None else None
        pick = choose_victims(
            self.overflow_policy, size - keep, live.size, ticks, self._rng, self._tick
        )
        victims = live[pick]
        self._drop_rows(t, victims)

    @staticmethod
    def _drop_rows(t: _Table, rows: np.ndarray) -> None:
        t.index.remove(t.row_keys[rows])
        t.row_keys[rows] = EMPTY
        t.free.append(rows.astype(np.int64))

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        t = self._table(table)
        with t.lock:
            rows = t.index.lookup(np.unique(keys))
            self._drop_rows(t, rows[rows >= 0])

    def size(self, table: str) -> int:
        return len(self._table(table).index)

    def nbytes(self, table: str) -> int:
        """Bytes the table's arrays hold (index, arena, bookkeeping)."""
        return self._table(table).nbytes()

    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Yield (keys, stored rows) chunks of the whole table, of at most ``chunk_rows``
        rows (default: sized by bytes, :func:`hps.io.chunks.rows_per_chunk`)."""
        t = self._table(table)
        if chunk_rows is None:
            chunk_rows = rows_per_chunk(t.spec.fmt.row_bytes(t.spec.dim))
        for lo in range(0, t.top, chunk_rows):
            with t.lock:
                rows = lo + np.flatnonzero(t.row_keys[lo : lo + chunk_rows] != EMPTY)
                keys, values = t.row_keys[rows], t.values[rows]
            if keys.size:
                yield keys, values

    def close(self) -> None:
        self._tables.clear()
