"""``rocks_db``: the persistent L3 (rocksdict), one column family per ``<model>.<table>``.

Keys are the 8 little-endian bytes of the int64 key, values the stored row's raw bytes (the
table's row format, :mod:`hps.rowformat`) followed by the row's update version
(:mod:`hps.storage.rocks_rows`: format 2; rows of format 1, without the version, are still
read). Each table's row format and dimension are recorded in the database
(:mod:`hps.storage.rocks_open`) and checked when it is opened: a table stored with another
format or dimension is refused (a ``ConfigError``).

Reads are MultiGet, writes one WriteBatch per chunk of ``max_batch_size``.

Damaged data (a block whose checksum does not match) fails only the keys stored in it
(:mod:`hps.storage.rocks_damage`): :meth:`RocksDBStore.fetch` raises
:class:`hps.errors.DamagedRowsError` carrying the rows of every other key; a version read
treats a damaged row as one without a version, so the next update of the key rewrites it.
Scans (``dump``, ``size``) raise where a damaged block stopped them, and
:meth:`RocksDBStore.verify` reads a whole column family with checksums verified (``hps
verify``).
``versioned_rows``: :meth:`RocksDBStore.insert_versioned` and
:meth:`RocksDBStore.fetch_versions` let the Kafka applier write a row and its version in one
put, and read the versions back.

Several processes may share one database: at most one opens it read-write; the others open it
``read_only`` (a snapshot at open time) or as a ``secondary`` instance, which follows the
writer through :meth:`RocksDBStore.catch_up` (Triton runs each model instance in its own
process), and opens again when a column family it holds is dropped or one it declared is
created. Dropping a version 1 table empties its column family in place rather than dropping
it (:meth:`RocksDBStore.drop_table`: its name comes back). A secondary reads the format
records of its open tables again after each catch-up that replayed something: a table the
writer dropped and created again in another format or dimension (``hps import --force``)
has its reads refused from then on (a ``BackendError`` saying to reload the process), where
they would decode the new rows in the old format (float16 and int8 rows of dim 8 are the
same size). A ``read_only`` store reads a snapshot: records and rows of one moment. A reader
writes nothing beside a database it may not write (a read-only volume): it opens it through
a temporary view of links (:func:`hps.storage.rocks_open.read_only_view`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np
import rocksdict as rd

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.dedup import in_stored_order, stored_order
from hps.errors import BackendError
from hps.io.chunks import rows_per_chunk
from hps.rowformat import RowFormat, Stored
from hps.storage import rocks_rows
from hps.storage.base import AccessMode, EmbeddingStore, check_rows, refused
from hps.storage.keybytes import key_bytes
from hps.storage.rocks_damage import (
    DamagedKeys,
    RdictKey,
    check_scan,
    damaged_rows_error,
    multiget,
    verify_cf,
)
from hps.storage.rocks_open import (
    WriterFiles,
    cf_options,
    changed_formats,
    db_options,
    format_changed,
    format_record,
    manifest_changed,
    meta_key,
    open_db,
    recorded_format,
    sync_view,
    writer_files,
)
from hps.types import Keys, Mask, TableSpec
from hps.validate import table_or_raise

PAST_EVERY_KEY = b"\xff" * 9  # above every row key (8 bytes): the end of a whole-table range

log = logging.getLogger(__name__)

ENTRY_OVERHEAD = 16  # bytes of SST index/metadata per entry
SPACE_AMP = 1.1  # leveled compaction's space amplification


class RocksDBStore(EmbeddingStore):
    """Persistent L3 over rocksdict, batch in, batch out."""

    name = "rocks_db"
    placement = "disk"
    durable = True
    exact_size = False
    versioned_rows = True

    def __init__(
        self,
        path: str,
        *,
        mode: AccessMode = "read_write",
        num_threads: int = 16,
        max_batch_size: int = 65536,
        write_buffer_mb: int = 64,
        block_cache_mb: int = 64,
    ) -> None:
        self.path = path
        self.mode = mode
        self.max_batch_size = max_batch_size
        self._specs: dict[str, TableSpec] = {}
        self._cfs: dict[str, rd.Rdict] = {}
        # secondary: open tables the writer has since recorded in another format (catch_up)
        self._changed: dict[str, str] = {}
        opts = db_options(
            create=mode == "read_write",
            num_threads=num_threads,
            write_buffer_mb=write_buffer_mb,
            secondary=mode == "secondary",
        )
        self._cache = rd.Cache(block_cache_mb << 20)
        self._opts = opts
        self._opened = open_db(path, opts, self._cache, mode)
        self._db = self._opened.db
        self._existing = self._opened.existing
        self._caught_up_to: WriterFiles | None = None
        self.catch_ups = 0  # catch-ups that ran (secondary)
        self.reopens = 0  # times a catch-up opened it again (secondary: see _reopen)
        self._damaged = DamagedKeys()
        self._sync = rd.WriteOptions()
        self._sync.sync = True

    @classmethod
    def from_config(
        cls, cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
    ) -> RocksDBStore:
        assert isinstance(cfg, PersistentDBConfig)
        return cls(
            cfg.path,
            mode="read_only" if cfg.read_only and mode == "read_write" else mode,
            num_threads=cfg.num_threads,
            max_batch_size=cfg.max_batch_size,
            write_buffer_mb=cfg.hps_write_buffer_mb,
            block_cache_mb=cfg.hps_block_cache_mb,
        )

    def open_table(self, spec: TableSpec) -> None:
        """Declare a table (created if new and writable); a table stored with another format
        or dimension is a ConfigError."""
        if (
            spec.name in self._cfs
            and self._specs.get(spec.name) == spec
            and spec.name not in self._changed
        ):
            return
        stored = recorded_format(self._db, spec, spec.name in self._existing)
        if stored is not None and (stored[0] is not spec.fmt or stored[1] != spec.dim):
            raise refused(spec, f"rocks_db {self.path}", *stored)
        try:
            if spec.name in self._existing:
                cf = self._db.get_column_family(spec.name)
            elif self.mode == "read_write":
                cf = self._db.create_column_family(spec.name, cf_options(self._cache))
                self._existing.add(spec.name)
            else:
                cf = None  # a reader opened before the writer created it
            if stored is None and self.mode == "read_write":
                self._db.put(meta_key(spec.name), format_record(spec), self._sync)
        except Exception as exc:
            raise BackendError(f"rocks_db: cannot open table {spec.name}: {exc}") from exc
        self._specs[spec.name] = spec
        self._changed.pop(spec.name, None)  # opened as the database records it now
        if cf is not None:
            self._cfs[spec.name] = cf

    def open_tables(self, specs: Sequence[TableSpec]) -> None:
        new = [s.name for s in specs if s.name not in self._existing]
        if self.mode == "read_write" and len(new) > 1 and not self._cfs:
            self._create_together(new)
        super().open_tables(specs)

    def _create_together(self, names: list[str]) -> None:
        """Create column families in one open of the database: created one at a time, each
        writes and syncs the MANIFEST and a new OPTIONS file (300 tables: 9 s; together:
        0.9 s). Only before a table is declared, so nothing holds a handle into the
        instance this one replaces."""
        self._db.close()
        try:
            self._opened = open_db(self.path, self._opts, self._cache, self.mode, create=names)
        except BackendError:
            self._opened = open_db(self.path, self._opts, self._cache, self.mode)
            raise
        finally:
            self._db, self._existing = self._opened.db, self._opened.existing

    def stored_format(self, spec: TableSpec) -> tuple[RowFormat, int] | None:
        """The table's format record (:func:`hps.storage.rocks_open.recorded_format`)."""
        return recorded_format(self._db, spec, spec.name in self._existing)

    def drop_table(self, table: str) -> None:
        """Delete the table's rows and its recorded format (read_write only).

        A later version's table (``<model>.<table>@<n>``, a number never used again) has
        its column family dropped. A version 1 table's name comes back (``hps import
        --force``, a model removed and added again), and a secondary opened on a database
        that dropped a column family and created one of the same name crashes in a later
        catch-up (a segmentation fault, rocksdict 0.3.29): its column family is emptied
        instead, by one range tombstone, and compacted at once so that its files go (about
        a second per 2 million rows), and kept.

        A version 1 table is read whole with checksums verified first (about as long as the
        compaction): a damaged one (a block whose checksum fails) cannot be compacted away
        (the compaction would fail and leave the database refusing writes), so its column
        family is dropped and created again, empty, and its damaged files go (a secondary
        following the database is then to be reloaded: ``hps reload``)."""
        if self.mode != "read_write":
            raise BackendError(f"rocks_db: {self.path} is open {self.mode}; cannot drop {table}")
        try:
            if table in self._existing:
                cf = self._cfs.pop(table, None) or self._db.get_column_family(table)
                if TableSpec.parse_name(table)[2] > 1:
                    self._db.drop_column_family(table)
                    self._existing.discard(table)
                elif (why := self._damage_of(table, cf)) is not None:
                    log.warning("rocks_db: %s is damaged (%s): its column family is dropped "
                                "and created again", table, why)  # fmt: skip
                    self._recreate(table)
                else:
                    cf.delete_range(b"", PAST_EVERY_KEY, self._sync)
                    cf.compact_range(None, None)
            self._db.delete(meta_key(table), self._sync)
        except Exception as exc:
            raise BackendError(f"rocks_db: cannot drop {table}: {exc}") from exc
        self._specs.pop(table, None)
        self._damaged.drop(table)

    def _damage_of(self, table: str, cf: rd.Rdict) -> str | None:
        """The damage of a table about to be dropped (None: intact): keys a read found
        damaged, else a read of the whole column family with checksums verified (a
        compaction that met a damaged block would leave the database refusing writes)."""
        if self._damaged.known(table):
            return self._damaged.why(table)
        return verify_cf(cf, None)[1]

    def _recreate(self, table: str) -> None:
        """Drop the column family ``table`` and create it again, empty (its files go)."""
        self._db.drop_column_family(table)
        self._existing.discard(table)
        self._db.create_column_family(table, cf_options(self._cache))
        self._existing.add(table)

    def _cf(self, table: str) -> rd.Rdict | None:
        table_or_raise(self._specs, table)
        return self._cfs.get(table)  # None: a reader opened before the writer created it

    @classmethod
    def bytes_per_row(cls, row_bytes: int, *, bounded: bool = False) -> float:
        """Disk per row: key, value and per-entry SST overhead, times space amplification."""
        return (8 + row_bytes + rocks_rows.VERSION_BYTES + ENTRY_OVERHEAD) * SPACE_AMP

    @property
    def writable(self) -> bool:
        return self.mode == "read_write"

    def catch_up(self) -> None:
        """Secondary instances: replay what the writer has written since; nothing when the
        writer's MANIFEST and WAL files are as they were at the last catch-up (a catch-up
        revisits every column family, about 1 ms on the demo's 79, even with nothing new).

        One that reads through a view of links (:func:`hps.storage.rocks_open.read_only_view`)
        first brings the links in line with the folder (the writer's new WAL, MANIFEST and
        SST files). When the MANIFEST changed, the column families are listed: one this
        instance holds that the writer dropped (a model version retired) has it opened
        again, without it, so that the dropped table's deleted files are not held open (their
        disk space pinned) until the process ends. Then it reads the format record of every
        open table (one MultiGet): a table the writer dropped and created again in another
        format or dimension has its reads refused until it is opened again as recorded
        (:func:`hps.storage.rocks_open.changed_formats`)."""
        if self.mode != "secondary":
            return
        files = writer_files(self.path)
        if files is not None and files == self._caught_up_to:
            return
        if self._opened.view is not None:
            try:
                sync_view(self.path, self._opened.view)
            except OSError as exc:
                raise BackendError(f"rocks_db: cannot follow {self.path!r}: {exc}") from exc
        try:
            self._db.try_catch_up_with_primary()
        except Exception as exc:  # noqa: BLE001 - rocksdict raises a bare Exception
            self._reopen(f"a catch-up failed: {exc}")
        else:
            if manifest_changed(self._caught_up_to, files):
                self._follow_tables()
        self._changed = changed_formats(self._db, self._specs.values())
        self._caught_up_to = files  # as they were before it: a later write changes them
        self.catch_ups += 1
        self._damaged.clear()  # the writer may have rewritten them: read them again

    def _follow_tables(self) -> None:
        """Open this secondary again when a column family it holds is gone (dropped by the
        writer: RocksDB keeps a dropped column family's files open in every instance that
        holds its handle), or a declared table's was created after this instance opened
        (a handle to it is only had by opening again; its reads found nothing till then)."""
        try:
            listed = set(rd.Rdict.list_cf(self.path, self._opts))
        except Exception:  # noqa: BLE001 - unreadable just now: the next catch-up looks again
            return
        gone = self._existing - listed
        created = {t for t in self._specs if t not in self._cfs and t in listed}
        if gone or created:
            what = [f"{verb} {', '.join(sorted(ts))}" for verb, ts in
                    (("dropped", gone), ("created", created)) if ts]  # fmt: skip
            self._reopen(f"the writer {'; '.join(what)}")

    def _reopen(self, why: str) -> None:
        """Open this secondary again, reading the writer's state as it is now.

        A secondary cannot replay the drop of a column family it never saw (one the writer
        created after it opened: a model version imported, then retired): every catch-up
        then fails ("Corruption: MANIFEST ..."). Nor does a replayed drop release the
        column family's files, nor a replayed creation give a handle to the new one
        (:meth:`_follow_tables` opens again for both). The instance it replaces is left
        to the reads still in it (it closes with its last reference, and its files with
        it); BackendError if the new one cannot be opened."""
        opened = open_db(self.path, self._opts, self._cache, self.mode)
        try:
            cfs = {t: opened.db.get_column_family(t) for t in self._specs if t in opened.existing}
        except Exception as exc:
            opened.db.close()
            opened.remove_folders()
            raise BackendError(f"rocks_db: cannot reopen {self.path!r}: {exc}") from exc
        old = self._opened
        self._opened, self._db, self._existing, self._cfs = opened, opened.db, opened.existing, cfs
        self.reopens += 1
        old.remove_folders()  # files the old instance holds open stay readable to it
        log.info("rocks_db: %s reopened as a secondary (%s)", self.path, why)

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        """Stored rows and found mask; keys in damaged blocks raise DamagedRowsError
        (carrying the rows of the others)."""
        values, found, _, _, damaged, why = self._read(table, keys)
        if why:
            raise damaged_rows_error(self.path, table, keys.size, values, found, damaged, why)
        return values, found

    def fetch_versions(self, table: str, keys: Keys) -> tuple[np.ndarray, Mask]:
        """Stored update version of each key (uint64) and whether its row carries one
        (false: absent, a row of format 1, or a row in a damaged block: an update then
        rewrites it)."""
        _, _, versions, has_version, damaged, why = self._read(table, keys)
        if why:
            log.warning(
                "rocks_db: %d keys of %s sit in damaged blocks (%s); read as unversioned",
                int(damaged.sum()),
                table,
                why,
            )
        return versions, has_version

    def _read(self, table: str, keys: Keys) -> tuple[Stored, Mask, np.ndarray, Mask, Mask, str]:
        """Rows, found, versions, has_version, damaged, and the first damage's message
        (empty: none)."""
        spec = self._unchanged(table, "fetch")
        n = keys.size
        values = np.zeros((n, spec.width), dtype=spec.fmt.dtype)
        found = np.zeros(n, dtype=bool)
        versions = np.zeros(n, dtype=np.uint64)
        has_version = np.zeros(n, dtype=bool)
        damaged = np.zeros(n, dtype=bool)
        cf = self._cf(table)
        if cf is None or n == 0:
            return values, found, versions, has_version, damaged, ""
        for lo in range(0, n, self.max_batch_size):
            hi = min(n, lo + self.max_batch_size)
            chunk = keys[lo:hi]
            skip = self._damaged.skip(table, chunk)
            try:
                # the stub's list type; raw mode answers bytes or None
                wanted = cast("list[RdictKey]", key_bytes(chunk[~skip]))
                got, bad, first = multiget(cf, wanted)
                parts = rocks_rows.decode(got, spec.fmt, spec.dim)
            except Exception as exc:
                raise BackendError(f"rocks_db: read of {table} failed: {exc}") from exc
            rows = lo + np.flatnonzero(~skip)
            values[rows], found[rows], versions[rows], has_version[rows] = parts
            damaged[lo + np.flatnonzero(skip)] = True
            if bad:
                damaged[rows[bad]] = True
                self._damaged.remember(table, keys[rows[bad]], first)
        why = self._damaged.why(table) if damaged.any() else ""
        return values, found, versions, has_version, damaged, why

    def _unchanged(self, table: str, what: str) -> TableSpec:
        """The spec of an open table, unless the writer recorded it in another format since
        (a secondary's :meth:`catch_up`): then a BackendError saying to reload."""
        spec = table_or_raise(self._specs, table)
        held = self._changed.get(table)
        if held is not None:
            raise format_changed(self.path, f"{what} {table}", spec, held)
        return spec

    def _write(self, table: str, batch: rd.WriteBatch, durable: bool) -> None:
        try:
            if durable:
                self._db.write(batch, self._sync)
            else:
                self._db.write(batch)
        except Exception as exc:
            raise BackendError(f"rocks_db: write to {table} failed: {exc}") from exc

    def _writable_cf(self, table: str) -> rd.Rdict:
        cf = self._cf(table)
        if self.mode != "read_write" or cf is None:
            raise BackendError(f"rocks_db: {self.path} is open {self.mode}; cannot write {table}")
        return cf

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        """Upsert (version 0); ``durable`` syncs the WAL before returning."""
        self.insert_versioned(table, keys, values, None, durable=durable)

    def insert_versioned(
        self,
        table: str,
        keys: Keys,
        values: Stored,
        versions: np.ndarray | None,
        *,
        durable: bool = False,
    ) -> None:
        """Upsert stored rows with their update versions (uint64; ``None``: 0), one put per
        row, in stored key order (:func:`stored_order`)."""
        check_rows(table_or_raise(self._specs, table), keys, values)
        self._writable_cf(table)
        self._damaged.forget(table, keys)
        handle = self._db.get_column_family_handle(table)
        if not in_stored_order(keys):
            order = stored_order(keys)
            keys, values = keys[order], values[order]
            versions = None if versions is None else versions[order]
        for lo in range(0, keys.size, self.max_batch_size):
            hi = min(keys.size, lo + self.max_batch_size)
            vers = None if versions is None else versions[lo:hi]
            batch = rd.WriteBatch(raw_mode=True)
            batch.set_default_column_family(handle)
            # rocksdict takes one Python object per row: this loop is the driver's API.
            rows = rocks_rows.encode(values[lo:hi], vers)
            for k, v in zip(key_bytes(keys[lo:hi]), rows, strict=True):
                batch.put(k, v)
            self._write(table, batch, durable)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        self._writable_cf(table)
        self._damaged.forget(table, keys)
        handle = self._db.get_column_family_handle(table)
        if not in_stored_order(keys):
            keys = keys[stored_order(keys)]
        for lo in range(0, keys.size, self.max_batch_size):
            batch = rd.WriteBatch(raw_mode=True)
            batch.set_default_column_family(handle)
            for k in key_bytes(keys[lo : lo + self.max_batch_size]):
                batch.delete(k)
            self._write(table, batch, durable)

    def size(self, table: str) -> int:
        cf = self._cf(table)
        if cf is None:
            return 0
        # RocksDB keeps only an estimate; count exactly with a key-only scan.
        n, last = 0, None
        for key in cf.keys():  # noqa: SIM118 (keys only: no value copies)
            n, last = n + 1, key
        check_scan(table, cf, last, n)
        return n

    def estimated_size(self, table: str) -> int:
        """RocksDB's ``estimate-num-keys``: memtables plus SST files, read from metadata. It
        counts an overwritten or deleted key until a compaction drops the older entry."""
        cf = self._cf(table)
        return 0 if cf is None else int(cf.property_int_value("rocksdb.estimate-num-keys") or 0)

    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Yield (keys, stored rows) chunks of the whole table, of at most ``chunk_rows``
        rows (default: sized by bytes, :func:`hps.io.chunks.rows_per_chunk`)."""
        spec = self._unchanged(table, "dump")
        cf = self._cf(table)
        if cf is None:
            return
        if chunk_rows is None:
            chunk_rows = rows_per_chunk(spec.fmt.row_bytes(spec.dim))
        keys: list[RdictKey] = []  # bytes in raw mode
        vals: list[bytes] = []
        n, last = 0, None
        for k, v in cf.items():
            keys.append(k)
            vals.append(v)
            if len(keys) == chunk_rows:
                n, last = n + len(keys), keys[-1]
                yield rocks_rows.decode_items(cast("list[bytes]", keys), vals, spec.fmt, spec.dim)
                keys, vals = [], []
        if keys:
            n, last = n + len(keys), keys[-1]
        check_scan(table, cf, last, n)  # before the last chunk: a caller may stop there
        if keys:
            yield rocks_rows.decode_items(cast("list[bytes]", keys), vals, spec.fmt, spec.dim)

    @property
    def column_families(self) -> list[str]:
        """Every column family of the database (``default`` and one per table)."""
        return sorted(self._existing)

    def verify(self, name: str) -> tuple[int, str | None]:
        """Read the whole column family ``name`` with every block's checksum verified (and,
        for an open table, every row's length); ``(rows read, None)`` when intact, else
        ``(rows read before the damage, why)``."""
        try:
            cf = self._db if name == "default" else self._db.get_column_family(name)
        except Exception as exc:
            return 0, f"cannot open the column family: {exc}"
        return verify_cf(cf, self._specs.get(name))

    def close(self) -> None:
        self._cfs.clear()
        with contextlib.suppress(Exception):  # closing twice is harmless
            self._db.close()
        self._opened.remove_folders()
