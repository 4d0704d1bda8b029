"""Keyset files (as HugeCTR's embedding training cache wrote them): raw native-endian int64
keys, no header, no separators."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps.errors import FormatError
from hps.types import Keys


def read_keyset(path: str | Path) -> Keys:
    path = Path(path)
    size = path.stat().st_size
    if size % 8:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int64 keys")
    return np.fromfile(path, dtype=np.int64)


def write_keyset(path: str | Path, keys: Keys) -> None:
    np.ascontiguousarray(keys, dtype=np.int64).tofile(Path(path))
