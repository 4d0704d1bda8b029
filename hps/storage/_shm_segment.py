"""The shared-memory segment of ``multi_process_hash_map``: mapping, lifecycle, readers and
writers, the table registry.

One file under ``/dev/shm`` (POSIX shared memory, as ``shm_open`` names it) holds the whole
L2 of a node; every process maps it (layout: ``_shm_layout``; lock files: ``_shm_locks``;
free extents: ``_shm_extents``).

A writer sets the header's ``DIRTY`` flag while it holds the lock, and a table's own flag
before it changes that table. A writer killed half-way leaves them set; the next process to
take the lock clears the rows of the flagged tables only (L2 is a cache: lookups fall back
to L3), keeps the table registry (other processes' handles stay valid) and rebuilds the
free-extent stack from what the surviving tables hold.

**Identity.** A segment is known by :data:`Identity`: the file's ``(st_dev, st_ino)`` and
the random id its header got when it was initialised (``HeaderWord.CREATED``). Anyone may
remove the files under ``/dev/shm`` while processes hold them (an operator, a cleanup
script, a process with another ``shared_memory_auto_remove``): the holders keep an
unlinked segment that nobody who opens the name will see. :meth:`Segment.current` tells
whether the name still points at the segment held (a ``stat`` and an 8-byte read, no
mapping), so the store can follow the name (``SharedHashMapStore.follow``), and
:meth:`Segment.close` never unlinks a file that is not the one it opened: the "last user"
removes the files only while they are still its own.

**Deployment.** A store may be told the deployment it serves (its L3's resolved path,
:attr:`hps.config.VolatileDBConfig.deployment`). The first such store records it in the
header (``HeaderWord.DEPLOYMENT``, and the path itself from byte ``DEPLOYMENT_TEXT`` for
messages); a store of another deployment is refused (``ConfigError``): two deployments
on one host that were given one ``shared_memory_name`` would serve each other's rows.

**Ticks** (``evict_least_used``, ``evict_oldest``). Only a writer, under the exclusive lock,
moves the tick (:meth:`Segment.next_tick`); readers stamp the rows they fetch with the tick
as it is (:meth:`Segment.tick`). Readers run together, and a counter they all wrote could
go backwards (two read-modify-writes interleaved), which would make the freshest rows look
2^32 ticks old.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import secrets
from collections.abc import Iterator

import numpy as np

from hps.config.databases import shm_name_problem
from hps.errors import BackendError, ConfigError, HPSError
from hps.rowformat import RowFormat
from hps.storage._shm_extents import Extents, commit
from hps.storage._shm_layout import (
    DEPLOYMENT_TEXT,
    MAGIC,
    MAX_EXTENT,
    MAX_TABLES,
    NAME_BYTES,
    PAGE,
    VERSION,
    EntryView,
    EntryWord,
    Geometry,
    HeaderWord,
    NoSpace,
    default_directory,
    plan,
)
from hps.storage._shm_locks import SegmentLocks
from hps.storage.base import refused
from hps.storage.overflow import TICK_MASK
from hps.types import TableSpec

log = logging.getLogger(__name__)

Identity = tuple[int, int, int]
"""``(st_dev, st_ino, created id)`` of a segment file (see the module docstring)."""


class SegmentClosed(Exception):
    """The segment was closed (replaced by a newer one) while a thread waited for it
    (internal: the store retries on the segment it holds now)."""


class Untouched(Exception):
    """Raised inside :meth:`Segment.writing` before the block changed anything (internal):
    the segment is left clean, as after an ``HPSError``, not marked for repair."""


def _deployment_hash(deployment: str) -> int:
    """The header's record of a deployment: 63 bits of its path's SHA-256, never 0."""
    digest = hashlib.sha256(deployment.encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 1) | 1


def path_identity(path: str) -> Identity | None:
    """The identity of the segment file at ``path`` now (``None``: no file there)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        raw = os.pread(fd, 8, 8 * HeaderWord.CREATED)
    finally:
        os.close(fd)
    created = int.from_bytes(raw, "little", signed=True) if len(raw) == 8 else 0
    return st.st_dev, st.st_ino, created


class Segment:
    """One mapped segment plus its locks; the views are valid until :meth:`close`."""

    def __init__(
        self,
        name: str,
        size: int,
        *,
        allocation_rate: int = MAX_EXTENT,
        auto_remove: bool = True,
        directory: str | None = None,
        deployment: str | None = None,
    ) -> None:
        if problem := shm_name_problem(name):
            shown = repr(name) if len(name) <= 60 else f"{name[:60]!r}..."
            raise ConfigError(f"volatile_db.shared_memory_name: {shown} {problem}")
        name = name.lstrip("/")
        self.name = name
        self.auto_remove = auto_remove
        base = directory or default_directory()
        self.path = os.path.join(base, name)
        self._geo = plan(size, allocation_rate)
        self._closed = False
        self._touched: list[EntryView] = []  # tables flagged dirty by the current write
        while True:
            locks = SegmentLocks(self.path)
            try:
                with locks.held(fcntl.LOCK_EX):
                    # The last user may have removed the files between our opening them and
                    # this lock: then join the new ones (never two writers on two .lock files)
                    if locks.at_paths():
                        self._locks = locks
                        self._attach(size, deployment)
                        break
            except BaseException:
                self._drop_mapping()
                locks.close()
                raise
            locks.close()
        try:
            st = os.fstat(self._fd)
            self.identity: Identity = (st.st_dev, st.st_ino, int(self.h[HeaderWord.CREATED]))
        except BaseException:
            self._drop_mapping()
            self._locks.close()
            raise
        self._values: dict[tuple[str, int], np.ndarray] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def _attach(self, size: int, deployment: str | None) -> None:
        """Map the segment (made if missing) and count this store in. Call under the
        exclusive lock; a refused or failed open removes the lock files it made."""
        try:
            self._map(size)
            self._claim(deployment)
            if self._locks.only_user():
                self.h[HeaderWord.ATTACHED] = 0  # left by crashed processes
            self.h[HeaderWord.ATTACHED] += 1
        except BaseException:
            self._locks.remove_created()
            raise

    def _open_locked(self) -> int:
        """The segment file at the path (made if missing), its own lock held exclusively
        (see ``_shm_locks``)."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise BackendError(
                    f"multi_process_hash_map: cannot open {self.path}: {exc}"
                ) from exc
            try:
                if self._locks.lock_segment(fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # removed between the two opens: open what is there now

    def _map(self, size: int) -> None:
        fd = self._open_locked()
        try:
            existing = os.fstat(fd).st_size
            if 0 < existing < PAGE:  # before reading a header word it does not hold
                raise BackendError(
                    f"multi_process_hash_map: {self.path} holds {existing} bytes, less than "
                    f"the {PAGE}-byte header of a shared hash map: it is not one; remove it"
                )
            if existing == 0:
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, existing or size)
            self._fd = fd
            with contextlib.suppress(AttributeError, OSError):  # where shmem THP is "advise"
                self._mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError as exc:
            os.close(fd)
            raise BackendError(f"multi_process_hash_map: cannot map {self.path}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        self._views()
        h = self.h
        if existing and int(h[HeaderWord.MAGIC]) not in (0, MAGIC):
            raise BackendError(f"{self.path} is not an HPS shared hash map; remove it")
        if existing == 0 or h[HeaderWord.READY] != 1:
            geo = self._geo if existing == 0 else self._replan(existing)
            try:
                self._init(geo)
            except NoSpace as exc:
                if existing == 0:
                    os.unlink(self.path)
                raise BackendError(f"multi_process_hash_map: {self.path}: {exc}") from None
        elif h[HeaderWord.MAGIC] != MAGIC or h[HeaderWord.VERSION] != VERSION:
            raise BackendError(
                f"{self.path} has layout version {int(h[HeaderWord.VERSION])}, this HPS "
                f"writes {VERSION}: stop its users and remove it"
            )
        elif int(h[HeaderWord.SIZE]) > existing:
            raise BackendError(
                f"multi_process_hash_map: {self.path} holds {existing} bytes, but its header "
                f"records {int(h[HeaderWord.SIZE])}: it was cut short; stop its users and "
                "remove it"
            )
        self._geometry()
        if existing and existing != size:
            log.warning("shared memory %s exists with %d bytes (configured %d): using it as is",
                        self.path, existing, size)  # fmt: skip

    def _replan(self, existing: int) -> Geometry:
        """The layout of an existing file whose creator never finished its header (it died,
        or the file is not a segment): as large as the file is."""
        try:
            return plan(existing, self._geo.extent)
        except ConfigError:
            raise BackendError(
                f"multi_process_hash_map: {self.path} holds {existing} bytes and no finished "
                "header: too small for a shared hash map (not one, or cut short); remove it"
            ) from None

    def _claim(self, deployment: str | None) -> None:
        """Record ``deployment`` where none is recorded; refuse another deployment's segment
        (see the module docstring). Call under the exclusive lock."""
        if not deployment:
            return
        h, mine = self.h, _deployment_hash(deployment)
        recorded = int(h[HeaderWord.DEPLOYMENT])
        if recorded == 0:
            raw = deployment.encode()[: PAGE - DEPLOYMENT_TEXT]
            self.u8[DEPLOYMENT_TEXT : DEPLOYMENT_TEXT + len(raw)] = np.frombuffer(raw, np.uint8)
            h[HeaderWord.DEPLOYMENT_LEN] = len(raw)
            h[HeaderWord.DEPLOYMENT] = mine
        elif recorded != mine:
            raise ConfigError(
                f"volatile_db.shared_memory_name: {self.path} is the L2 of the deployment whose "
                f"L3 (persistent_db.path) is {self.deployment()!r}, not this one's "
                f"({deployment!r}); two deployments must not share a segment: give this one "
                "its own shared_memory_name, or none (the default is named after the L3 path)"
            )

    def deployment(self) -> str:
        """The L3 path of the deployment recorded in the header (``""``: none yet)."""
        n = min(max(0, int(self.h[HeaderWord.DEPLOYMENT_LEN])), PAGE - DEPLOYMENT_TEXT)
        return bytes(self.u8[DEPLOYMENT_TEXT : DEPLOYMENT_TEXT + n]).decode(errors="replace")

    def _views(self) -> None:
        mm = self._mm
        self.u8 = np.frombuffer(mm, dtype=np.uint8)
        self.i64 = np.frombuffer(mm, dtype=np.int64, count=len(mm) // 8)
        self.i32 = np.frombuffer(mm, dtype=np.int32, count=len(mm) // 4)
        self.u32 = np.frombuffer(mm, dtype=np.uint32, count=len(mm) // 4)
        self.groups = self.i64[: len(mm) // 64 * 8].reshape(-1, 8)  # 64-byte key groups
        self.h = self.i64[: len(HeaderWord)]

    def _geometry(self) -> None:
        h = self.h
        self.size, self.extent, self.n_ext = (
            int(h[HeaderWord.SIZE]),
            int(h[HeaderWord.EXTENT]),
            int(h[HeaderWord.N_EXT]),
        )
        self.row_ext_cap, self.dir_len = int(h[HeaderWord.ROW_EXT_CAP]), int(h[HeaderWord.DIR_LEN])
        self.max_tables = int(h[HeaderWord.MAX_TABLES])  # as created (64 before 256 was)
        self.tables_off, self.entry_bytes = (
            int(h[HeaderWord.TABLES_OFF]),
            int(h[HeaderWord.ENTRY_BYTES]),
        )
        f0 = int(h[HeaderWord.FREE_OFF]) // 4
        self.extents = Extents(h, self.i32[f0 : f0 + self.n_ext], self._fd, self.path)

    def _init(self, geo: Geometry) -> None:
        commit(self._fd, self.path, 0, geo.data_off)
        self.u8[: geo.data_off] = 0
        h = self.h
        for key, value in (
            (HeaderWord.SIZE, geo.size),
            (HeaderWord.EXTENT, geo.extent),
            (HeaderWord.N_EXT, geo.n_ext),
            (HeaderWord.ROW_EXT_CAP, geo.row_ext_cap),
            (HeaderWord.DIR_LEN, geo.dir_len),
            (HeaderWord.MAX_TABLES, MAX_TABLES),
            (HeaderWord.FREE_OFF, geo.free_off),
            (HeaderWord.TABLES_OFF, geo.tables_off),
            (HeaderWord.ENTRY_BYTES, geo.entry_bytes),
            (HeaderWord.DATA_OFF, geo.data_off),
            (HeaderWord.MAGIC, MAGIC),
            (HeaderWord.VERSION, VERSION),
            (HeaderWord.CREATED, secrets.randbits(62) + 1),
        ):
            h[key] = value
        self._geometry()
        self.extents.reset()
        h[HeaderWord.READY] = 1

    @property
    def forked(self) -> bool:
        """Whether this is a forked child of the process that opened the segment."""
        return self._locks.forked

    def check_process(self) -> None:
        """``BackendError`` in a forked child of the process that opened the segment."""
        self._locks.check_process()

    def current(self) -> bool:
        """Whether ``path`` still names this segment, and its lock files the ones held (a
        process that followed a removed segment while its lock files were still there, then
        removed too, must join the new ones: never two writers on two ``.lock`` files).
        Cheap: three ``stat`` calls and an 8-byte read. A ``BackendError`` in a forked child
        (its copies of the lock descriptors are closed)."""
        self._locks.check_process()
        return path_identity(self.path) == self.identity and self._locks.at_paths()

    def close(self) -> None:
        """Detach; the last user removes the files when ``auto_remove`` is set, and only
        while they are still the ones it opened (never a newer segment of the same name)."""
        if self._closed:
            return
        if self._locks.forked:
            self._closed = True
            return  # a forked child shares our lock files' descriptions: leave them alone
        with self._locks.thread:
            self._closed = True  # threads waiting for the segment now raise SegmentClosed
            with self._locks.held(fcntl.LOCK_EX):
                self.h[HeaderWord.ATTACHED] = max(0, int(self.h[HeaderWord.ATTACHED]) - 1)
                if self.auto_remove and self._locks.only_user():
                    if self.current():
                        self._locks.remove_files()
                    else:
                        log.info("%s: not removing it, it is no longer the one held", self.path)
                # no longer a user from here: a store closing at the same time, next to take
                # the lock, then finds itself the last one and removes the files
                self._locks.leave()
            self._values.clear()
            self._drop_mapping()
            self._locks.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SegmentClosed(self.path)

    def _drop_mapping(self) -> None:
        for view in ("u8", "i64", "i32", "u32", "groups", "h", "extents"):
            self.__dict__.pop(view, None)
        mm = self.__dict__.pop("_mm", None)  # no reference kept: unmapped with its last view
        if mm is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view
                mm.close()
        if hasattr(self, "_fd"):
            os.close(self._fd)

    # -- locking -----------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Shared lock (several readers of any process); repairs a segment left dirty."""
        locks = self._locks
        locks.check_process()
        with locks.thread:
            self._check_open()
            while True:
                locks.shared()
                if not self.h[HeaderWord.DIRTY]:
                    break
                locks.unlock()
                with locks.held(fcntl.LOCK_EX):
                    if self.h[HeaderWord.DIRTY]:
                        self.repair()
            try:
                yield
            finally:
                locks.unlock()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Exclusive lock; the structure is marked dirty until the block ends cleanly."""
        self._locks.check_process()
        with self._locks.thread:
            self._check_open()  # before the flock: a close() this thread waited for shut it
            with self._locks.held(fcntl.LOCK_EX):
                if self.h[HeaderWord.DIRTY]:
                    self.repair()
                self.h[HeaderWord.DIRTY] = 1
                self._touched = []
                try:
                    yield
                except BaseException as exc:
                    if isinstance(exc, HPSError | NoSpace | Untouched):
                        self._clean()  # raised at a consistent point by design
                    raise
                self._clean()

    def touch(self, entry: EntryView) -> None:
        """Flag a table as being changed (call under the write lock, before changing it)."""
        if not entry.meta[EntryWord.DIRTY]:
            entry.meta[EntryWord.DIRTY] = 1
            self._touched.append(entry)

    def _clean(self) -> None:
        for entry in self._touched:
            entry.meta[EntryWord.DIRTY] = 0
        self._touched = []
        self.h[HeaderWord.DIRTY] = 0

    def repair(self) -> None:
        """After a writer died mid-update: clear the tables it was changing, rebuild the
        free extents from the others. Call under the write lock."""
        held = [np.empty(0, dtype=np.int64)]
        for slot in range(self.max_tables):
            entry = EntryView(self, slot)
            if not entry.meta[EntryWord.STATE]:
                continue
            if entry.meta[EntryWord.DIRTY]:
                log.warning("%s: a writer died changing %s; clearing it", self.path, entry.name)
                entry.reset()
            else:
                held.append(entry.extents())
        self.extents.keep_only(np.concatenate(held))
        self.h[HeaderWord.REPAIRS] += 1
        self.h[HeaderWord.DIRTY] = 0

    # -- rows ------------------------------------------------------------------------

    def values(self, fmt: RowFormat, dim: int) -> np.ndarray:
        """The whole segment as stored rows of ``fmt`` and ``dim`` (``fmt.width(dim)``
        elements of ``fmt.dtype``): row r starts at byte ``fmt.row_bytes(dim) * r``."""
        key = (fmt.name, dim)
        view = self._values.get(key)
        if view is None:
            width = fmt.width(dim)
            n = len(self._mm) // fmt.row_bytes(dim)
            view = np.frombuffer(self._mm, dtype=fmt.dtype, count=n * width).reshape(n, width)
            self._values[key] = view
        return view

    def next_tick(self) -> int:
        """The tick a writer stamps the rows it writes with (call under the write lock:
        only writers move the counter, see the module docstring). It is newer than every
        stamp so far, and the counter moves one past it, so that the rows readers stamp
        until the next write (:meth:`tick`) count as used after these were written (uint32:
        see :data:`hps.storage.overflow.TICK_MASK`)."""
        self.h[HeaderWord.TICK] += 2
        return (int(self.h[HeaderWord.TICK]) - 1) & TICK_MASK

    def tick(self) -> int:
        """The tick now: what readers stamp the rows they fetch with (they never write the
        counter), and what rows' ages are measured from."""
        return int(self.h[HeaderWord.TICK]) & TICK_MASK

    def filled(self) -> int:
        """How many fills from L3 processes finished on this segment (``mark_filled``)."""
        return int(self.h[HeaderWord.FILLED])

    def mark_filled(self) -> None:
        """Record a finished fill from L3 (call under the write lock)."""
        self.h[HeaderWord.FILLED] += 1

    # -- table registry ----------------------------------------------------------------

    def find(self, name: str) -> int:
        """The slot of table ``name``, or -1. Call under a lock."""
        for slot in range(self.max_tables):
            entry = EntryView(self, slot)
            if entry.meta[EntryWord.STATE] and entry.name == name:
                return slot
        return -1

    def table_slot(self, spec: TableSpec, rows_per_ext: int) -> int:
        """The entry of table ``spec.name`` (created if new), refused where the segment holds
        its rows in another format or dimension. Call under the write lock."""
        name = spec.name
        slot = self.find(name)
        if slot >= 0:
            entry = EntryView(self, slot)
            if entry.fmt.name != spec.row_dtype or entry.dim != spec.dim:
                raise refused(spec, f"shared memory {self.path}", entry.fmt, entry.dim)
            return slot
        free = next(
            (s for s in range(self.max_tables) if not EntryView(self, s).meta[EntryWord.STATE]),
            -1,
        )
        if free < 0:
            raise BackendError(
                f"{self.path}: all {self.max_tables} table entries are in use (each table "
                "of each model version served, kept or being activated takes one)"
            )
        if len(name.encode()) > NAME_BYTES:
            raise ConfigError(f"table name {name!r} is longer than {NAME_BYTES} bytes")
        EntryView(self, free).claim(name, spec.dim, spec.fmt, rows_per_ext)
        return free

    def drop(self, name: str) -> None:
        """Free table ``name``'s entry and extents (absent: nothing). Call under the write
        lock; other processes' handles of the table must open it again."""
        slot = self.find(name)
        if slot >= 0:
            self.extents.free(EntryView(self, slot).release())
