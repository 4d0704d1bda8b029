"""Row formats: how a table's rows are stored in every tier (``hps_row_dtype``).

A table's format is decided once (its :class:`hps.types.TableSpec`'s ``row_dtype``) and a
stored row keeps it in L1, every L2 backend, L3 and the shared-memory map: rows move between
tiers unchanged, never re-quantized. float32 exists only at the edges: imports, Kafka
updates and control-plane writes are encoded where they enter (:meth:`RowFormat.encode`), and
lookups decode into the float32 response (the L1 kernels in the same pass as the gather,
rows from below L1 with :meth:`RowFormat.decode`).

========  =================  ==================================  ============================
format    stored element     one row of dimension ``d``          what it loses
========  =================  ==================================  ============================
float32   ``float32`` × d    4·d bytes                           nothing
float16   ``float16`` × d    2·d bytes                           relative error ≤ 2⁻¹¹ in
                                                                 float16's normal range;
                                                                 |x| > 65504 is refused
int8      ``uint8`` × (d+8)  d codes, then the row's scale and   |x − x̂| ≤ (max − min) / 510
                             offset as float32 (FBGEMM's 8-bit   per element (half a step of
                             rowwise layout): d + 8 bytes        the row's 255 steps); rows
                                                                 with max − min beyond
                                                                 float32's range are refused
========  =================  ==================================  ============================

int8 is row-wise affine: ``x̂ = code · scale + offset`` with ``offset = min(row)`` and
``scale = (max(row) − min(row)) / 255``; a constant row is stored exactly (scale 0). The
bound holds up to float32 rounding of the decode (a few ulp of the row's largest value), for
rows whose step is a normal float32 (max − min ≥ 3·10⁻³⁶); narrower rows stay within their range.
Encoding a decoded int8 row gives back the stored row (an ``hps export`` imported again, a
table moved between tiers as float32): a row on an int8 grid keeps the scale it was decoded
with, which the one computed from its decoded maximum can miss by an ulp or two.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from hps.errors import InvalidValueError

RowDtype = Literal["float32", "float16", "int8"]
ROW_DTYPES: tuple[RowDtype, ...] = get_args(RowDtype)

Stored = npt.NDArray[np.generic]
"""Rows in a table's stored form: ``(n, width)`` of the format's element dtype."""
Floats = npt.NDArray[np.float32]

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT8_EXTRA = 8  # bytes after the codes: float32 scale, float32 offset
INT8_STEPS = 255


class RowFormat:
    """One row format: its stored element dtype and width, encode and decode (see module)."""

    name: RowDtype = "float32"
    dtype: np.dtype[np.generic] = np.dtype(np.float32)

    def width(self, dim: int) -> int:
        """Stored elements per row of dimension ``dim``."""
        return dim

    def row_bytes(self, dim: int) -> int:
        """Bytes of one stored row of dimension ``dim``."""
        return self.width(dim) * self.dtype.itemsize

    def empty(self, n: int, dim: int) -> Stored:
        """Room for ``n`` rows: uninitialised for float32 (it needs no decode); zeroed for the
        other formats, so a row never written decodes to zeros (an int8 row of garbage bytes
        could hold an infinite scale) and a decode over a whole buffer stays finite."""
        shape = (n, self.width(dim))
        make = np.empty if self.name == "float32" else np.zeros
        return make(shape, self.dtype)

    def check(self, values: Floats) -> None:
        """InvalidValueError when finite float32 ``(n, dim)`` rows cannot be stored in this
        format (what :meth:`encode` raises, without encoding): the limits of the table
        above. What validates a batch before anything of it is written."""

    def encode(self, values: Floats) -> Stored:
        """float32 ``(n, dim)`` rows in this format (the same array for float32)."""
        return np.ascontiguousarray(values, dtype=np.float32)

    def decode(self, stored: Stored, dim: int) -> Floats:
        """Stored rows ``(n, width)`` back to float32 ``(n, dim)``."""
        return np.asarray(stored, dtype=np.float32)

    def from_bytes(self, buf: bytes | bytearray | memoryview, dim: int) -> Stored:
        """Stored rows from their raw bytes (what the byte-keeping tiers hold)."""
        return np.frombuffer(buf, dtype=self.dtype).reshape(-1, self.width(dim))

    def __repr__(self) -> str:
        return f"RowFormat({self.name})"


class _Float16(RowFormat):
    name: RowDtype = "float16"
    dtype = np.dtype(np.float16)

    def check(self, values: Floats) -> None:
        values = np.asarray(values, dtype=np.float32)
        if not values.size or max(float(values.max()), -float(values.min())) <= FLOAT16_MAX:
            return
        over = np.abs(values) > FLOAT16_MAX
        raise InvalidValueError(
            f"{int(over.sum())} value(s) outside float16's range (|x| <= {FLOAT16_MAX:g}; "
            f"largest |x| {float(np.abs(values).max()):g}): store this table as float32 "
            "or int8 (hps_row_dtype)"
        )

    def encode(self, values: Floats) -> Stored:
        values = np.asarray(values, dtype=np.float32)
        self.check(values)
        return values.astype(np.float16)

    def decode(self, stored: Stored, dim: int) -> Floats:
        return np.asarray(stored, dtype=np.float16).astype(np.float32)


class _Int8(RowFormat):
    name: RowDtype = "int8"
    dtype = np.dtype(np.uint8)

    def width(self, dim: int) -> int:
        return dim + INT8_EXTRA

    def check(self, values: Floats) -> None:
        values = np.asarray(values, dtype=np.float32)
        if values.size:
            self._span(values)

    def _span(self, values: Floats) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Each row's min and max (float64); InvalidValueError for a row too wide."""
        lo = values.min(axis=1).astype(np.float64)
        hi = values.max(axis=1).astype(np.float64)
        wide = hi - lo > FLOAT32_MAX
        if wide.any():  # code * scale would overflow float32 in the decode
            raise InvalidValueError(
                f"{int(wide.sum())} row(s) span more than float32's range (max - min > "
                f"{FLOAT32_MAX:g}): int8 cannot store them; store this table as float32"
            )
        return lo, hi

    def encode(self, values: Floats) -> Stored:
        values = np.asarray(values, dtype=np.float32)
        n, dim = values.shape
        out = np.empty((n, dim + INT8_EXTRA), dtype=np.uint8)
        if n == 0:
            return out
        lo, hi = self._span(values)
        scale = ((hi - lo) / INT8_STEPS).astype(np.float32)  # float64 first: no overflow
        step = scale.astype(np.float64)
        inv = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
        steps = (values - lo[:, None]) * inv[:, None]
        codes = np.rint(steps)
        out[:, :dim] = np.clip(codes, 0, INT8_STEPS)
        grid = _on_grid(steps, codes) & (step > 0)
        if grid.any():
            scale[grid] = _decoded_with(values[grid], out[grid, :dim], lo[grid], scale[grid])
        tail = out[:, dim:].view(np.float32)  # (n, 2): scale, offset
        tail[:, 0] = scale
        tail[:, 1] = lo + 0.0  # -0.0 as 0.0: what decoding it gives back
        return out

    def decode(self, stored: Stored, dim: int) -> Floats:
        codes: npt.NDArray[np.uint8] = np.ascontiguousarray(stored, dtype=np.uint8)
        tail = codes[:, dim : dim + INT8_EXTRA].copy().view(np.float32)
        return codes[:, :dim] * tail[:, :1] + tail[:, 1:2]


Floats64 = npt.NDArray[np.float64]
GRID_SLACK = 1e-3
"""A row whose every value is this close (in steps) to a code may be a decoded int8 row; a
nearby scale is taken only where it decodes the row exactly, so a row that merely looks so
(rows of dimension 1 or 2 always do) loses nothing."""
NEAR_ULPS = (1, -1, 2, -2, 3, -3, 4, -4)


def _on_grid(
    steps: npt.NDArray[np.float64], codes: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Rows whose every value is within :data:`GRID_SLACK` steps of its code, narrowed
    column by column: past the first few columns hardly a row of another kind is left."""
    rows = np.arange(len(steps))
    for j in range(steps.shape[1]):
        rows = rows[np.abs(steps[rows, j] - codes[rows, j]) < GRID_SLACK]
        if not rows.size:
            break
    grid = np.zeros(len(steps), np.bool_)
    grid[rows] = True
    return grid


def _decoded_with(
    values: Floats, codes: npt.NDArray[np.uint8], lo: npt.NDArray[np.float64], scale: Floats
) -> Floats:
    """For rows on an int8 grid: the scale within :data:`NEAR_ULPS` of ``scale`` whose decode
    (as :meth:`_Int8.decode` computes it) gives ``values`` back exactly, else ``scale``."""
    offset = lo.astype(np.float32)[:, None]
    exact = (codes * scale[:, None] + offset == values).all(axis=1)
    out = scale.copy()
    with np.errstate(over="ignore", invalid="ignore"):  # a scale near float32's top: inf
        for ulps in NEAR_ULPS:
            if exact.all():
                break
            near = (scale.view(np.int32) + np.int32(ulps)).view(np.float32)
            hit = ~exact & (codes * near[:, None] + offset == values).all(axis=1)
            out[hit] = near[hit]
            exact |= hit
    return out


FORMATS: dict[str, RowFormat] = {
    "float32": RowFormat(),
    "float16": _Float16(),
    "int8": _Int8(),
}
FLOAT32 = FORMATS["float32"]


def row_format(name: str) -> RowFormat:
    """The format called ``name`` (one of :data:`ROW_DTYPES`)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown row format {name!r}: one of {', '.join(ROW_DTYPES)}") from None
