"""Input checks every backend applies at its boundary, so bad batches never reach storage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from hps.errors import DTypeError, InvalidValueError, ShapeError, UnknownTableError
from hps.types import Keys, TableSpec, Vectors

T = TypeVar("T")


def table_or_raise(tables: Mapping[str, T], name: str) -> T:
    try:
        return tables[name]
    except KeyError:
        raise UnknownTableError(f"unknown table {name!r}; open tables: {sorted(tables)}") from None


def check_keys_arg(keys: Any) -> Keys:
    """Keys as a 1-D int64 array; integer dtypes that fit are converted, others refused."""
    arr = np.asarray(keys)
    if arr.dtype == np.int64:
        return arr.reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize <= 4:
        return arr.astype(np.int64).reshape(-1)
    if arr.dtype == np.uint64 and (arr.size == 0 or arr.max() <= np.iinfo(np.int64).max):
        return arr.astype(np.int64).reshape(-1)
    raise DTypeError(f"keys must be int64, got {arr.dtype}")


def check_insert(spec: TableSpec, keys: Any, values: Any) -> tuple[Keys, Vectors]:
    """Validate an insert batch: int64 keys, finite float vectors of the table's dimension."""
    k = check_keys_arg(keys)
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


def last_occurrence(keys: Keys, values: Vectors) -> tuple[Keys, Vectors]:
    """Drop duplicate keys, keeping each key's last vector (upsert order)."""
    uniq, idx = np.unique(keys[::-1], return_index=True)
    if uniq.size == keys.size:
        return keys, values
    last = keys.size - 1 - idx
    return keys[last], values[last]
