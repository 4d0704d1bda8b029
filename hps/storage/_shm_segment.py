"""The shared-memory segment of ``multi_process_hash_map``: layout, extents, locks, lifecycle.

One file under ``/dev/shm`` (POSIX shared memory, as ``shm_open`` names it) holds the whole
L2 of a node; every process maps it. Layout, in bytes::

    [0, 4096)              header: int64 words, see ``H``
    [FREE_OFF, ...)        free-extent stack: int32 extent ids
    [TABLES_OFF, ...)      MAX_TABLES table entries of ENTRY_BYTES each (see ``EntryView``)
    [DATA_OFF, SIZE)       N_EXT extents of EXTENT bytes: index buckets and row extents

Two lock files sit next to the segment. ``<name>.lock`` is the readers-writer lock
(``flock`` LOCK_SH to read, LOCK_EX to write); the kernel drops it when a holder dies.
``<name>.users`` is held LOCK_SH by every attached store for its lifetime: whoever can turn
it into LOCK_EX on close is the last user (crashed processes do not count) and removes the
files when ``shared_memory_auto_remove`` is set. Plain files are used rather than
``multiprocessing.shared_memory`` so that no resource tracker ever unlinks the segment.

Writers set ``DIRTY`` while they change the structure. A writer killed half-way leaves it
set; the next process to take the lock wipes all rows (L2 is a cache: lookups fall back to
L3) and keeps the table registry, so other processes' handles stay valid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from hps.errors import BackendError, ConfigError, HPSError

log = logging.getLogger(__name__)

MAGIC = 0x31504D5348535048  # b"HPSHSMP1", little-endian
VERSION = 1
PAGE = 4096
MIN_EXTENT = 64 * 1024
MAX_EXTENT = 16 * 1024 * 1024
MAX_TABLES = 64
ENTRY_META = 192  # bytes of int64 fields and the name at the start of a table entry
NAME_BYTES = 128
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class H(IntEnum):
    """Header words (int64)."""

    MAGIC = 0
    VERSION = 1
    SIZE = 2
    EXTENT = 3
    N_EXT = 4
    ROW_EXT_CAP = 5
    DIR_LEN = 6
    MAX_TABLES = 7
    FREE_OFF = 8
    TABLES_OFF = 9
    ENTRY_BYTES = 10
    DATA_OFF = 11
    READY = 12
    DIRTY = 13
    ATTACHED = 14
    TICK = 15
    FREE_TOP = 16
    COMMITTED = 17  # extents [0, COMMITTED) are backed by fallocate'd pages
    WIPES = 18


class E(IntEnum):
    """Table entry words (int64); the name's bytes follow at byte 64."""

    STATE = 0  # 0 free, 1 in use
    DIM = 1
    ROWS = 2
    ROWS_PER_EXT = 3
    N_ROW_EXT = 4
    N_BUCKETS = 5
    NAME_LEN = 6


class NoSpace(Exception):
    """No free extent (internal: the store evicts and retries, or raises BackendError)."""


@dataclass(frozen=True)
class Geometry:
    size: int
    extent: int
    n_ext: int
    row_ext_cap: int
    dir_len: int
    free_off: int
    tables_off: int
    entry_bytes: int
    data_off: int


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def plan(size: int, allocation_rate: int) -> Geometry:
    """Lay out a segment of ``size`` bytes: ~1024 extents of 64 KiB .. 16 MiB each."""
    cap = max(MIN_EXTENT, min(MAX_EXTENT, _pow2_floor(allocation_rate)))
    extent = min(cap, max(MIN_EXTENT, _pow2_floor(size // 1024)))
    n0 = size // extent
    dir_len = max(64, 4 << (max(1, n0) - 1).bit_length())
    entry = _round_up(ENTRY_META + 4 * n0 + 4 * dir_len, 64)
    tables_off = _round_up(PAGE + 4 * n0, 64)
    data_off = _round_up(tables_off + MAX_TABLES * entry, PAGE)
    n_ext = (size - data_off) // extent if size > data_off else 0
    if n_ext < 4:
        raise ConfigError(
            f"volatile_db.shared_memory_size: {size} bytes is too small for the shared hash "
            f"map; need at least {data_off + 4 * extent} bytes"
        )
    return Geometry(size, extent, n_ext, n0, dir_len, PAGE, tables_off, entry, data_off)


def default_directory() -> str:
    """Where POSIX shared memory lives (``/dev/shm``), or the temp dir where there is none."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class EntryView:
    """Numpy views of one table entry: int64 fields, row-extent list, bucket directory."""

    def __init__(self, seg: Segment, slot: int) -> None:
        off = seg.tables_off + slot * seg.entry_bytes
        self.slot = slot
        self.meta = seg.i64[off // 8 : off // 8 + len(E)]
        r0 = (off + ENTRY_META) // 4
        self.row_ext = seg.i32[r0 : r0 + seg.row_ext_cap]
        self.dir = seg.i32[r0 + seg.row_ext_cap : r0 + seg.row_ext_cap + seg.dir_len]
        self._name = seg.u8[off + 64 : off + 64 + NAME_BYTES]

    @property
    def name(self) -> str:
        return bytes(self._name[: int(self.meta[E.NAME_LEN])]).decode()

    def claim(self, name: str, dim: int, rows_per_ext: int) -> None:
        raw = name.encode()
        self._name[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.meta[:] = 0
        self.meta[E.NAME_LEN] = len(raw)
        self.meta[E.DIM] = dim
        self.meta[E.ROWS_PER_EXT] = rows_per_ext
        self.dir[:] = -1
        self.meta[E.STATE] = 1

    def reset(self) -> None:
        """Forget every row (the extents themselves are returned by the caller)."""
        self.meta[E.ROWS] = 0
        self.meta[E.N_ROW_EXT] = 0
        self.meta[E.N_BUCKETS] = 0
        self.dir[:] = -1


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
    ) -> None:
        name = name.lstrip("/")
        if not NAME_RE.match(name) or name.startswith("."):
            raise ConfigError(
                f"volatile_db.shared_memory_name: {name!r} must match {NAME_RE.pattern}"
            )
        self.name = name
        self.auto_remove = auto_remove
        base = directory or default_directory()
        self.path = os.path.join(base, name)
        self._paths = (self.path, self.path + ".lock", self.path + ".users")
        self._geo = plan(size, allocation_rate)
        self._tlock = threading.Lock()
        self._closed = False
        self._users = self._join()
        self._lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with self._flock(fcntl.LOCK_EX):
                self._map(size)
                if self._only_user():
                    self.h[H.ATTACHED] = 0  # counts left behind by crashed processes
                self.h[H.ATTACHED] += 1
        except BaseException:
            os.close(self._lock)
            os.close(self._users)
            raise
        self._values: dict[int, np.ndarray] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def _join(self) -> int:
        """Hold ``<name>.users`` LOCK_SH, on the file that is at the path right now."""
        users = self._paths[2]
        while True:
            fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(users).st_ino == os.fstat(fd).st_ino:
                    return fd
            os.close(fd)  # the last user removed it meanwhile: join the next one

    def _only_user(self) -> bool:
        """True if no other store is attached. Call with the main lock held exclusively."""
        try:
            fcntl.flock(self._users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        # A failed conversion may have dropped our shared lock: take it again. Nobody holds
        # LOCK_EX meanwhile (that needs the main lock, which we hold).
        fcntl.flock(self._users, fcntl.LOCK_SH)
        return alone

    def _map(self, size: int) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            existing = os.fstat(fd).st_size
            if existing == 0:
                os.ftruncate(fd, size)
            elif existing != size:
                log.warning(
                    "shared memory %s exists with %d bytes (configured %d): using it as is",
                    self.path, existing, size,
                )
            self._fd = fd
            self._mm = mmap.mmap(fd, existing or size)
        except OSError as exc:
            os.close(fd)
            raise BackendError(f"multi_process_hash_map: cannot map {self.path}: {exc}") from exc
        self._views()
        if existing == 0 or self.h[H.READY] != 1:
            if existing and self.h[H.MAGIC] not in (0, MAGIC):
                raise BackendError(f"{self.path} is not an HPS shared hash map; remove it")
            geo = self._geo if existing == 0 else plan(existing, self._geo.extent)
            try:
                self._init(geo)
            except NoSpace as exc:
                raise BackendError(f"multi_process_hash_map: {self.path}: {exc}") from None
        elif self.h[H.MAGIC] != MAGIC or self.h[H.VERSION] != VERSION:
            raise BackendError(
                f"{self.path} has layout version {int(self.h[H.VERSION])}, this HPS writes "
                f"{VERSION}: stop its users and remove it"
            )
        self._geometry()

    def _views(self) -> None:
        mm = self._mm
        self.u8 = np.frombuffer(mm, dtype=np.uint8)
        self.i64 = np.frombuffer(mm, dtype=np.int64, count=len(mm) // 8)
        self.i32 = np.frombuffer(mm, dtype=np.int32, count=len(mm) // 4)
        self.u32 = np.frombuffer(mm, dtype=np.uint32, count=len(mm) // 4)
        self.groups = self.i64[: len(mm) // 64 * 8].reshape(-1, 8)  # 64-byte key groups
        self.h = self.i64[: len(H)]

    def _geometry(self) -> None:
        h = self.h
        self.size, self.extent, self.n_ext = int(h[H.SIZE]), int(h[H.EXTENT]), int(h[H.N_EXT])
        self.row_ext_cap, self.dir_len = int(h[H.ROW_EXT_CAP]), int(h[H.DIR_LEN])
        self.tables_off, self.entry_bytes = int(h[H.TABLES_OFF]), int(h[H.ENTRY_BYTES])
        self.data_off = int(h[H.DATA_OFF])
        f0 = int(h[H.FREE_OFF]) // 4
        self.free_stack = self.i32[f0 : f0 + self.n_ext]

    def _init(self, geo: Geometry) -> None:
        self._commit(0, geo.data_off)
        self.u8[: geo.data_off] = 0
        h = self.h
        for key, value in (
            (H.SIZE, geo.size), (H.EXTENT, geo.extent), (H.N_EXT, geo.n_ext),
            (H.ROW_EXT_CAP, geo.row_ext_cap), (H.DIR_LEN, geo.dir_len),
            (H.MAX_TABLES, MAX_TABLES), (H.FREE_OFF, geo.free_off),
            (H.TABLES_OFF, geo.tables_off), (H.ENTRY_BYTES, geo.entry_bytes),
            (H.DATA_OFF, geo.data_off), (H.MAGIC, MAGIC), (H.VERSION, VERSION),
        ):
            h[key] = value
        self._geometry()
        self._reset_extents()
        h[H.READY] = 1

    def _reset_extents(self) -> None:
        self.free_stack[:] = np.arange(self.n_ext - 1, -1, -1, dtype=np.int32)
        self.h[H.FREE_TOP] = self.n_ext

    def _commit(self, offset: int, length: int) -> None:
        """Back these bytes with memory now, so a full /dev/shm fails here, not with SIGBUS."""
        try:
            os.posix_fallocate(self._fd, offset, length)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise BackendError(f"multi_process_hash_map: {self.path}: {exc}") from exc
            raise NoSpace(f"{os.path.dirname(self.path)} is full") from exc

    def close(self) -> None:
        """Detach; the last user removes the files when ``auto_remove`` is set."""
        if self._closed:
            return
        self._closed = True
        with self._tlock:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            try:
                self.h[H.ATTACHED] = max(0, int(self.h[H.ATTACHED]) - 1)
                if self.auto_remove and self._only_user():
                    for path in self._paths:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._values.clear()
        del self.u8, self.i64, self.i32, self.u32, self.groups, self.h, self.free_stack
        with contextlib.suppress(BufferError):  # a caller still holds a view: GC unmaps
            self._mm.close()
        for fd in (self._fd, self._lock, self._users):
            os.close(fd)

    # -- locking -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self, op: int) -> Iterator[None]:
        fcntl.flock(self._lock, op)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Shared lock (several readers of any process); repairs a segment left dirty."""
        with self._tlock:
            while True:
                fcntl.flock(self._lock, fcntl.LOCK_SH)
                if not self.h[H.DIRTY]:
                    break
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                with self._flock(fcntl.LOCK_EX):
                    if self.h[H.DIRTY]:
                        self.wipe()
            try:
                yield
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Exclusive lock; the structure is marked dirty until the block ends cleanly."""
        with self._tlock, self._flock(fcntl.LOCK_EX):
            if self.h[H.DIRTY]:
                self.wipe()
            self.h[H.DIRTY] = 1
            try:
                yield
            except BaseException as exc:
                if isinstance(exc, HPSError | NoSpace):
                    self.h[H.DIRTY] = 0  # raised at a consistent point by design
                raise
            self.h[H.DIRTY] = 0

    def wipe(self) -> None:
        """Drop every row of every table, keep the registry. Call under the write lock."""
        log.warning("%s: a writer died mid-update; clearing the shared L2", self.path)
        for slot in range(MAX_TABLES):
            entry = EntryView(self, slot)
            if entry.meta[E.STATE]:
                entry.reset()
        self._reset_extents()
        self.h[H.WIPES] += 1
        self.h[H.DIRTY] = 0

    # -- extents -----------------------------------------------------------------------

    def alloc(self, n: int) -> np.ndarray:
        """Take ``n`` free extents (int64 ids); raises :class:`NoSpace`."""
        top = int(self.h[H.FREE_TOP])
        if n > top:
            raise NoSpace(f"{n} extents wanted, {top} free")
        ids = self.free_stack[top - n : top][::-1].astype(np.int64)
        if n and ids.max() >= self.h[H.COMMITTED]:
            lo = int(self.h[H.COMMITTED])
            self._commit(self.data_off + lo * self.extent, (int(ids.max()) + 1 - lo) * self.extent)
            self.h[H.COMMITTED] = ids.max() + 1
        self.h[H.FREE_TOP] = top - n
        return ids

    def free(self, ids: np.ndarray) -> None:
        top = int(self.h[H.FREE_TOP])
        self.free_stack[top : top + ids.size] = ids
        self.h[H.FREE_TOP] = top + ids.size

    @property
    def free_extents(self) -> int:
        return int(self.h[H.FREE_TOP])

    def offset(self, ext: np.ndarray | int) -> np.ndarray | int:
        return self.data_off + ext * self.extent

    def values(self, dim: int) -> np.ndarray:
        """The whole segment as float32 rows of ``dim``: row r starts at byte ``4 * dim * r``."""
        view = self._values.get(dim)
        if view is None:
            n = len(self._mm) // (4 * dim)
            view = np.frombuffer(self._mm, dtype=np.float32, count=n * dim).reshape(n, dim)
            self._values[dim] = view
        return view

    def next_tick(self) -> int:
        self.h[H.TICK] += 1
        return int(self.h[H.TICK]) & 0xFFFFFFFF

    # -- table registry ----------------------------------------------------------------

    def table_slot(self, name: str, dim: int, rows_per_ext: int) -> int:
        """The entry of table ``name`` (created if new). Call under the write lock."""
        free = -1
        for slot in range(MAX_TABLES):
            entry = EntryView(self, slot)
            if not entry.meta[E.STATE]:
                free = slot if free < 0 else free
            elif entry.name == name:
                if int(entry.meta[E.DIM]) != dim:
                    raise ConfigError(
                        f"table {name} has dimension {int(entry.meta[E.DIM])} in shared memory "
                        f"{self.path}, but this process configures {dim}"
                    )
                return slot
        if free < 0:
            raise BackendError(f"{self.path}: all {MAX_TABLES} table entries are in use")
        if len(name.encode()) > NAME_BYTES:
            raise ConfigError(f"table name {name!r} is longer than {NAME_BYTES} bytes")
        EntryView(self, free).claim(name, dim, rows_per_ext)
        return free
