"""Side tables: a uint64 version per key, kept beside a table's rows in the same tier.

A version is stored as :data:`LIMBS` float32 holding its 16-bit limbs, which every backend
keeps exactly. What the side tables hold and why: :mod:`hps.tiers.versions`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hps.tiers.rows import RowStore
from hps.types import Keys, TableSpec

Versions = npt.NDArray[np.uint64]

LIMBS = 4
UINT64_MAX = np.uint64(2**64 - 1)
_SHIFTS = np.arange(LIMBS, dtype=np.uint64) * np.uint64(16)
_MASK = np.uint64(0xFFFF)


def to_limbs(versions: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """uint64 versions as rows of :data:`LIMBS` float32 (16-bit limbs, low first)."""
    v = np.asarray(versions, dtype=np.uint64)
    return ((v[:, None] >> _SHIFTS[None, :]) & _MASK).astype(np.float32)


def from_limbs(limbs: npt.ArrayLike) -> Versions:
    """The versions that :func:`to_limbs` stored."""
    parts = np.asarray(limbs, dtype=np.float32).astype(np.uint64)
    return np.bitwise_or.reduce(parts << _SHIFTS[None, :], axis=1).astype(np.uint64)


def side_table(spec: TableSpec, suffix: str) -> TableSpec:
    """The side table ``suffix`` of ``spec`` (in the same model version's namespace)."""
    return TableSpec(model=spec.model, table=spec.table + suffix, dim=LIMBS, version=spec.version)


class SideTable:
    """A side table of a table: a version (uint64, as limbs) per key."""

    def __init__(self, store: RowStore, spec: TableSpec, suffix: str) -> None:
        self.store = store
        self.spec = side_table(spec, suffix)
        store.open_table(self.spec)

    def get(self, keys: Keys) -> Versions:
        """Stored versions of ``keys`` (0 where none)."""
        limbs, found = self.store.fetch(self.spec.name, keys)
        versions = np.zeros(keys.size, dtype=np.uint64)
        versions[found] = from_limbs(limbs[found])
        return versions

    def raise_to(self, keys: Keys, versions: Versions) -> None:
        """Raise stored versions to ``versions`` where lower (or absent), atomically against
        other writers of the tier; never lowers one (not synced)."""
        self.store.insert_max(self.spec.name, keys, to_limbs(versions))

    def put(self, keys: Keys, versions: Versions, *, durable: bool) -> None:
        """Store versions; ``durable`` syncs this write and every write before it."""
        limbs = to_limbs(versions)
        self.store.insert(self.spec.name, keys, limbs, durable=durable)
