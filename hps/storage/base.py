"""The one interface every L2/L3 backend implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hps.types import Keys, Mask, TableSpec, Vectors


@runtime_checkable
class EmbeddingStore(Protocol):
    """int64 keys → float32 vectors, per table ``<model>.<table>``, over whole NumPy batches.

    Contract (tests/unit/storage/test_contract.py checks every backend against it):

    - ``fetch`` returns ``(values[n, dim] float32, found[n] bool)`` in the order of ``keys``;
      rows of keys not found are unspecified (callers fill defaults).
    - ``insert`` upserts the whole batch; ``remove`` deletes keys (absent keys are ignored).
    - Batches larger than the backend's ``max_batch_size`` are chunked inside the backend.
    - A table must be declared with ``open_table`` before use; an unknown table raises
      :class:`hps.errors.UnknownTableError`.
    - Driver errors surface as :class:`hps.errors.BackendError` (or ``BackendUnavailable``
      when retrying may help), never as the driver's own exception.
    """

    name: str

    def open_table(self, spec: TableSpec) -> None: ...

    def fetch(self, table: str, keys: Keys) -> tuple[Vectors, Mask]: ...

    def insert(self, table: str, keys: Keys, values: Vectors) -> None: ...

    def remove(self, table: str, keys: Keys) -> None: ...

    def size(self, table: str) -> int: ...

    def close(self) -> None: ...
