"""Keyset files (as HugeCTR's embedding training cache wrote them): raw native-endian int64
keys, no header, no separators."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps.errors import BatchTooLargeError, FormatError
from hps.types import Keys


def read_keyset(path: str | Path, max_keys: int | None = None) -> Keys:
    """The keys of a keyset file; BatchTooLargeError, before anything is read, when it holds
    more than ``max_keys``."""
    path = Path(path)
    size = path.stat().st_size
    if size % 8:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int64 keys")
    if max_keys is not None and size // 8 > max_keys:
        raise BatchTooLargeError(f"{path}: {size // 8:,} keys, more than the {max_keys:,} allowed")
    return np.fromfile(path, dtype=np.int64)


def write_keyset(path: str | Path, keys: Keys) -> None:
    np.ascontiguousarray(keys, dtype=np.int64).tofile(Path(path))
