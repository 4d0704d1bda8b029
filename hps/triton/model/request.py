"""Requests of the Triton models as NumPy arrays in, NumPy arrays out; errors as messages.

Pure NumPy (no Triton import), so it is unit-tested without a server. The model.py adapters
take the input tensors, call :func:`lookup_hps_request` / :func:`parse_ctr_request`, and
turn an exception into a per-request Triton error with :func:`error_reply`.

HugeCTR's client sends ``KEYS`` as ``[1, n]`` and ``NUMKEYS`` as ``[1, tables]`` (Triton's
batch dimension first) and reads ``OUTPUT0`` as ``[1, n x dim]``. A request with batch
size ``B > 1`` answers ``B`` such lookups, one per row, with one lookup of all their keys
(:func:`table_major`); its rows must come out equally long.

Limits (docs/security.md): the keys of one table over all rows of a request may not exceed
the table's ``max_batch_size x maxnum_catfeature_query_per_table_per_sample``, checked from
``NUMKEYS`` (and the size of ``KEYS``) before any key is looked up by
:class:`hps.validate.RequestLimits`, the rule the session applies to each lookup; a CTR
request may not have more samples than the model's ``max_batch_size``, nor non-finite
dense features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hps.cache.xp import array_module
from hps.errors import (
    BatchTooLargeError,
    DTypeError,
    InvalidValueError,
    ShapeError,
    triton_code,
)
from hps.types import Array, Keys
from hps.validate import RequestLimits

__all__ = [
    "CTRBatch",
    "RequestLimits",
    "c_order",
    "error_reply",
    "lookup_hps_request",
    "parse_ctr_request",
    "table_major",
]

Lookup = Callable[[Keys, npt.NDArray[np.integer]], Array]


TRITON_TYPES = {
    "INT64": np.dtype(np.int64),
    "INT32": np.dtype(np.int32),
    "FP32": np.dtype(np.float32),
}


def _check(name: str, array: np.ndarray, triton_type: str) -> None:
    if array.dtype != TRITON_TYPES[triton_type]:
        raise DTypeError(f"input {name} must be {triton_type}, got {array.dtype}")
    if array.ndim != 2:
        raise ShapeError(
            f"input {name} must have shape [batch, n] (HugeCTR sends [1, n]), "
            f"got {list(array.shape)}"
        )


def lookup_hps_request(
    keys: np.ndarray, numkeys: np.ndarray, lookup: Lookup, limits: RequestLimits
) -> Array:
    """Answer one HPS-interface request: ``OUTPUT0`` of shape ``[batch, n x dim]``, where
    ``lookup`` answers it (a GPU instance's lookup may answer on its GPU).

    ``lookup(flat_keys, counts_per_table)`` is ``LookupSession.lookup_request`` bound to a
    model; it checks a lookup's counts (:meth:`RequestLimits.counts`) and raises typed
    errors. ``limits`` (the model's) bound the keys of all rows together
    (:meth:`RequestLimits.check`) and check every row of a batched request
    (:meth:`RequestLimits.rows`) before its one lookup: a refused request looks nothing up.
    """
    _check("KEYS", keys, "INT64")
    _check("NUMKEYS", numkeys, "INT32")
    if keys.shape[0] != numkeys.shape[0]:
        raise ShapeError(f"KEYS has batch size {keys.shape[0]} but NUMKEYS has {numkeys.shape[0]}")
    if keys.shape[0] == 0:
        raise ShapeError("KEYS and NUMKEYS have no rows (batch size 0); send at least one")
    limits.check(keys, numkeys)
    if keys.shape[0] == 1:
        return lookup(keys[0], numkeys[0]).reshape(1, -1)
    width = limits.rows(keys, numkeys)
    flat, totals, unit, index = table_major(keys, numkeys, limits.dims)
    out = lookup(flat, totals)  # on the GPU, if the lookup answered there
    xp = array_module(out)
    return out.reshape(-1, unit)[xp.asarray(index)].reshape(keys.shape[0], width)


def _starts(sizes: npt.NDArray[np.int64], axis: int | None = None) -> npt.NDArray[np.int64]:
    """Where each of ``sizes`` starts when they are laid end to end (along ``axis``)."""
    ends = np.cumsum(sizes, axis=axis)
    return ends - (sizes if axis is not None else sizes.reshape(-1))


def _table_major_index(
    counts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> npt.NDArray[np.intp]:
    """For a request of ``counts[row, table]`` items of ``sizes[table]`` units each, laid
    row after row (each row table after table): where each of its units is once the same
    items are laid table after table (each table row after row)."""
    units = counts * sizes  # [rows, tables]
    moved = _starts(units.sum(axis=0)) + _starts(units, axis=0)  # where each segment goes
    per_segment = units.reshape(-1)
    shift = np.repeat(moved.reshape(-1) - _starts(per_segment), per_segment)
    return (shift + np.arange(shift.size)).astype(np.intp, copy=False)


def table_major(
    keys: np.ndarray, numkeys: np.ndarray, dims: npt.NDArray[np.int64]
) -> tuple[Keys, npt.NDArray[np.int64], int, npt.NDArray[np.intp]]:
    """The rows of a checked batched request (``keys`` ``[rows, n]``, ``numkeys``
    ``[rows, tables]``, each row's counts adding up to ``n``; ``dims``: each table's vector
    size) as one lookup: ``(flat_keys, keys_per_table, unit, index)``.

    ``flat_keys`` holds the keys table after table, each table's row after row;
    ``keys_per_table`` is ``numkeys`` summed over the rows. Viewed as blocks of ``unit``
    floats (the tables' common divisor), the lookup's answer ``out`` puts the request's
    answer in request order at ``out.reshape(-1, unit)[index]``.
    """
    counts = numkeys.astype(np.int64)
    moves = _table_major_index(counts, np.ones_like(dims))
    flat = np.empty(keys.size, dtype=keys.dtype)
    flat[moves] = keys.reshape(-1)
    unit = int(np.gcd.reduce(dims))
    sizes = dims // unit
    index = moves if bool((sizes == 1).all()) else _table_major_index(counts, sizes)
    return flat, counts.sum(axis=0), unit, index


def c_order(array: Array) -> Array:
    """``array`` as Triton's stub takes an output (``Tensor.from_dlpack``): C-contiguous,
    with the strides of C order also where it holds nothing. NumPy gives some empty arrays
    strides of 0 (``np.stack`` of empty rows: ``(0, 0)``), which the stub refuses as "not
    contiguous"; a ``(B, 0)`` answer must look like the ``(1, 0)`` one a request of one row
    without keys gets."""
    xp = array_module(array)
    if array.size:
        return xp.ascontiguousarray(array)
    return xp.empty(0, dtype=array.dtype).reshape(array.shape)


@dataclass(frozen=True)
class CTRBatch:
    """A parsed CTR request: ``batch`` samples of dense features and keys per table."""

    batch: int
    dense: npt.NDArray[np.float32]  # [batch, num_dense]
    keys: Keys  # flat, table-major, as CATCOLUMN
    num_keys: npt.NDArray[np.int64]  # keys per table
    offsets: npt.NDArray[np.int64]  # [tables, batch + 1] CSR row offsets within each table


def parse_ctr_request(
    des: np.ndarray,
    catcolumn: np.ndarray,
    rowindex: np.ndarray,
    num_tables: int,
    num_dense: int,
    max_samples: int = 0,
) -> CTRBatch:
    """Validate HugeCTR's CTR inputs (``DES``, ``CATCOLUMN``, ``ROWINDEX``), batch size 1.

    ``ROWINDEX`` holds, table after table, the ``batch + 1`` CSR offsets of each sample's
    keys within that table's part of ``CATCOLUMN`` (tables in the model's order). At least
    one sample, at most ``max_samples`` (the model's ``max_batch_size``; 0: no limit); dense
    features must be finite.
    """
    _check("DES", des, "FP32")
    _check("CATCOLUMN", catcolumn, "INT64")
    _check("ROWINDEX", rowindex, "INT32")
    if not des.shape[0] == catcolumn.shape[0] == rowindex.shape[0] == 1:
        raise ShapeError("DES, CATCOLUMN and ROWINDEX must have batch dimension 1 ([1, n])")
    rows = rowindex[0].astype(np.int64)
    expected = f"tables ({num_tables}) x (samples + 1) offsets"
    if rows.size < 2 * num_tables:
        raise ShapeError(
            f"ROWINDEX has {rows.size} offsets, too few for a sample: a CTR request needs at "
            f"least one sample, {expected}"
        )
    if rows.size % num_tables:
        raise ShapeError(f"ROWINDEX has {rows.size} offsets; expected {expected}")
    batch = rows.size // num_tables - 1
    if max_samples and batch > max_samples:
        raise BatchTooLargeError(
            f"{batch:,} samples exceed the model's max_batch_size of {max_samples:,}"
        )
    offsets = rows.reshape(num_tables, batch + 1)
    if (offsets[:, 0] != 0).any() or (np.diff(offsets, axis=1) < 0).any():
        raise ShapeError("ROWINDEX offsets of each table must start at 0 and never decrease")
    num_keys = offsets[:, -1]
    keys = catcolumn[0]
    if int(num_keys.sum()) != keys.size:
        raise ShapeError(
            f"ROWINDEX accounts for {int(num_keys.sum())} keys but CATCOLUMN has {keys.size}"
        )
    if des[0].size != batch * num_dense:
        raise ShapeError(
            f"DES has {des[0].size} values; expected {batch} samples x {num_dense} dense features"
        )
    dense = des[0].reshape(batch, num_dense)
    finite = np.isfinite(dense)
    if not finite.all():
        first = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise InvalidValueError(
            f"DES has {int((~finite).sum())} NaN or infinite values (the first in sample "
            f"{first}); dense features must be finite"
        )
    return CTRBatch(batch, dense, keys, num_keys, offsets)


def error_reply(exc: BaseException) -> tuple[str, str]:
    """The message and Triton error code a failed request is answered with
    (:func:`hps.errors.triton_code`: the mapping the control plane's HTTP statuses share)."""
    return f"{type(exc).__name__}: {exc}", triton_code(exc)
