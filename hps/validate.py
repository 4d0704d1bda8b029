"""The one validation layer: what crosses into HPS is checked here, once.

The edges (the session's public methods, the update codec, the loader, Triton request
parsing) call these; everything below them (L1, the stores, the applier, the lookup
pipeline) trusts its input. :class:`RequestLimits` is the one place where a request's keys
per table are counted and bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from hps.errors import (
    BatchTooLargeError,
    DTypeError,
    InvalidValueError,
    ShapeError,
    UnknownTableError,
)
from hps.types import RESERVED_KEYS, Keys, TableSpec, Vectors

T = TypeVar("T")


def table_or_raise(tables: Mapping[str, T], name: str) -> T:
    try:
        return tables[name]
    except KeyError:
        raise UnknownTableError(f"unknown table {name!r}; open tables: {sorted(tables)}") from None


def as_keys(keys: npt.ArrayLike) -> Keys:
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


def check_not_reserved(name: str, keys: Keys) -> None:
    """InvalidValueError where ``keys`` (int64) hold a key no tier can store (the index's
    empty and deleted markers)."""
    if keys.size and bool((keys <= max(RESERVED_KEYS)).any()):
        raise InvalidValueError(f"{name}: keys {list(RESERVED_KEYS)} are reserved")


def as_rows(spec: TableSpec, keys: npt.ArrayLike, values: npt.ArrayLike) -> tuple[Keys, Vectors]:
    """A write batch: int64 keys (not reserved), finite float32 rows of the table's dim."""
    k = as_keys(keys)
    check_not_reserved(spec.name, k)
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


LIMIT_RULE = "max_batch_size x maxnum_catfeature_query_per_table_per_sample"


def _too_many(name: str, n: int, limit: int, rows: int = 1) -> BatchTooLargeError:
    over = f" over the {rows} rows of this request" if rows > 1 else ""
    return BatchTooLargeError(
        f"{name}: {n:,} keys{over} exceed the limit of {limit:,} ({LIMIT_RULE})"
    )


def check_table_keys(spec: TableSpec, n: int) -> None:
    """Refuse more keys for one table than its ``max_keys_per_request`` (0: unlimited)."""
    if spec.max_keys_per_request and n > spec.max_keys_per_request:
        raise _too_many(spec.name, n, spec.max_keys_per_request)


@dataclass(frozen=True, eq=False)  # an array field: identity, not element-wise ==
class RequestLimits:
    """A model's request shape: one key count per table, each bounded (0: unlimited).

    Built once per model (:meth:`of`). :meth:`counts` checks one lookup (flat keys and
    keys per table, what :meth:`hps.LookupSession.lookup_request` takes); :meth:`check`
    bounds the keys of all rows of a batched Triton request together, from shapes and
    ``NUMKEYS`` only, before any key is looked up, and :meth:`rows` checks each of its
    rows, all at once.
    """

    model: str
    names: tuple[str, ...]
    per_table: npt.NDArray[np.int64]
    dims: npt.NDArray[np.int64]  # each table's vector size

    @classmethod
    def of(cls, tables: Sequence[TableSpec]) -> RequestLimits:
        per_table = np.array([t.max_keys_per_request for t in tables], dtype=np.int64)
        dims = np.array([t.dim for t in tables], dtype=np.int64)
        model = tables[0].model if tables else ""
        return cls(model, tuple(t.name for t in tables), per_table, dims)

    def rows(self, keys: np.ndarray, numkeys: np.ndarray) -> int:
        """Check every row of a batched request (``keys`` ``[rows, n]``, ``numkeys``
        ``[rows, tables]`` of integers) as :meth:`counts` checks one lookup, and that their
        answers are as long (one ``OUTPUT0`` tensor holds them), before any row is looked
        up; that length (floats per row). The first bad row is refused as :meth:`counts`
        would refuse it; the limits are :meth:`check`'s, for all rows together, checked
        first."""
        model, tables = self.model, len(self.names)
        if numkeys.shape[1] != tables:
            raise ShapeError(f"{model}: {numkeys.shape[1]} key counts for {tables} tables")
        counts = numkeys.astype(np.int64)
        negative = np.any(counts < 0, axis=1)
        sums, sent = counts.sum(axis=1), keys.shape[1]
        bad = negative | (sums != sent)
        if bad.any():
            row = int(np.argmax(bad))
            if negative[row]:
                raise ShapeError(f"{model}: negative key count in {counts[row].tolist()}")
            got = int(sums[row])
            raise ShapeError(f"{model}: key counts add up to {got} but {sent} keys were sent")
        widths = counts @ self.dims
        if (widths != widths[0]).any():
            raise ShapeError(
                f"{model}: the {keys.shape[0]} rows of this request give vectors of "
                f"different lengths {sorted(set(widths.tolist()))}; send one request per row"
            )
        return int(widths[0])

    def counts(self, keys: Keys, num_keys: npt.ArrayLike) -> list[int]:
        """The keys per table of one lookup of ``keys``, checked: integers, one per table,
        none negative, adding up to the keys sent, within the limits."""
        counts = np.asarray(num_keys).reshape(-1)
        model = self.model
        if counts.dtype.kind not in "iu":
            raise ShapeError(f"{model}: keys per table must be integers, got {counts.dtype}")
        if counts.size != len(self.names):
            raise ShapeError(f"{model}: {counts.size} key counts for {len(self.names)} tables")
        if (counts < 0).any():
            raise ShapeError(f"{model}: negative key count in {counts.tolist()}")
        if int(counts.sum()) != keys.size:
            raise ShapeError(
                f"{model}: key counts add up to {int(counts.sum())} but {keys.size} keys were sent"
            )
        self._bound(counts, rows=1)
        return [int(n) for n in counts.tolist()]

    def check(self, keys: np.ndarray, numkeys: np.ndarray) -> None:
        """Refuse a request whose keys per table, summed over its rows, exceed the limits
        (``keys`` ``[rows, n]``, ``numkeys`` ``[rows, tables]``). A ``numkeys`` of the wrong
        width is left to :meth:`counts`, which names that mistake."""
        limits = self.per_table
        if limits.size == 0 or numkeys.shape[1] != limits.size:
            return
        if (limits > 0).all() and keys.shape[1] > int(limits.sum()):
            raise BatchTooLargeError(
                f"{self.model}: {keys.shape[1]:,} keys per row exceed the "
                f"{int(limits.sum()):,} a request may hold over all tables ({LIMIT_RULE})"
            )
        # a negative count is counts()'s to name; here it must not hide another row's excess
        totals = numkeys[0] if numkeys.shape[0] == 1 else np.clip(numkeys, 0, None).sum(axis=0)
        self._bound(totals, rows=numkeys.shape[0])

    def _bound(self, totals: np.ndarray, rows: int) -> None:
        limits = self.per_table
        over = (limits > 0) & (totals > limits)
        if over.any():
            i = int(np.argmax(over))
            raise _too_many(self.names[i], int(totals[i]), int(limits[i]), rows)
