"""Key/vector pairs as two ``.npy`` files, read and written in chunks, never whole."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from hps.errors import FormatError
from hps.io.table_files import Column, Stat, TableFiles, TableWriter
from hps.types import Keys, Vectors

MAX_HEADER_BYTES = 10_000
"""The longest .npy header read (numpy's own limit, ``max_header_size``: its parsing of a
longer one is not safe); ``np.save`` writes 128 bytes for a table's arrays."""


def _open(path: Path) -> tuple[BinaryIO, Stat, tuple[int, ...], np.dtype[np.generic]]:
    """Open a .npy file positioned at its data; returns (file, its stat, shape, dtype)."""
    f, st = Column.open(path, FormatError)
    try:
        major, _ = np.lib.format.read_magic(f)
        _check_header_length(f, path, major, st[2])
        read_header = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(f)
    except (ValueError, OSError) as exc:
        f.close()
        raise FormatError(f"{path}: not a .npy file: {' '.join(str(exc).split())}") from None
    except FormatError:
        f.close()
        raise
    if fortran:
        f.close()
        raise FormatError(f"{path}: Fortran-ordered arrays are not supported")
    if any(n < 0 for n in shape):
        f.close()
        raise FormatError(f"{path}: the header's shape {shape} has a negative length")
    return f, st, shape, dtype


def _check_header_length(f: BinaryIO, path: Path, major: int, size: int) -> None:
    """FormatError, before the header is read (numpy reads as many bytes as it declares),
    when the header's declared length is more than the file holds or than numpy reads
    safely; ``f`` is left where it was (after the magic string)."""
    start = f.tell()
    field = "<H" if major == 1 else "<I"  # versions 2 and 3: 4 bytes
    raw = f.read(struct.calcsize(field))
    f.seek(start)
    if len(raw) < struct.calcsize(field):
        return  # numpy names the short file
    (length,) = struct.unpack(field, raw)
    if start + len(raw) + length > size:
        raise FormatError(
            f"{path}: not a .npy file: its header declares {length:,} bytes, more than the "
            f"file's {size:,}"
        )
    if length > MAX_HEADER_BYTES:
        raise FormatError(
            f"{path}: a .npy header of {length:,} bytes, more than the {MAX_HEADER_BYTES:,} "
            "read safely"
        )


def _check_size(column: Column, shape: tuple[int, ...]) -> None:
    """FormatError unless the file (as opened: ``fstat``) is exactly its header and the
    data the header declares: a header that promises more rows than the file holds (or
    fewer) is refused before anything is read or allocated."""
    want = column.offset + math.prod(shape) * column.dtype.itemsize
    size = column.opened[2]
    if size != want:
        raise FormatError(
            f"{column.path}: the header declares {column.dtype}{shape}, so {want} bytes "
            f"({column.offset} of header), but the file has {size} bytes"
        )


def open_npy_pair(keys_path: str | Path, vectors_path: str | Path, dim: int) -> TableFiles:
    """The pair opened, its headers checked (FormatError): 1-D integer keys, float
    vectors ``(n, dim)``, as many of each, no negative length, and each file exactly the
    size its header declares."""
    kpath, vpath = Path(keys_path), Path(vectors_path)
    with ExitStack() as opened:
        kf, kst, kshape, kdtype = _open(kpath)
        opened.callback(kf.close)
        vf, vst, vshape, vdtype = _open(vpath)
        opened.callback(vf.close)
        if len(kshape) != 1 or kdtype.kind not in "iu":
            raise FormatError(f"{kpath}: keys must be a 1-D integer array, got {kdtype}{kshape}")
        if len(vshape) != 2 or vshape[1] != dim or vdtype.kind != "f":
            raise FormatError(f"{vpath}: vectors must be float (n, {dim}), got {vdtype}{vshape}")
        if vshape[0] != kshape[0]:
            raise FormatError(f"{kpath}: {kshape[0]} keys but {vshape[0]} vectors")
        keys = Column(kpath, kf, kf.tell(), kdtype, 1, FormatError, kst)
        vectors = Column(vpath, vf, vf.tell(), vdtype, dim, FormatError, vst)
        _check_size(keys, kshape)
        _check_size(vectors, vshape)
        opened.pop_all()
    return TableFiles(keys, vectors, int(kshape[0]))


def npy_rows(keys_path: str | Path, vectors_path: str | Path, dim: int) -> int:
    """Validate a key/vector pair and return its row count."""
    with open_npy_pair(keys_path, vectors_path, dim) as files:
        return files.rows


def read_npy_pair(
    keys_path: str | Path, vectors_path: str | Path, dim: int, chunk_rows: int | None = None
) -> Iterator[tuple[Keys, Vectors]]:
    """Yield ``(keys as int64, vectors as float32)`` chunks (of ``chunk_rows`` rows, by
    default sized by bytes: :func:`hps.io.chunks.rows_per_chunk`); a file that ends early
    (truncated meanwhile) is a FormatError naming it and the row."""
    with open_npy_pair(keys_path, vectors_path, dim) as files:
        yield from files.chunks(chunk_rows)


class NpyPairWriter(TableWriter):
    """Write (keys, vectors) chunks as a ``.npy`` pair: int64 keys ``(n,)``, vectors of
    ``dtype`` ``(n, width)``, at exactly the paths given (no ``.npy`` appended), replaced
    only once complete (:class:`hps.io.table_files.TableWriter`). One pass, one chunk in
    memory: each header is written for 0 rows first and rewritten in place for the rows
    written at the end (numpy pads a header so that the length of its first axis can grow
    to any count in place)."""

    def __init__(
        self, keys_path: str | Path, vectors_path: str | Path, dtype: npt.DTypeLike, width: int
    ) -> None:
        super().__init__(Path(keys_path), Path(vectors_path), dtype, width)
        self._width = width
        self._data_at = (0, 0)  # where each file's data begins, after its header

    def _headers(self, rows: int) -> tuple[tuple[np.dtype[np.generic], tuple[int, ...]], ...]:
        return (np.dtype("<i8"), (rows,)), (self.dtype, (rows, self._width))

    def _begin(self, keys: BinaryIO, vectors: BinaryIO) -> None:
        for f, (dtype, shape) in zip((keys, vectors), self._headers(0), strict=True):
            _write_header(f, dtype, shape)
        self._data_at = keys.tell(), vectors.tell()

    def _end(self, keys: BinaryIO, vectors: BinaryIO) -> None:
        for f, (dtype, shape), at in zip(
            (keys, vectors), self._headers(self.rows), self._data_at, strict=True
        ):
            f.seek(0)
            _write_header(f, dtype, shape)
            assert f.tell() == at, "numpy pads a header for its first axis to grow"


def _write_header(f: BinaryIO, dtype: np.dtype[np.generic], shape: tuple[int, ...]) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(f, header)
