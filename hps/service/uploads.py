"""Import sources: uploads staged to disk, or server-side paths; validated before any write.

Layout of a staged source (a folder): ``key`` + ``emb_vector`` (a HugeCTR sparse model) or
``keys.npy`` + ``vectors.npy``. :func:`validate` reads the whole input once (in chunks):
sizes, dtypes, dimension and finite values, so that a bad input is refused with a 4xx before
anything is written.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from hps.errors import FormatError, InvalidValueError, RequestError
from hps.io.npy import npy_rows, read_npy_pair
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model, sparse_model_rows
from hps.types import Keys, TableSpec, Vectors

Format = Literal["sparse", "npy"]
NPY_FILES = ("keys.npy", "vectors.npy")
COPY_CHUNK = 1 << 20
CHUNK_ROWS = 1 << 16  # rows per write: bounds the memory of an import of any size


def names(fmt: Format) -> tuple[str, str]:
    return (KEY_FILE, VECTOR_FILE) if fmt == "sparse" else NPY_FILES


def stage(folder: Path, fmt: Format, keys: BinaryIO, vectors: BinaryIO) -> Path:
    """Copy two uploaded files (already spooled to disk) into ``folder``, in chunks."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in zip(names(fmt), (keys, vectors), strict=True):
        src.seek(0)
        with open(folder / name, "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_CHUNK)
    return folder


def source_folder(fmt: Format, path: str) -> Path:
    folder = Path(path)
    missing = [n for n in names(fmt) if not (folder / n).is_file()]
    if missing:
        raise FormatError(f"{path}: missing {missing} for format {fmt!r}")
    return folder


def rows(folder: Path, fmt: Format, spec: TableSpec) -> int:
    if fmt == "sparse":
        return sparse_model_rows(folder, spec.dim)
    return npy_rows(folder / NPY_FILES[0], folder / NPY_FILES[1], spec.dim)


def chunks(folder: Path, fmt: Format, spec: TableSpec) -> Iterator[tuple[Keys, Vectors]]:
    if fmt == "sparse":
        return read_sparse_model(folder, spec.dim, CHUNK_ROWS)
    return read_npy_pair(folder / NPY_FILES[0], folder / NPY_FILES[1], spec.dim, CHUNK_ROWS)


def validate(folder: Path, fmt: Format, spec: TableSpec) -> int:
    """Row count of a source that is whole and loadable; FormatError/RequestError otherwise."""
    total = rows(folder, fmt, spec)
    if total == 0:
        raise RequestError(f"{spec.name}: the input holds no rows")
    done = 0
    for keys, vectors in chunks(folder, fmt, spec):
        bad = ~np.isfinite(vectors).all(axis=1)
        if bad.any():
            row = done + int(np.flatnonzero(bad)[0])
            key = int(keys[row - done])
            raise InvalidValueError(f"{spec.name}: row {row} (key {key}) is not finite")
        done += keys.size
    if done != total:
        raise FormatError(f"{spec.name}: {done} rows read, {total} announced (truncated input)")
    return total
