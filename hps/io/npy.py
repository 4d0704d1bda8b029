"""Key/vector pairs as two ``.npy`` files, streamed without mapping the whole file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hps.errors import FormatError
from hps.types import Keys, Vectors


def _open(path: Path) -> tuple[BinaryIO, tuple[int, ...], np.dtype[np.generic]]:
    """Open a .npy file positioned at its data; returns (file, shape, dtype)."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
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
    return f, shape, dtype


def npy_rows(keys_path: str | Path, vectors_path: str | Path, dim: int) -> int:
    """Validate a key/vector pair and return its row count."""
    kf, kshape, kdtype = _open(Path(keys_path))
    vf, vshape, vdtype = _open(Path(vectors_path))
    kf.close()
    vf.close()
    if len(kshape) != 1 or kdtype.kind not in "iu":
        raise FormatError(f"{keys_path}: keys must be a 1-D integer array, got {kdtype}{kshape}")
    if len(vshape) != 2 or vshape[1] != dim or vdtype.kind != "f":
        raise FormatError(f"{vectors_path}: vectors must be float (n, {dim}), got {vdtype}{vshape}")
    if vshape[0] != kshape[0]:
        raise FormatError(f"{keys_path}: {kshape[0]} keys but {vshape[0]} vectors")
    return int(kshape[0])


def read_npy_pair(
    keys_path: str | Path, vectors_path: str | Path, dim: int, chunk_rows: int = 1 << 18
) -> Iterator[tuple[Keys, Vectors]]:
    rows = npy_rows(keys_path, vectors_path, dim)
    kf, _, kdtype = _open(Path(keys_path))
    vf, _, vdtype = _open(Path(vectors_path))
    with kf, vf:
        for lo in range(0, rows, chunk_rows):
            n = min(chunk_rows, rows - lo)
            k = np.frombuffer(kf.read(n * kdtype.itemsize), dtype=kdtype)
            v = np.frombuffer(vf.read(n * dim * vdtype.itemsize), dtype=vdtype)
            if k.size != n or v.size != n * dim:
                raise FormatError(f"{keys_path}: truncated at row {lo}")
            yield _int64_keys(k, keys_path, lo), v.reshape(n, dim).astype(np.float32, copy=False)


def _int64_keys(k: np.ndarray, path: str | Path, first_row: int) -> Keys:
    """``k`` as int64; FormatError for an unsigned key beyond int64 (a cast would wrap it
    into another, negative key)."""
    if k.dtype == np.uint64 and k.size:
        above = np.flatnonzero(k > np.iinfo(np.int64).max)
        if above.size:
            row = int(above[0])
            raise FormatError(
                f"{path}: key {int(k[row])} at row {first_row + row} does not fit in int64 "
                f"({above.size} such keys in rows {first_row}-{first_row + k.size - 1})"
            )
    return k.astype(np.int64)
