"""Per-key update versions, kept in a side table next to the data they protect.

The side table of ``<model>.<table>`` is ``<model>.<table>__hps_version`` in the same store
(L3 when the table's updates go to L3, else L2), so it lives and dies with the data, and a
synced write of it also syncs the data written before it (one RocksDB WAL). A version is a
uint64 stored as four float32 holding its 16-bit limbs, which every backend keeps exactly.
Deleted keys keep their version (a tombstone), so a replayed older upsert cannot resurrect them.
"""

from __future__ import annotations

import inspect

import numpy as np

from hps.storage.base import EmbeddingStore
from hps.types import Keys, TableSpec

SUFFIX = "__hps_version"
LIMBS = 4
_SHIFTS = np.arange(LIMBS, dtype=np.uint64) * np.uint64(16)
_MASK = np.uint64(0xFFFF)


def side_spec(spec: TableSpec) -> TableSpec:
    return TableSpec(model=spec.model, table=spec.table + SUFFIX, dim=LIMBS)


def to_limbs(versions: np.ndarray) -> np.ndarray:
    v = np.asarray(versions, dtype=np.uint64)
    return ((v[:, None] >> _SHIFTS[None, :]) & _MASK).astype(np.float32)


def from_limbs(limbs: np.ndarray) -> np.ndarray:
    parts = np.asarray(limbs, dtype=np.float32).astype(np.uint64)
    return np.bitwise_or.reduce(parts << _SHIFTS[None, :], axis=1).astype(np.uint64)


class VersionTable:
    """Read and write the versions of one table's keys (0 means never updated)."""

    def __init__(self, store: EmbeddingStore, spec: TableSpec, *, durable: bool) -> None:
        self.store = store
        self.spec = side_spec(spec)
        # Only a store that can sync (rocks_db) is asked to; the others are volatile anyway.
        self.durable = durable and "durable" in inspect.signature(store.insert).parameters
        store.open_table(self.spec)

    def get(self, keys: Keys) -> np.ndarray:
        limbs, found = self.store.fetch(self.spec.name, keys)
        versions = np.zeros(keys.size, dtype=np.uint64)
        versions[found] = from_limbs(limbs[found])
        return versions

    def put(self, keys: Keys, versions: np.ndarray) -> None:
        """Record versions; with ``durable`` the write (and all before it) is synced."""
        limbs = to_limbs(versions)
        if self.durable:
            self.store.insert(self.spec.name, keys, limbs, durable=True)  # type: ignore[call-arg]
        else:
            self.store.insert(self.spec.name, keys, limbs)
