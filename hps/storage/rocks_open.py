"""How ``rocks_db`` opens a database and its tables: options, read-only views, format records.

- :func:`db_options` and :func:`cf_options`: the database's options, its memory bounded for
  all column families together (one memtable budget, one block cache).
- :func:`read_only_view`: a reader of a database it may not write (a read-only volume, or
  a folder another user's writer owns) opens it through a temporary folder of links, so
  that it writes nothing beside it; a secondary brings the links in line with the folder
  before each catch-up (:func:`sync_view`).
- Each table's row format and dimension are recorded in the database's ``default`` column
  family under ``hps.table/<model>.<table>`` (JSON, :func:`format_record`) when the table is
  created, and read back (:func:`recorded_format`) when it is opened; a table created before
  formats were recorded holds float32 rows. A secondary reads the records of its open tables
  again after each catch-up (:func:`changed_formats`): a table the writer dropped and created
  again in another format is refused from then on (:func:`format_changed`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import cast

import rocksdict as rd

from hps.errors import BackendError
from hps.rowformat import FORMATS, RowFormat
from hps.storage import rocks_rows
from hps.storage.base import LEGACY_FORMAT
from hps.tempdirs import owned_tempdir
from hps.types import TableSpec

META_PREFIX = b"hps.table/"  # + table name, in the default column family: its format


def db_options(
    *, create: bool, num_threads: int, write_buffer_mb: int, secondary: bool = False
) -> rd.Options:
    """Database options: raw bytes; ``create``: create the database if missing;
    ``secondary``: for an instance that follows the writer (``catch_up``)."""
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.create_missing_column_families(create)  # only those open_db is asked to create
    opts.increase_parallelism(num_threads)
    if secondary:
        # A catch-up rebuilds every column family's file list, and RocksDB loads each list's
        # table handlers on max_file_opening_threads threads (16) that it starts and joins
        # per column family, new files or not: 55 ms per catch-up on the demo's 79 column
        # families, 1 ms on the calling thread.
        opts.set_max_file_opening_threads(1)
    # Bound the memtables of all column families together (RocksDB's default is 64 MiB
    # each, twice: gigabytes for a model of many tables, grown slowly by updates) and the
    # WAL, which a secondary re-reads on every catch-up and replays into its memtables.
    opts.set_db_write_buffer_size(write_buffer_mb << 20)
    opts.set_max_total_wal_size(2 * write_buffer_mb << 20)
    # RocksDB renames its info LOG at every open and keeps 1,000 of them by default.
    opts.set_keep_log_file_num(INFO_LOGS_KEPT)
    return opts


INFO_LOGS_KEPT = 5


WriterFiles = frozenset[tuple[str, int, int, int]]


def writer_files(path: str) -> WriterFiles | None:
    """What a secondary instance catches up from, as (name, inode, size, mtime_ns) of the
    database's ``CURRENT``, MANIFEST and WAL (``*.log``) files; None when they cannot be
    read. The writer appends to them (never rewrites in place: WAL recycling is off), so
    equal answers mean it wrote nothing a catch-up would replay."""
    try:
        with os.scandir(path) as entries:
            picked = [
                e
                for e in entries
                if e.name == "CURRENT" or e.name.startswith("MANIFEST-") or e.name.endswith(".log")
            ]
            return frozenset(
                (e.name, (st := e.stat()).st_ino, st.st_size, st.st_mtime_ns) for e in picked
            )
    except OSError:
        return None


def manifest_changed(before: WriterFiles | None, now: WriterFiles | None) -> bool:
    """Whether the writer wrote its MANIFEST (a flush, a compaction, a column family
    created or dropped) between two :func:`writer_files` answers (True when unknown)."""
    if before is None or now is None:
        return True
    return {f for f in before if f[0].startswith("MANIFEST-")} != {
        f for f in now if f[0].startswith("MANIFEST-")
    }


def cf_options(cache: rd.Cache) -> rd.Options:
    """Column-family options: raw bytes, a bloom filter so misses skip the data blocks, and
    the database's one block cache, which holds the index and filter blocks too (RocksDB's
    default is a cache per column family plus uncounted index memory per SST file)."""
    opts = rd.Options(raw_mode=True)
    table = rd.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    return opts


@dataclass
class Opened:
    """A database as :func:`open_db` opened it, and what to remove once it is closed."""

    db: rd.Rdict
    existing: set[str]  # its column families
    secondary_dir: str | None  # a secondary's own folder
    view: str | None  # the read-only view it reads through

    def remove_folders(self) -> None:
        for folder in (self.secondary_dir, self.view):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def open_db(
    path: str, opts: rd.Options, cache: rd.Cache, mode: str, create: Collection[str] = ()
) -> Opened:
    """Open the database at ``path`` in ``mode`` (``read_write``, ``read_only`` or
    ``secondary``) with every column family it has, and ``create`` (``read_write``: column
    families it creates, all in this one open); BackendError when it cannot be."""
    check_folder(path)
    held = os.path.exists(os.path.join(path, "CURRENT"))  # an empty folder holds none yet
    if mode != "read_write" and not held:
        where = (
            "" if os.path.isabs(path) else f" (relative to the current directory, {os.getcwd()})"
        )
        raise BackendError(
            f"rocks_db: no database at {path!r}{where} to open {mode}; run hps import"
        )
    access = rd.AccessType.read_write()
    secondary_dir = None
    if mode == "read_only":
        access = rd.AccessType.read_only(error_if_log_file_exist=False)  # a WAL: replayed
    elif mode == "secondary":
        secondary_dir = str(owned_tempdir("hps-rocks-secondary-"))
        access = rd.AccessType.secondary(secondary_dir)
    view = None
    if mode != "read_write" and not may_write(path):
        view = read_only_view(path)
    opened = Opened(cast(rd.Rdict, None), set(), secondary_dir, view)
    try:
        existing = rd.Rdict.list_cf(path, opts) if held else ["default"]
        existing += [cf for cf in create if cf not in existing]
        opened.db = rd.Rdict(
            view or path,
            opts,
            column_families={cf: cf_options(cache) for cf in existing},
            access_type=access,
        )
    except Exception as exc:
        opened.remove_folders()
        why = _explained(path, mode, str(exc))
        raise BackendError(f"rocks_db: cannot open {path!r} ({mode}): {why}") from exc
    opened.existing = set(existing)
    return opened


def check_folder(path: str) -> None:
    """BackendError when ``path`` exists but is not a folder this user may list and read (a
    missing one is for the caller: no database yet, or one a writer makes)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise BackendError(f"rocks_db: {path!r} is not a folder: a part of it is a file") from None
    except PermissionError:
        raise BackendError(
            f"rocks_db: {path!r}: permission denied (reading {path} as uid {os.getuid()})"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise BackendError(f"rocks_db: {path!r} is not a folder (persistent_db.path names L3's)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise BackendError(
            f"rocks_db: {path!r}: permission denied (reading {path} as uid {os.getuid()}, "
            f"the folder owned by uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})"
        )


def _explained(path: str, mode: str, error: str) -> str:
    """RocksDB's error ``error`` with what it leaves out: the process holding the LOCK, the
    file this user may not open."""
    if "lock" in error.lower() and ("unavailable" in error or "os error 11" in error):
        pid = lock_holder(os.path.join(path, "LOCK"))
        who = f"process {pid}" if pid else "another process"
        return (
            f"the L3 is held by another writer ({who}: an hps serve, hps consume or hps "
            f"import of this persistent_db.path); stop it or wait for it to finish ({error})"
        )
    if "Permission denied" in error or "os error 13" in error:
        want = os.R_OK if mode != "read_write" else os.R_OK | os.W_OK
        for name in sorted(os.listdir(path)):
            file = os.path.join(path, name)
            if name != "LOCK" and not os.access(file, want):
                owner = os.stat(file).st_uid
                access = "reading" if mode != "read_write" else "writing"
                return (
                    f"permission denied ({access} {file}, owned by uid {owner}, as uid "
                    f"{os.getuid()}) ({error})"
                )
        if mode == "read_write" and not os.access(path, os.W_OK):
            return f"permission denied (writing {path} as uid {os.getuid()}) ({error})"
    return error


def lock_holder(lock: str) -> int | None:
    """The PID of the process holding RocksDB's ``LOCK`` file (fcntl F_GETLK), or ``None``."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    layout = "hhqqi"  # struct flock: l_type, l_whence, l_start, l_len, l_pid
    try:
        asked = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(32)
        got = fcntl.fcntl(fd, fcntl.F_GETLK, asked)
        kind, _, _, _, pid = struct.unpack_from(layout, got)
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    return int(pid) if kind != fcntl.F_UNLCK and pid > 0 else None


def may_write(path: str) -> bool:
    """Whether this process may write the database's folder (else: :func:`read_only_view`)."""
    return os.access(path, os.W_OK)


def read_only_view(path: str) -> str:
    """A temporary folder of symbolic links to the files of the database at ``path``.

    rocksdict writes its ``rocksdict-config.json`` beside every database it opens, read-only
    too: a reader of a folder it may not write (a read-only volume) opens this view instead
    (RocksDB reads through the links; the config is a copy rocksdict may rewrite). The
    links are those of the moment it opens; a secondary that follows a writer calls
    :func:`sync_view` before each catch-up.
    """
    view = str(owned_tempdir("hps-rocks-view-"))
    for name in os.listdir(path):
        src = os.path.join(path, name)
        if name == "rocksdict-config.json":
            shutil.copyfile(src, os.path.join(view, name))
        elif name != "LOCK":
            os.symlink(src, os.path.join(view, name))
    return view


def sync_view(path: str, view: str) -> None:
    """Bring the view's links in line with the database's folder: a link for each file the
    writer made since (a new WAL, MANIFEST or SST file; ``CURRENT`` is a link by name, so
    the writer's rename of it shows through), none for a file it deleted."""
    names = set(os.listdir(path)) - {"LOCK", "rocksdict-config.json"}
    with os.scandir(view) as entries:
        links = {e.name for e in entries if e.is_symlink()}
    for name in links - names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(view, name))
    for name in names - links:
        with contextlib.suppress(FileExistsError):
            os.symlink(os.path.join(path, name), os.path.join(view, name))


def meta_key(table: str) -> bytes:
    """The key of the table's format record in the ``default`` column family."""
    return META_PREFIX + table.encode()


def format_record(spec: TableSpec) -> bytes:
    """The table's format record: its row format and dimension."""
    return json.dumps({"row_dtype": spec.row_dtype, "dim": spec.dim}).encode()


def recorded_format(db: rd.Rdict, spec: TableSpec, exists: bool) -> tuple[RowFormat, int] | None:
    """The format and dimension the database holds the table's rows in (None: a new
    table; ``exists``: whether its column family does). A table without a record is one
    written before formats were recorded: float32 rows, whose dimension a stored row tells
    (if any)."""
    try:
        raw = db.get(meta_key(spec.name))
        if raw is not None:
            return _parsed(cast("bytes", raw))
        if not exists:
            return None
        first = next(iter(db.get_column_family(spec.name).values()), None)
    except Exception as exc:
        raise BackendError(f"rocks_db: cannot read the format of {spec.name}: {exc}") from exc
    if first is None:
        return None  # created but empty: nothing to refuse
    length = len(cast("bytes", first))
    row = LEGACY_FORMAT.row_bytes(spec.dim)
    if length in (row, row + rocks_rows.VERSION_BYTES):  # format 1 or 2 of this dim
        return LEGACY_FORMAT, spec.dim
    return LEGACY_FORMAT, (length - rocks_rows.VERSION_BYTES) // 4  # format 2 of another


def _parsed(raw: bytes) -> tuple[RowFormat, int]:
    """The format and dimension a format record holds (raises on one it cannot read)."""
    doc = json.loads(raw)
    return FORMATS[doc["row_dtype"]], int(doc["dim"])


def changed_formats(db: rd.Rdict, specs: Iterable[TableSpec]) -> dict[str, str]:
    """The tables among ``specs`` whose format record the database now holds with another
    format or dimension than their spec's (one MultiGet), each with what it records, in
    words ("int8 rows of dimension 8"; a record this release cannot read is one too). A
    table without a record is not among them (dropped and not created again, or not
    created yet: it reads as empty), nor one whose record is the spec's."""
    wanted = list(specs)
    if not wanted:
        return {}
    try:
        raws = cast("list[bytes | None]", db.get([meta_key(s.name) for s in wanted]))
    except Exception as exc:
        raise BackendError(f"rocks_db: cannot read the tables' format records: {exc}") from exc
    changed: dict[str, str] = {}
    for spec, raw in zip(wanted, raws, strict=True):
        if raw is None or raw == format_record(spec):
            continue
        try:
            fmt, dim = _parsed(raw)
        except (ValueError, KeyError, TypeError) as exc:  # written by another release?
            changed[spec.name] = f"a record it cannot read ({type(exc).__name__}: {exc})"
            continue
        if fmt is not spec.fmt or dim != spec.dim:
            changed[spec.name] = f"{fmt.name} rows of dimension {dim}"
    return changed


def format_changed(path: str, what: str, spec: TableSpec, held: str) -> BackendError:
    """The error of a call on a table that this process opened as ``spec`` and the database
    now records as ``held`` (:func:`changed_formats`)."""
    return BackendError(
        f"rocks_db {path}: {what} refused: this process opened table {spec.name} as "
        f"{spec.row_dtype} rows of dimension {spec.dim}, but the database now records it as "
        f"{held} (the table was dropped and created again since, e.g. by `hps import "
        "--force`); reload this process (`hps reload` for a served model, a restart for "
        "others)"
    )
