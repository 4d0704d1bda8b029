"""Key/vector pairs as two ``.npy`` files, streamed without mapping the whole file."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hps.errors import FormatError
from hps.io.table_files import Column, Stat, TableFiles
from hps.types import Keys, Vectors


def _open(path: Path) -> tuple[BinaryIO, Stat, tuple[int, ...], np.dtype[np.generic]]:
    """Open a .npy file positioned at its data; returns (file, its stat, shape, dtype)."""
    f, st = Column.open(path, FormatError)
    try:
        major, _ = np.lib.format.read_magic(f)
        read_header = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(f)
    except (ValueError, OSError) as exc:
        f.close()
        raise FormatError(f"{path}: not a .npy file: {exc}") from None
    if fortran:
        f.close()
        raise FormatError(f"{path}: Fortran-ordered arrays are not supported")
    if any(n < 0 for n in shape):
        f.close()
        raise FormatError(f"{path}: the header's shape {shape} has a negative length")
    return f, st, shape, dtype


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
    keys_path: str | Path, vectors_path: str | Path, dim: int, chunk_rows: int = 1 << 18
) -> Iterator[tuple[Keys, Vectors]]:
    """Yield ``(keys as int64, vectors as float32)`` chunks; a file that ends early
    (truncated meanwhile) is a FormatError naming it and the row."""
    with open_npy_pair(keys_path, vectors_path, dim) as files:
        yield from files.chunks(chunk_rows)
