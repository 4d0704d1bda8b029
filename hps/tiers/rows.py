"""RowStore: the rows of one tier (L2 or L3), the one typed interface to a store below L1.

Callers never hold a backend (:mod:`hps.storage`): they read and write rows through the
:class:`RowStore` s of a :class:`hps.tiers.Tiers`. A row here is a *stored row*: the table's
row format (:attr:`hps.types.TableSpec.fmt`, :mod:`hps.rowformat`), ``(n, spec.width)`` of
``spec.fmt.dtype`` (float32 ``(n, dim)`` for float32 tables), with its update version where
the backend keeps one in the row. Tiers store and return stored rows unchanged; float32 is
encoded into them at the edges (imports, updates, control-plane writes) and decoded from
them by the lookup. A store that already holds a table in another format or dimension
refuses to open it (:class:`hps.errors.ConfigError`); :meth:`RowStore.drop_table` clears it.

The class methods :meth:`RowStore.open`, :func:`placement_of` and :func:`bytes_per_row` are
the only way to a backend's class (what ``hps plan`` and the topology need of it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.rowformat import FLOAT32, RowFormat, Stored
from hps.storage import AccessMode, EmbeddingStore, Placement, open_store, store_class
from hps.types import Keys, Mask, TableSpec

Level = Literal["L2", "L3"]


class RowStore:
    """One tier's rows: ``int64 key -> stored row`` per table ``<model>.<table>``, whole
    batches.

    The contract is :class:`hps.storage.base.EmbeddingStore`'s (batches come validated and
    encoded in the table's format, a batch of another dtype or width is refused with
    ``DTypeError`` / ``ShapeError``; ``fetch`` returns stored rows in the order of the keys
    with a found mask; driver errors are :class:`hps.errors.BackendError`); the capabilities
    are the backend's declared ones.
    """

    def __init__(self, store: EmbeddingStore, level: Level) -> None:
        self._store = store
        self.level = level

    @classmethod
    def open(
        cls,
        cfg: VolatileDBConfig | PersistentDBConfig,
        level: Level,
        mode: AccessMode = "read_write",
    ) -> RowStore | None:
        """The tier ``cfg`` configures, opened ``mode`` (``None`` when it is disabled)."""
        store = open_store(cfg, mode)
        return None if store is None else cls(store, level)

    def __repr__(self) -> str:
        return f"RowStore({self.level}, {self.backend})"

    # -- capabilities (declared by the backend, see hps.storage.base) ----------------------

    @property
    def backend_store(self) -> EmbeddingStore:
        """The backend itself, for :mod:`hps.tiers`' own modules only (the shared-L2 watch
        needs the shared-memory store's identity and refill record); callers outside
        :mod:`hps.tiers` read and write rows through this class."""
        return self._store

    @property
    def backend(self) -> str:
        """The backend's registered name (``hash_map``, ``rocks_db``, ...)."""
        return self._store.name

    @property
    def placement(self) -> Placement:
        return self._store.placement

    @property
    def writable(self) -> bool:
        return self._store.writable

    @property
    def exact_size(self) -> bool:
        return self._store.exact_size

    @property
    def versioned_rows(self) -> bool:
        return self._store.versioned_rows

    # -- rows -------------------------------------------------------------------------------

    def open_table(self, spec: TableSpec) -> None:
        """Declare a table; one stored here in another format or dimension is a
        :class:`hps.errors.ConfigError` (re-import it with ``hps import --force``)."""
        self._store.open_table(spec)

    def open_tables(self, specs: Sequence[TableSpec]) -> None:
        """:meth:`open_table` for each, in order; those before a refused one are open (a
        backend may create new tables together: ``rocks_db``, one open of the database)."""
        self._store.open_tables(specs)

    def stored_format(self, spec: TableSpec) -> tuple[RowFormat, int] | None:
        """The format and dimension this tier holds ``spec``'s rows in, read without
        declaring it (:meth:`hps.storage.base.EmbeddingStore.stored_format`); None: none."""
        return self._store.stored_format(spec)

    def drop_table(self, table: str) -> None:
        """Delete the table's rows and its recorded format and dimension (open or not); open
        it again before use."""
        self._store.drop_table(table)

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        """``(stored rows[n, width], found[n])`` in the order of ``keys``; rows not found
        unspecified."""
        return self._store.fetch(table, keys)

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        """Upsert the batch of stored rows; ``durable``: synced before returning (where the
        tier is durable)."""
        if durable:
            self._store.insert(table, keys, values, durable=True)
        else:
            self._store.insert(table, keys, values)

    def insert_absent(self, table: str, keys: Keys, values: Stored) -> None:
        """Insert the rows of the keys the table does not hold; held rows stay (atomic in
        every L2 backend)."""
        self._store.insert_absent(table, keys, values)

    def insert_max(self, table: str, keys: Keys, values: Stored) -> None:
        """Store each row greater than the key's stored row (or whose key is absent), the
        last element most significant: a version's limbs never lowered by another writer
        (atomic in every L2 backend, :meth:`hps.storage.base.EmbeddingStore.insert_max`)."""
        self._store.insert_max(table, keys, values)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        if durable:
            self._store.remove(table, keys, durable=True)
        else:
            self._store.remove(table, keys)

    def size(self, table: str) -> int:
        """The table's rows, counted exactly (a scan where not ``exact_size``)."""
        return self._store.size(table)

    def estimated_size(self, table: str) -> int:
        """The table's rows, cheaply: exact where ``exact_size``, else the store's estimate."""
        return self._store.estimated_size(table)

    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Every (key, stored row) of the table, in chunks of at most ``chunk_rows`` (the
        backend's default)."""
        return self._store.dump(table, chunk_rows)

    def insert_versioned(
        self,
        table: str,
        keys: Keys,
        values: Stored,
        versions: npt.NDArray[np.uint64],
        *,
        durable: bool = False,
    ) -> None:
        """Upsert stored rows that carry their update version (``versioned_rows`` tiers)."""
        self._store.insert_versioned(table, keys, values, versions, durable=durable)

    def fetch_versions(self, table: str, keys: Keys) -> tuple[npt.NDArray[np.uint64], Mask]:
        """The version each key's row carries, and whether it carries one."""
        return self._store.fetch_versions(table, keys)

    # -- the handle ---------------------------------------------------------------------------

    def catch_up(self) -> None:
        """A secondary L3 replays what its writer wrote since; a no-op elsewhere."""
        self._store.catch_up()

    def close(self) -> None:
        self._store.close()


def placement_of(type_name: str) -> Placement:
    """Where the rows of a ps.json store ``type`` live (its backend's declaration)."""
    return store_class(type_name).placement


def table_bytes(
    cfg: VolatileDBConfig | PersistentDBConfig, rows: int, dim: int, fmt: RowFormat = FLOAT32
) -> int:
    """What a table of ``rows`` rows of dimension ``dim`` in format ``fmt`` costs in the
    store ``cfg`` configures (``hps plan``)."""
    return store_class(cfg.type).table_bytes(rows, fmt.row_bytes(dim), cfg)


def bytes_per_row(
    type_name: str, dim: int, fmt: RowFormat = FLOAT32, *, bounded: bool = False
) -> float:
    """What one row of dimension ``dim`` stored in format ``fmt`` costs in a store of
    ``type_name``, key and bookkeeping included (``hps plan``)."""
    return float(store_class(type_name).bytes_per_row(fmt.row_bytes(dim), bounded=bounded))
