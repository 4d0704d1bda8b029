"""The one validation layer: what crosses into HPS is checked here, once.

The edges (the session's public methods, the update codec, the loader, Triton request
parsing) call these; everything below them (L1, the stores, the applier) trusts its input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from hps.errors import DTypeError, InvalidValueError, ShapeError, UnknownTableError
from hps.types import RESERVED_KEYS, Keys, TableSpec, Vectors

T = TypeVar("T")


def table_or_raise(tables: Mapping[str, T], name: str) -> T:
    try:
        return tables[name]
    except KeyError:
        raise UnknownTableError(f"unknown table {name!r}; open tables: {sorted(tables)}") from None


def as_keys(keys: Any) -> Keys:
    """Keys as a 1-D int64 array; integer dtypes that fit are converted, others refused."""
    arr = np.asarray(keys)
    if arr.dtype == np.int64:
        return arr.reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize <= 4:
        return arr.astype(np.int64).reshape(-1)
    if arr.dtype == np.uint64 and arr.max() <= np.iinfo(np.int64).max:
        return arr.astype(np.int64).reshape(-1)
    raise DTypeError(f"keys must be int64, got {arr.dtype}")


def as_rows(spec: TableSpec, keys: Any, values: Any) -> tuple[Keys, Vectors]:
    """A write batch: int64 keys (not reserved), finite float32 rows of the table's dim."""
    k = as_keys(keys)
    if k.size and bool((k <= max(RESERVED_KEYS)).any()):
        raise InvalidValueError(f"{spec.name}: keys {list(RESERVED_KEYS)} are reserved")
    v = np.asarray(values)
    if v.dtype.kind != "f":
        raise DTypeError(f"{spec.name}: vectors must be floating point, got {v.dtype}")
    v = np.ascontiguousarray(v, dtype=np.float32)
    if v.ndim == 1 and v.size == k.size * spec.dim:
        v = v.reshape(k.size, spec.dim)
    if v.ndim != 2 or v.shape[1] != spec.dim:
        raise ShapeError(
            f"{spec.name}: vectors must have dimension {spec.dim}, got shape {v.shape}"
        )
    if v.shape[0] != k.size:
        raise ShapeError(f"{spec.name}: {k.size} keys but {v.shape[0]} vectors")
    if not np.isfinite(v).all():
        raise InvalidValueError(f"{spec.name}: vectors contain NaN or infinity")
    return k, v
