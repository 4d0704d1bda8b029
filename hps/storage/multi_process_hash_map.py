"""``multi_process_hash_map``: one L2 hash map in shared memory for every process of a node.

Triton runs each model instance in its own process; with ``hash_map`` each would hold its
own copy of L2. This backend keeps a single copy in a POSIX shared-memory segment
(``shared_memory_name`` under ``/dev/shm``, at most ``shared_memory_size`` bytes) that
every process maps: whatever one process inserts, all others fetch. Rows are stored in the
table's row format (:mod:`hps.rowformat`), which the table's entry records: a process that
opens the table with another format or dimension is refused (``ConfigError``).

The segment is carved into fixed-size extents (see ``_shm_segment``); a table is a dense
row arena of extents plus an extendible-hashing key index of bucket extents
(``_shm_table``, ``_shm_index``), both growing one extent at a time. Reads take a shared
``flock``, writes an exclusive one, so no process ever sees a half-written row; the kernel
drops the lock of a process that dies, and a writer that dies mid-update leaves a dirty
mark on the tables it was changing, whose rows the next process clears (L2 is a cache).
When no extent is free,
the table holding the most extents sheds rows by ``overflow_policy`` down to
``overflow_resolution_target`` of its size; ``overflow_margin`` bounds each table's rows as
in ``hash_map``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

import numpy as np

from hps.config import NO_LIMIT, PersistentDBConfig, VolatileDBConfig
from hps.dedup import last_occurrence
from hps.errors import BackendError, ConfigError
from hps.rowformat import Stored
from hps.storage._shm_index import MAX_LOAD
from hps.storage._shm_layout import MAX_TABLES, EntryView, EntryWord, HeaderWord, NoSpace
from hps.storage._shm_segment import Segment
from hps.storage._shm_table import ShmTable, rows_per_extent
from hps.storage.base import AccessMode, EmbeddingStore, check_rows
from hps.types import JSON, Keys, Mask, TableSpec
from hps.validate import table_or_raise


class SharedHashMapStore(EmbeddingStore):
    """L2 in a shared-memory segment, shared by all processes that open the same name."""

    name = "multi_process_hash_map"
    placement = "node"

    def __init__(
        self,
        shared_memory_name: str = "hctr_mp_hash_map_database",
        shared_memory_size: int = 16 * 1024**3,
        *,
        shared_memory_auto_remove: bool = True,
        allocation_rate: int = 256 * 1024**2,
        max_batch_size: int = 65536,
        overflow_margin: int = NO_LIMIT,
        overflow_policy: str = "evict_random",
        overflow_resolution_target: float = 0.8,
        directory: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.overflow_margin = overflow_margin
        self.overflow_policy = overflow_policy
        self.target = overflow_resolution_target
        self._seg = Segment(
            shared_memory_name,
            shared_memory_size,
            allocation_rate=allocation_rate,
            auto_remove=shared_memory_auto_remove,
            directory=directory,
        )
        self.path = self._seg.path
        self._finalizer = weakref.finalize(self, self._seg.close)
        self._specs: dict[str, TableSpec] = {}
        self._slots: dict[str, int] = {}
        self._tables: dict[str, ShmTable] = {}
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()

    @classmethod
    def from_config(
        cls, cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
    ) -> SharedHashMapStore:
        assert isinstance(cfg, VolatileDBConfig)
        return cls(
            cfg.shared_memory_name,
            cfg.shared_memory_size,
            shared_memory_auto_remove=cfg.shared_memory_auto_remove,
            allocation_rate=cfg.allocation_rate,
            max_batch_size=cfg.max_batch_size,
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )

    def open_table(self, spec: TableSpec) -> None:
        held = self._specs.get(spec.name)
        if held is not None and held.row_dtype == spec.row_dtype and held.dim == spec.dim:
            return
        rpe = rows_per_extent(self._seg.extent, spec.fmt.row_bytes(spec.dim))
        if rpe < 1:
            raise ConfigError(
                f"{spec.name}: {spec.row_dtype} rows of dimension {spec.dim} do not fit in the "
                f"shared hash map's {self._seg.extent}-byte extents; raise "
                "volatile_db.allocation_rate and shared_memory_size"
            )
        with self._seg.writing():
            slot = self._seg.table_slot(spec, rpe)
        self._specs[spec.name] = spec
        self._slots[spec.name] = slot
        self._tables[spec.name] = ShmTable(self._seg, slot)  # views only: valid until close

    def drop_table(self, table: str) -> None:
        """Free the table's rows and entry in the segment (other processes holding it open
        must open it again)."""
        with self._seg.writing():
            self._seg.drop(table)
        self._specs.pop(table, None)
        self._slots.pop(table, None)
        self._tables.pop(table, None)

    def _table(self, name: str) -> ShmTable:
        return table_or_raise(self._tables, name)

    def _chunks(self, n: int) -> Iterator[slice]:
        for lo in range(0, n, self.max_batch_size):
            yield slice(lo, min(n, lo + self.max_batch_size))

    # -- reads -------------------------------------------------------------------------

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        t = self._table(table)
        if keys.size <= self.max_batch_size:
            return self._fetch_chunk(t, keys)
        values = np.zeros((keys.size, t.fmt.width(t.dim)), dtype=t.fmt.dtype)
        found = np.zeros(keys.size, dtype=bool)
        for part in self._chunks(keys.size):
            values[part], found[part] = self._fetch_chunk(t, keys[part])
        return values, found

    def _fetch_chunk(self, t: ShmTable, keys: Keys) -> tuple[Stored, Mask]:
        with self._seg.reading():
            # Readers race on the tick only; any recent tick is good enough for LRU.
            touch = self.overflow_policy == "evict_least_used"
            return t.fetch(keys, self._seg.next_tick() if touch else None)

    def size(self, table: str) -> int:
        t = self._table(table)
        with self._seg.reading():
            return t.rows

    def dump(self, table: str, chunk_rows: int = 1 << 18) -> Iterator[tuple[Keys, Stored]]:
        """Yield (keys, stored rows) chunks of the whole table (rows may move between chunks)."""
        t = self._table(table)
        lo = 0
        while True:
            with self._seg.reading():
                keys, values = t.dump(lo, lo + chunk_rows)
            if keys.size == 0:
                return
            yield keys, values
            lo += chunk_rows

    # -- writes ------------------------------------------------------------------------

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        t = self._table(table)
        check_rows(self._specs[table], keys, values)
        keys, values = last_occurrence(keys, values)
        for part in self._chunks(keys.size):
            with self._seg.writing():
                self._upsert(t, keys[part], values[part])
                if t.rows > self.overflow_margin:
                    keep = int(self.overflow_margin * self.target)
                    self._evict(t, t.rows - keep)

    def _upsert(self, t: ShmTable, keys: Keys, values: Stored) -> None:
        """Insert, evicting from the largest table whenever no extent is free."""
        self._check_fits(t, keys.size)
        while True:
            try:
                t.upsert(keys, values, self._seg.next_tick())
                return
            except NoSpace as exc:
                victim = self._largest_table()
                if victim is None or victim.rows == 0:
                    raise BackendError(
                        f"multi_process_hash_map: {self.path} is full ({exc}) and no rows are "
                        f"left to evict for {keys.size} rows of {t.entry.name}"
                    ) from None
                self._evict(victim, max(1, victim.rows - int(victim.rows * self.target)))

    def _check_fits(self, t: ShmTable, n: int) -> None:
        """Refuse, before evicting anything, a batch that could never fit."""
        seg = self._seg
        buckets = -(-2 * n // int(t.index.capacity))  # buckets end up half full at worst
        need = -(-n // t.rpe) + buckets
        if need > seg.n_ext:
            raise BackendError(
                f"multi_process_hash_map: {n} {t.fmt.name} rows of dimension {t.dim} need "
                f"about {need} "
                f"extents of {seg.extent} bytes; {seg.path} has {seg.n_ext}: raise "
                "shared_memory_size or send smaller batches"
            )

    def _largest_table(self) -> ShmTable | None:
        best: ShmTable | None = None
        for slot in range(MAX_TABLES):
            if EntryView(self._seg, slot).meta[EntryWord.STATE]:
                t = ShmTable(self._seg, slot)
                if best is None or t.extents > best.extents:
                    best = t
        return best

    def _evict(self, t: ShmTable, count: int) -> None:
        if count > 0:
            with self._rng_lock:
                t.evict(self.overflow_policy, count, self._rng)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        t = self._table(table)
        keys = np.unique(keys)
        for part in self._chunks(keys.size):
            with self._seg.writing():
                t.remove(keys[part])

    # -- introspection -----------------------------------------------------------------

    def nbytes(self, table: str) -> int:
        """Bytes of the segment the table holds (its row and bucket extents)."""
        t = self._table(table)
        with self._seg.reading():
            return t.extents * self._seg.extent

    @classmethod
    def bytes_per_row(
        cls, row_bytes: int, *, bounded: bool = False, extent: int = 1 << 20
    ) -> float:
        """Expected bytes per row: dense rows plus buckets at ~69% fill (ln 2) of MAX_LOAD."""
        from hps.storage._shm_index import bucket_slots

        index = extent / (bucket_slots(extent) * MAX_LOAD * 0.69)
        return extent / rows_per_extent(extent, row_bytes) + index

    def stats(self) -> JSON:
        seg = self._seg
        with seg.reading():
            tables = {
                name: {"rows": (t := ShmTable(seg, slot)).rows, "extents": t.extents}
                for name, slot in self._slots.items()
            }
            return {
                "path": seg.path,
                "size": seg.size,
                "extent_bytes": seg.extent,
                "extents": seg.n_ext,
                "free_extents": seg.extents.n_free,
                "attached": int(seg.h[HeaderWord.ATTACHED]),
                "repairs": int(seg.h[HeaderWord.REPAIRS]),
                "tables": tables,
            }

    def close(self) -> None:
        self._specs.clear()
        self._slots.clear()
        self._tables.clear()
        self._finalizer()
