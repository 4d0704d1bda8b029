"""The one interface every L2/L3 backend implements, capabilities included.

A new backend subclasses :class:`EmbeddingStore`, fills in the abstract methods and sets the
class attributes below; nothing else in HPS asks a store what it can do.
tests/integration/storage/test_contract.py runs every method and capability against every
backend.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.dedup import greater_rows, greatest_occurrence
from hps.errors import ConfigError, DTypeError, ShapeError
from hps.rowformat import FLOAT32, RowFormat, Stored
from hps.types import Keys, Mask, TableSpec

Placement = Literal["process", "node", "server", "disk"]
"""Where a store's rows live, which decides who fills and updates them:

- ``process``: inside the process that opened it, gone with it (``hash_map``). Only that
  process can fill it or apply updates to it.
- ``node``: shared memory, one copy per node for all its processes (``multi_process_hash_map``).
- ``server``: a server every node shares (Redis): filled once, updated once.
- ``disk``: files on this node (RocksDB): one writer process, any number of readers.
"""

_INSERT_MAX_LOCK = threading.Lock()  # the default insert_max's, rare enough for one

WriteMode = Literal["upsert", "absent", "max"]
"""What a backend's one write path does with a key the table holds: ``upsert`` replaces its
row (``insert``), ``absent`` keeps it (``insert_absent``), ``max`` keeps the greater of the two
(``insert_max``)."""

AccessMode = Literal["read_write", "read_only", "secondary"]
"""How this process opens a store. Only ``disk`` stores honour anything but ``read_write``:
``read_only`` is a snapshot, ``secondary`` follows a writer through :meth:`catch_up`."""


class EmbeddingStore(ABC):
    """int64 keys → stored rows, per table ``<model>.<table>``, over whole NumPy batches.

    A table's rows are kept in its row format (:attr:`hps.types.TableSpec.fmt`): a stored
    row is ``spec.width`` elements of ``spec.fmt.dtype`` (float32 ``dim`` for float32 tables,
    :mod:`hps.rowformat`); a store never encodes, decodes or converts them.

    Contract:

    - ``fetch`` returns ``(rows[n, width] of fmt.dtype, found[n] bool)`` in the order of
      ``keys``; rows of keys not found are unspecified (callers fill defaults).
    - ``insert`` upserts the whole batch of stored rows; ``insert_absent`` adds the rows of
      the keys the table does not hold and keeps the rows it holds (a row read from L3
      before an update, copied into L2 after the update wrote there, must not overwrite
      it); ``remove`` deletes keys (absent keys are ignored). Batches come validated
      (int64 keys, finite rows encoded in the table's format: the session, the codec and
      the loader check them once); a backend checks only
      that the rows are the table's stored form (:func:`check_rows`: dtype and width, no
      pass over the data) and refuses another with ``DTypeError`` / ``ShapeError``, storing
      nothing.
    - ``open_table`` of a table whose rows a persistent or shared store already holds in
      another format or dimension raises :class:`hps.errors.ConfigError` (:func:`refused`):
      rows of two formats are never mixed. Stores written before formats were recorded hold
      float32 rows. ``drop_table`` deletes a table's rows and what was recorded of it, so
      that it can be created again in another format (``hps import --force``).
    - Batches larger than the backend's ``max_batch_size`` are chunked inside the backend.
    - A table must be declared with ``open_table`` before use; an unknown table raises
      :class:`hps.errors.UnknownTableError`.
    - Driver errors surface as :class:`hps.errors.BackendError` (or ``BackendUnavailable``
      when retrying may help), never as the driver's own exception.

    Capabilities (class attributes, checked by the contract suite):

    - ``placement``: see :data:`Placement`.
    - ``durable``: ``insert``/``remove`` with ``durable=True`` reach stable storage before
      they return (and so does every write before them); other stores ignore the flag.
    - ``writable``: whether this handle may write (a read-only or secondary L3 may not).
    - ``catch_up``: a ``secondary`` handle replays what the writer wrote since; a no-op
      elsewhere.
    - ``bytes_per_row``: memory (or disk) one row of ``row_bytes`` stored bytes costs, for
      ``hps plan``.
    - ``exact_size``: ``size`` is an exact count that costs little. Where it is not
      (``rocks_db``: a scan of every key), ``estimated_size`` is the store's own cheap
      estimate; elsewhere it is ``size``.
    - ``versioned_rows``: the store keeps an update version inside each row and has
      ``insert_versioned(table, keys, values, versions, durable=)`` and
      ``fetch_versions(table, keys) -> (versions, has_version)`` (``rocks_db``): the Kafka
      applier then writes each row once (:mod:`hps.tiers.versions`).
    """

    name: ClassVar[str]
    placement: ClassVar[Placement]
    durable: ClassVar[bool] = False
    exact_size: ClassVar[bool] = True
    versioned_rows: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_config(
        cls, cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
    ) -> EmbeddingStore:
        """Open the store a ps.json section describes (``mode``: see :data:`AccessMode`)."""

    @property
    def writable(self) -> bool:
        return True

    @abstractmethod
    def open_table(self, spec: TableSpec) -> None: ...

    def open_tables(self, specs: Sequence[TableSpec]) -> None:
        """Declare several tables: :meth:`open_table` for each, in order (a refusal stops at
        its table; those before it are open). A store that creates tables faster together
        overrides it."""
        for spec in specs:
            self.open_table(spec)

    def stored_format(self, spec: TableSpec) -> tuple[RowFormat, int] | None:
        """The row format and dimension this store holds ``spec``'s rows in, read without
        declaring the table or writing anything (as :meth:`open_table` would compare them);
        None where it holds none of them. This default knows of none: a store whose rows
        live and die with the processes that hold it (in-process, shared memory) keeps no
        record another process could read without attaching it."""
        return None

    @abstractmethod
    @abstractmethod
    def drop_table(self, table: str) -> None:
        """Delete every row of ``table`` and its recorded format and dimension (open or not
        in this handle); it must be opened again before use."""

    @abstractmethod
    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]: ...

    @abstractmethod
    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None: ...

    def insert_absent(self, table: str, keys: Keys, values: Stored) -> None:
        """Insert the rows of the keys ``table`` does not hold; the rows it holds stay.

        Every L2 backend does it atomically against other writers of the table (in other
        processes too); this default (a fetch, then an insert) is not, and serves L3,
        which nothing fills this way."""
        if values.shape[:1] != keys.shape:
            raise ShapeError(f"{table}: {keys.size} keys but rows of shape {values.shape}")
        _, found = self.fetch(table, keys)
        if not found.all():
            self.insert(table, keys[~found], values[~found])  # checks the rows' form

    def insert_max(self, table: str, keys: Keys, values: Stored) -> None:
        """Store each row greater than the key's stored row, or whose key the table lacks;
        rows compare as numbers whose last element is the most significant (float32 tables:
        the side tables' version limbs, :mod:`hps.tiers.side_tables`). A key repeated in the
        batch takes its greatest row. A row so stored is never lowered by another writer's.

        Every L2 backend does it atomically against other writers of the table (in other
        processes too); this default (a fetch, then an insert, under one lock of this
        process) only against this process's, and serves L3, whose one writer process holds
        its lock."""
        check_max_rows(table, keys, values)
        keys, values = greatest_occurrence(keys, values)
        with _INSERT_MAX_LOCK:
            self._insert_max_locked(table, keys, values)

    def _insert_max_locked(self, table: str, keys: Keys, values: Stored) -> None:
        held, found = self.fetch(table, keys)
        if held.dtype != values.dtype or held.shape != values.shape:
            raise ShapeError(
                f"{table}: stored rows are {held.dtype} of shape "
                f"{held.shape[1:]}, got {values.dtype} rows of {values.shape[1:]}"
            )
        take = ~found | greater_rows(values, held)
        if take.any():
            self.insert(table, keys[take], values[take])

    @abstractmethod
    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None: ...

    @abstractmethod
    def size(self, table: str) -> int:
        """The rows of the table, counted exactly."""

    def estimated_size(self, table: str) -> int:
        """The rows of the table, cheaply: exact where ``exact_size``, else an estimate."""
        return self.size(table)

    @abstractmethod
    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Every (key, stored row) of the table, in chunks of at most ``chunk_rows`` (default:
        sized by bytes, :func:`hps.io.chunks.rows_per_chunk` of the stored rows)."""

    @classmethod
    @abstractmethod
    def bytes_per_row(cls, row_bytes: int, *, bounded: bool = False) -> float:
        """Expected bytes a stored row of ``row_bytes`` bytes (``fmt.row_bytes(dim)``) costs
        with its key and bookkeeping; ``bounded``: with an ``overflow_margin``."""

    @classmethod
    def table_bytes(
        cls, rows: int, row_bytes: int, cfg: VolatileDBConfig | PersistentDBConfig
    ) -> int:
        """Expected bytes of a table of ``rows`` rows in a store configured by ``cfg``
        (``hps plan``): ``rows`` x :meth:`bytes_per_row` unless the store allocates in
        larger units."""
        bounded = isinstance(cfg, VolatileDBConfig) and cfg.bounded
        return int(rows * cls.bytes_per_row(row_bytes, bounded=bounded))

    def insert_versioned(
        self,
        table: str,
        keys: Keys,
        values: Stored,
        versions: npt.NDArray[np.uint64] | None,
        *,
        durable: bool = False,
    ) -> None:
        """Upsert rows with their update versions (``versioned_rows`` stores only)."""
        raise TypeError(f"{self.name} keeps no version in its rows (versioned_rows is False)")

    def fetch_versions(self, table: str, keys: Keys) -> tuple[npt.NDArray[np.uint64], Mask]:
        """Each key's stored update version, and whether its row carries one
        (``versioned_rows`` stores only)."""
        raise TypeError(f"{self.name} keeps no version in its rows (versioned_rows is False)")

    def catch_up(self) -> None:  # noqa: B027 (a no-op is the right default)
        """Replay what the writer wrote since (``secondary`` handles only)."""

    @abstractmethod
    def close(self) -> None: ...


def check_rows(spec: TableSpec, keys: Keys, values: Stored) -> None:
    """Refuse a batch that is not ``spec``'s stored rows, one per key (dtype and shape only:
    no pass over the data). Raised before anything is written."""
    fmt = spec.fmt
    if values.dtype != fmt.dtype:
        raise DTypeError(
            f"{spec.name}: stored rows of a {fmt.name} table are {fmt.dtype}, got {values.dtype}"
        )
    if values.ndim != 2 or values.shape[1] != spec.width:
        raise ShapeError(
            f"{spec.name}: stored {fmt.name} rows of dimension {spec.dim} have {spec.width} "
            f"elements, got shape {values.shape}"
        )
    if values.shape[0] != keys.size:
        raise ShapeError(f"{spec.name}: {keys.size} keys but {values.shape[0]} rows")


def check_max_rows(table: str, keys: Keys, values: Stored) -> None:
    """Refuse an ``insert_max`` batch that is not float32 rows, one per key (a backend
    checks the rest with :func:`check_rows`)."""
    if values.dtype != np.float32:
        raise DTypeError(f"{table}: insert_max compares float32 rows, got {values.dtype}")
    if values.ndim != 2 or values.shape[0] != keys.size:
        raise ShapeError(f"{table}: {keys.size} keys but rows of shape {values.shape}")


def refused(spec: TableSpec, where: str, fmt: RowFormat, dim: int) -> ConfigError:
    """The error for a table whose rows ``where`` holds in format ``fmt`` and dimension
    ``dim`` that differ from ``spec``'s."""
    what = (
        f"table {spec.name}: {where} holds {fmt.name} rows of dimension {dim}, but the table "
        f"is configured as {spec.row_dtype} rows of dimension {spec.dim}"
    )
    if spec.version > 1:  # a version is never imported again, its number never reused
        return ConfigError(
            f"{what}: model version {spec.version} was imported so (by another node sharing "
            "this tier, or before): import it with the same dims and row formats, or under a "
            "new number"
        )
    return ConfigError(
        f"{what}: re-import it with `hps import --force` (which drops the stored rows) or "
        "configure it as stored"
    )


LEGACY_FORMAT = FLOAT32
"""The format of a table whose store recorded none (written before formats existed)."""
