"""The one interface every L2/L3 backend implements, capabilities included.

A new backend subclasses :class:`EmbeddingStore`, fills in the abstract methods and sets the
class attributes below; nothing else in HPS asks a store what it can do.
tests/integration/storage/test_contract.py runs every method and capability against every
backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.types import Keys, Mask, TableSpec, Vectors

Placement = Literal["process", "node", "server", "disk"]
"""Where a store's rows live, which decides who fills and updates them:

- ``process``: inside the process that opened it, gone with it (``hash_map``). Only that
  process can fill it or apply updates to it.
- ``node``: shared memory, one copy per node for all its processes (``multi_process_hash_map``).
- ``server``: a server every node shares (Redis): filled once, updated once.
- ``disk``: files on this node (RocksDB): one writer process, any number of readers.
"""

AccessMode = Literal["read_write", "read_only", "secondary"]
"""How this process opens a store. Only ``disk`` stores honour anything but ``read_write``:
``read_only`` is a snapshot, ``secondary`` follows a writer through :meth:`catch_up`."""


class EmbeddingStore(ABC):
    """int64 keys → float32 vectors, per table ``<model>.<table>``, over whole NumPy batches.

    Contract:

    - ``fetch`` returns ``(values[n, dim] float32, found[n] bool)`` in the order of ``keys``;
      rows of keys not found are unspecified (callers fill defaults).
    - ``insert`` upserts the whole batch; ``remove`` deletes keys (absent keys are ignored).
      Batches come validated (int64 keys, finite float32 rows of the table's dim: the session,
      the codec and the loader check them once); a backend does not check them again.
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
    - ``bytes_per_row``: memory (or disk) one row costs, for ``hps plan``.
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

    @abstractmethod
    def fetch(self, table: str, keys: Keys) -> tuple[Vectors, Mask]: ...

    @abstractmethod
    def insert(self, table: str, keys: Keys, values: Vectors, *, durable: bool = False) -> None:
        ...

    @abstractmethod
    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None: ...

    @abstractmethod
    def size(self, table: str) -> int:
        """The rows of the table, counted exactly."""

    def estimated_size(self, table: str) -> int:
        """The rows of the table, cheaply: exact where ``exact_size``, else an estimate."""
        return self.size(table)

    @abstractmethod
    def dump(self, table: str, chunk_rows: int = 1 << 16) -> Iterator[tuple[Keys, Vectors]]:
        """Every row of the table, in chunks of at most ``chunk_rows``."""

    @classmethod
    @abstractmethod
    def bytes_per_row(cls, dim: int, *, bounded: bool = False) -> float:
        """Expected bytes one stored row costs; ``bounded``: with an ``overflow_margin``."""

    def insert_versioned(
        self,
        table: str,
        keys: Keys,
        values: Vectors,
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
