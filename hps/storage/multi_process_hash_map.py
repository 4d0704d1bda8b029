"""``multi_process_hash_map``: one L2 hash map in shared memory for every process of a node.

Triton runs each model instance in its own process; with ``hash_map`` each would hold its
own copy of L2. This backend keeps a single copy in a POSIX shared-memory segment
(``shared_memory_name`` under ``/dev/shm``, at most ``shared_memory_size`` bytes) that
every process maps: whatever one process inserts, all others fetch. A ps.json that names no
segment gets its deployment's own, named after its L3 path
(:func:`hps.config.databases.shared_memory_name_for`), and the segment records that path:
a store of another deployment given the same name by hand is refused (``ConfigError``).
Rows are stored in the table's row format (:mod:`hps.rowformat`), which the table's entry
records: a process that opens the table with another format or dimension is refused
(``ConfigError``).

The segment is carved into fixed-size extents (see ``_shm_segment``); a table is a dense
row arena of extents plus an extendible-hashing key index of bucket extents
(``_shm_table``, ``_shm_index``), both growing one extent at a time. Reads take a shared
``flock``, writes an exclusive one, so no process ever sees a half-written row (a waiting
writer holds a turnstile that readers pass first, so overlapping readers never starve it:
``_shm_locks``); the kernel drops the lock of a process that dies, and a writer that dies
mid-update leaves a dirty mark on the tables it was changing, whose rows the next process
clears (L2 is a cache). When no extent is free, the table holding the most extents sheds
rows by ``overflow_policy`` down to ``overflow_resolution_target`` of its size;
``overflow_margin`` bounds each table's rows as in ``hash_map``.

The store follows its name: when the files under ``/dev/shm`` are removed or replaced while
it holds the segment, it notices (:meth:`SharedHashMapStore.follow`: the segment's identity,
file and creation id, checked by the first operation at least ``identity_check_s`` after the
last check, or whenever a caller asks), opens the segment the name points at now (creating
it if there is none), opens its tables there and moves every later operation to it; the old
mapping is closed once this process's threads are out of it. Rows are not carried over
(L2 is a cache): whoever holds L3 refills the new segment
(:class:`hps.tiers.shared_l2.SharedL2Watch`) and records it
(:meth:`SharedHashMapStore.mark_filled`) for the other processes to see. The "last user"
never removes files that are not the ones it opened.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

import numpy as np

from hps.config import NO_LIMIT, PersistentDBConfig, VolatileDBConfig
from hps.config.databases import DEFAULT_SHM_NAME
from hps.dedup import greater_rows, greatest_occurrence, last_occurrence
from hps.errors import BackendError, BackendUnavailable, ConfigError
from hps.rowformat import Stored
from hps.storage._shm_index import MAX_LOAD
from hps.storage._shm_layout import (
    EntryView,
    EntryWord,
    HeaderWord,
    NoMemory,
    NoSpace,
)
from hps.storage._shm_segment import Identity, Segment, SegmentClosed, Untouched
from hps.storage._shm_table import ShmTable, rows_per_extent
from hps.storage.base import AccessMode, EmbeddingStore, WriteMode, check_max_rows, check_rows
from hps.storage.overflow import rows_to_keep
from hps.types import JSON, Keys, Mask, TableSpec
from hps.validate import table_or_raise

log = logging.getLogger(__name__)

R = TypeVar("R")

IDENTITY_CHECK_S = 1.0
"""How often (at most) an operation checks that the name still points at the held segment."""


class _Stale(Untouched):
    """A table handle whose entry another process dropped (internal: opened again). Seen
    before anything is written: a write lock it ends leaves the segment clean."""


def _fresh(held: _Held, table: str) -> ShmTable:
    t = table_or_raise(held.tables, table)
    if t.stale:
        raise _Stale(table)
    return t


class _Held:
    """The segment a store holds and its tables' handles there (replaced whole by follow)."""

    def __init__(self, seg: Segment, tables: dict[str, ShmTable]) -> None:
        self.seg = seg
        self.tables = tables


def _closed_error() -> BackendError:
    return BackendError("multi_process_hash_map: the store is closed")


class _Box:
    """What the store's finalizer closes: the segment held at the time (not the store)."""

    def __init__(self, held: _Held) -> None:
        self.held = held


def _close_held(box: _Box) -> None:
    box.held.seg.close()


class SharedHashMapStore(EmbeddingStore):
    """L2 in a shared-memory segment, shared by all processes that open the same name."""

    name = "multi_process_hash_map"
    placement = "node"

    def __init__(
        self,
        shared_memory_name: str = DEFAULT_SHM_NAME,
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
        identity_check_s: float | None = IDENTITY_CHECK_S,
        deployment: str | None = None,
    ) -> None:
        """``deployment``: the resolved L3 path of the deployment this store serves
        (:attr:`hps.config.VolatileDBConfig.deployment`); the segment records the first one
        and refuses a store of another (``ConfigError``). ``None``: not checked."""
        self.max_batch_size = max_batch_size
        self.overflow_margin = overflow_margin
        self.overflow_policy = overflow_policy
        self.target = overflow_resolution_target
        self.identity_check_s = identity_check_s  # None: only when follow() is called

        def open_segment() -> Segment:
            return Segment(
                shared_memory_name,
                shared_memory_size,
                allocation_rate=allocation_rate,
                auto_remove=shared_memory_auto_remove,
                directory=directory,
                deployment=deployment,
            )

        self._open_segment = open_segment
        seg = open_segment()
        self.path = seg.path
        self._box = _Box(_Held(seg, {}))
        self._finalizer = weakref.finalize(self, _close_held, self._box)
        self._specs: dict[str, TableSpec] = {}
        self._structure = threading.Lock()  # open_table, drop_table, follow
        self._checked = time.monotonic()
        self.generation = 0  # how many times follow() moved to another segment
        self._no_memory_said = -60.0  # when a full folder was last logged
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        self._closed = False  # set by close(), under _structure

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

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
            deployment=cfg.deployment or None,
        )

    @property
    def _seg(self) -> Segment:
        """The segment held now."""
        return self._box.held.seg

    @property
    def _tables(self) -> dict[str, ShmTable]:
        """The held segment's table handles."""
        return self._box.held.tables

    def _table(self, name: str) -> ShmTable:
        return table_or_raise(self._box.held.tables, name)

    def open_table(self, spec: TableSpec) -> None:
        self._seg.check_process()  # before _structure: a fork may have copied it held
        with self._structure:
            self._check_open()
            held = self._box.held
            known = self._specs.get(spec.name)
            if (
                known is not None
                and known.row_dtype == spec.row_dtype
                and known.dim == spec.dim
                and spec.name in held.tables
                and not held.tables[spec.name].stale
            ):
                return
            held.tables[spec.name] = self._open_on(held.seg, spec)
            self._specs[spec.name] = spec

    @staticmethod
    def _open_on(seg: Segment, spec: TableSpec) -> ShmTable:
        rpe = rows_per_extent(seg.extent, spec.fmt.row_bytes(spec.dim))
        if rpe < 1:
            raise ConfigError(
                f"{spec.name}: {spec.row_dtype} rows of dimension {spec.dim} do not fit in the "
                f"shared hash map's {seg.extent}-byte extents; raise "
                "volatile_db.allocation_rate and shared_memory_size"
            )
        with seg.writing():  # the handle too: its incarnation is read under the lock
            return ShmTable(seg, seg.table_slot(spec, rpe))  # views: valid until closed

    def drop_table(self, table: str) -> None:
        """Free the table's rows and entry in the segment (other processes holding it open
        must open it again)."""
        self._seg.check_process()
        with self._structure:
            self._check_open()
            held = self._box.held
            with held.seg.writing():
                held.seg.drop(table)
            self._specs.pop(table, None)
            held.tables.pop(table, None)

    def _chunks(self, n: int) -> Iterator[slice]:
        for lo in range(0, n, self.max_batch_size):
            yield slice(lo, min(n, lo + self.max_batch_size))

    # -- the segment the name points at ---------------------------------------------------

    @property
    def identity(self) -> Identity:
        """The held segment's ``(st_dev, st_ino, created id)``."""
        return self._seg.identity

    def current(self) -> bool:
        """Whether the name still points at the held segment (a ``stat`` and an 8-byte read)."""
        return self._seg.current()

    def follow(self) -> bool:
        """Move to the segment the name points at now if it is not the held one: open (or
        create) it and open this store's tables there; True if it moved. The old segment
        is closed once this process's threads are out of it, and its files, no longer the
        ones at the name, are left alone. Rows are not copied: L2 is refilled from L3 by
        whoever holds L3 (:class:`hps.tiers.shared_l2.SharedL2Watch`)."""
        if self.current():
            return False
        with self._structure:
            self._check_open()  # a closed store opens no segment (nor makes one)
            old = self._box.held
            if old.seg.current():
                return False  # another thread of this process moved already
            seg = self._open_segment()
            try:
                tables = {name: self._open_on(seg, spec) for name, spec in self._specs.items()}
            except BaseException:
                seg.close()
                raise
            self._box.held = _Held(seg, tables)
            self.generation += 1
        log.warning(
            "multi_process_hash_map: %s no longer names the segment this process held "
            "(removed or replaced); moved to the one it names now (%d tables reopened; their "
            "rows come back from L3)",
            self.path,
            len(tables),
        )
        old.seg.close()
        return True

    def _held_now(self) -> _Held:
        """The held segment, after following the name when the last check is old enough."""
        every = self.identity_check_s
        if every is not None:
            now = time.monotonic()
            if now - self._checked >= every:
                self._checked = now
                self.follow()
        return self._box.held

    def _on_segment(self, write: bool, fn: Callable[[_Held], R]) -> R:
        """``fn(held)`` under the held segment's lock; again on the new segment when the
        held one was replaced while this thread waited for it. A ``BackendError`` once the
        store is closed."""
        while True:
            self._check_open()
            held = self._held_now()
            try:
                with held.seg.writing() if write else held.seg.reading():
                    return fn(held)
            except SegmentClosed:
                self._check_replaced(held)

    def _check_replaced(self, held: _Held) -> None:
        """After ``held``'s segment was closed under a waiting thread: fine if follow
        replaced it (retry on the new one); the store closed otherwise."""
        if self._closed or self._box.held is held:
            raise _closed_error() from None

    def _with(self, table: str, write: bool, fn: Callable[[ShmTable], R]) -> R:
        """``fn`` on the table's handle, opened again first where another process dropped
        the table since (its entry may hold another table now: never read through it)."""
        while True:
            try:
                return self._on_segment(write, lambda held: fn(_fresh(held, table)))
            except _Stale:
                self._reopen(table)

    def _reopen(self, table: str) -> None:
        with self._structure:
            self._check_open()
            held = self._box.held
            spec = table_or_raise(self._specs, table)
            held.tables[table] = self._open_on(held.seg, spec)  # a ConfigError if reshaped
        log.info("multi_process_hash_map: %s was dropped by another process; opened again",
                 table)  # fmt: skip

    def filled(self) -> int:
        """How many fills from L3 finished on the held segment (see :meth:`mark_filled`)."""
        return self._on_segment(False, lambda held: held.seg.filled())

    def mark_filled(self) -> None:
        """Record in the held segment that a fill from L3 finished (the other processes'
        watches refresh their L1 when the count changes)."""
        self._on_segment(True, lambda held: held.seg.mark_filled())

    # -- reads -------------------------------------------------------------------------

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        self._check_open()
        if keys.size <= self.max_batch_size:
            return self._with(table, False, lambda t: self._fetch_chunk(t, keys))
        spec = table_or_raise(self._specs, table)
        values = spec.fmt.empty(keys.size, spec.dim)
        found = np.zeros(keys.size, dtype=bool)
        for part in self._chunks(keys.size):
            values[part], found[part] = self._fetch_part(table, keys[part])
        return values, found

    def _fetch_part(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        return self._with(table, False, lambda t: self._fetch_chunk(t, keys))

    def _fetch_chunk(self, t: ShmTable, keys: Keys) -> tuple[Stored, Mask]:
        # The tick as it is: readers share the lock and never move it (only writers do).
        touch = self.overflow_policy == "evict_least_used"
        return t.fetch(keys, t.seg.tick() if touch else None)

    def size(self, table: str) -> int:
        return self._with(table, False, lambda t: t.rows)

    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Yield (keys, stored rows) chunks of the whole table, of at most ``chunk_rows``
        rows (default: sized by bytes, :func:`hps.io.chunks.rows_per_chunk`); rows may move
        between chunks; a segment replaced meanwhile is a ``BackendUnavailable``: dump
        again."""
        from hps.io.chunks import rows_per_chunk

        self._with(table, False, lambda t: None)  # opened again if another process dropped it
        held = self._held_now()
        t = table_or_raise(held.tables, table)
        if chunk_rows is None:
            chunk_rows = rows_per_chunk(t.row_bytes)
        lo = 0
        while True:
            try:
                with held.seg.reading():
                    if t.stale:
                        raise BackendUnavailable(
                            f"multi_process_hash_map: {table} was dropped by another process "
                            "during a dump of it: dump again"
                        )
                    keys, values = t.dump(lo, lo + chunk_rows)
            except SegmentClosed:
                self._check_replaced(held)
                raise BackendUnavailable(
                    f"multi_process_hash_map: {self.path} was replaced during a dump of {table}"
                ) from None
            if keys.size == 0:
                return
            yield keys, values
            lo += chunk_rows

    # -- writes ------------------------------------------------------------------------

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        self._write(table, keys, values, how="upsert")

    def insert_absent(self, table: str, keys: Keys, values: Stored) -> None:
        self._write(table, keys, values, how="absent")

    def insert_max(self, table: str, keys: Keys, values: Stored) -> None:
        check_max_rows(table, keys, values)
        self._write(table, keys, values, how="max")

    def _write(self, table: str, keys: Keys, values: Stored, *, how: WriteMode) -> None:
        self._check_open()
        check_rows(table_or_raise(self._specs, table), keys, values)
        keys, values = (greatest_occurrence if how == "max" else last_occurrence)(keys, values)
        for part in self._chunks(keys.size):
            chunk = partial(self._insert_chunk, keys=keys[part], values=values[part], how=how)
            self._with(table, True, chunk)

    def _insert_chunk(self, t: ShmTable, keys: Keys, values: Stored, how: WriteMode) -> None:
        # Under the writer's lock: no write lands between the look and ours.
        if how != "upsert":
            if how == "absent":
                take = t.index.lookup(keys) < 0
            else:
                held, found = t.fetch(keys, None)
                take = ~found | greater_rows(values, held)
            keys, values = keys[take], values[take]
            if not keys.size:
                return
        self._upsert(t, keys, values)
        if t.rows > self.overflow_margin:
            keep = rows_to_keep(self.overflow_margin, self.target)
            self._evict(t, t.rows - keep)

    def _upsert(self, t: ShmTable, keys: Keys, values: Stored) -> None:
        """Insert, evicting from the largest table whenever no extent is free."""
        self._check_fits(t, keys.size)
        while True:
            try:
                t.upsert(keys, values, t.seg.next_tick())
                return
            except NoSpace as exc:
                if isinstance(exc, NoMemory):
                    self._warn_no_memory(exc)
                victim = self._largest_table(t.seg)
                if victim is None or victim.rows == 0:
                    raise BackendError(
                        f"multi_process_hash_map: {self.path} is full ({exc}) and no rows are "
                        f"left to evict for {keys.size} rows of {t.entry.name}"
                    ) from None
                self._evict(victim, victim.rows - rows_to_keep(victim.rows, self.target))

    def _warn_no_memory(self, exc: NoMemory) -> None:
        """The segment is smaller than configured in effect: rows are evicted for room the
        folder cannot give. Said at most once a minute (it recurs while it lasts)."""
        now = time.monotonic()
        if now - self._no_memory_said >= 60.0:
            self._no_memory_said = now
            log.warning(
                "multi_process_hash_map: %s (%s): evicting rows to make room within the "
                "memory it has; make it larger or shared_memory_size smaller",
                exc, self.path,
            )  # fmt: skip

    def _check_fits(self, t: ShmTable, n: int) -> None:
        """Refuse, before evicting anything, a batch that could never fit."""
        seg = t.seg
        buckets = -(-2 * n // int(t.index.capacity))  # buckets end up half full at worst
        need = -(-n // t.rpe) + buckets
        if need > seg.n_ext:
            raise BackendError(
                f"multi_process_hash_map: {n} {t.fmt.name} rows of dimension {t.dim} need "
                f"about {need} "
                f"extents of {seg.extent} bytes; {seg.path} has {seg.n_ext}: raise "
                "shared_memory_size or send smaller batches"
            )

    @staticmethod
    def _largest_table(seg: Segment) -> ShmTable | None:
        best: ShmTable | None = None
        for slot in range(seg.max_tables):
            if EntryView(seg, slot).meta[EntryWord.STATE]:
                t = ShmTable(seg, slot)
                if best is None or t.extents > best.extents:
                    best = t
        return best

    def _evict(self, t: ShmTable, count: int) -> None:
        if count > 0:
            with self._rng_lock:
                t.evict(self.overflow_policy, count, self._rng)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        keys = np.unique(keys)
        for part in self._chunks(keys.size):
            self._remove_part(table, keys[part])

    def _remove_part(self, table: str, keys: Keys) -> None:
        self._with(table, True, lambda t: t.remove(keys))

    # -- introspection -----------------------------------------------------------------

    def nbytes(self, table: str) -> int:
        """Bytes of the segment the table holds (its row and bucket extents)."""
        return self._with(table, False, lambda t: t.extents * t.seg.extent)

    @classmethod
    def bytes_per_row(
        cls, row_bytes: int, *, bounded: bool = False, extent: int = 1 << 20
    ) -> float:
        """Expected bytes per row: dense rows plus buckets at ~69% fill (ln 2) of MAX_LOAD."""
        from hps.storage._shm_index import bucket_slots

        index = extent / (bucket_slots(extent) * MAX_LOAD * 0.69)
        return extent / rows_per_extent(extent, row_bytes) + index

    @classmethod
    def table_bytes(
        cls, rows: int, row_bytes: int, cfg: VolatileDBConfig | PersistentDBConfig
    ) -> int:
        """Whole extents of the configured segment (16 MiB with the defaults): a table
        takes at least one of rows and one bucket, however few rows it has."""
        from hps.storage._shm_index import bucket_slots
        from hps.storage._shm_layout import plan

        assert isinstance(cfg, VolatileDBConfig)
        if rows == 0:
            return 0
        extent = plan(cfg.shared_memory_size, cfg.allocation_rate).extent
        row_extents = max(1, math.ceil(rows / rows_per_extent(extent, row_bytes)))
        buckets = max(1, math.ceil(rows / (bucket_slots(extent) * MAX_LOAD * 0.69)))
        return (row_extents + buckets) * extent

    def stats(self) -> JSON:
        def read(held: _Held) -> JSON:
            seg = held.seg
            tables = {
                name: {"rows": t.rows, "extents": t.extents}
                for name, t in held.tables.items()
                if not t.stale  # dropped by another process (opened again at its next use)
            }
            return {
                "path": seg.path,
                "size": seg.size,
                "extent_bytes": seg.extent,
                "extents": seg.n_ext,
                "free_extents": seg.extents.n_free,
                "attached": int(seg.h[HeaderWord.ATTACHED]),
                "repairs": int(seg.h[HeaderWord.REPAIRS]),
                "created": seg.identity[2],
                "filled": seg.filled(),
                "followed": self.generation,
                "tables": tables,
            }

        return self._on_segment(False, read)

    def close(self) -> None:
        """Detach (see ``_shm_segment``); every later operation raises ``BackendError``."""
        if self._seg.forked:  # a forked child: the parent's locks, its thread lock included
            self._closed = True
            return
        with self._structure:
            self._closed = True
        self._finalizer()  # waits for this process's threads in the segment
        # Only now: a thread still in the segment when close began needs its table handles
        with self._structure:
            self._box.held.tables.clear()
