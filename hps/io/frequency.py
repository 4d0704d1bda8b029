"""Frequency files (``.npz`` of ``keys`` and ``counts``) and access logs, for L1 warm-up.

A frequency file names the hottest keys of a table; ``hps freq`` builds one from an access
log (a keyset-format file of int64 keys with repeats).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt

from hps.errors import FormatError
from hps.io.table_files import int64_keys
from hps.types import Keys

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip
_DAMAGED: tuple[type[Exception], ...] = (
    OSError,  # cannot be read
    ValueError,  # an array's .npy header, pickled data
    EOFError,  # an array's data cut short
    KeyError,  # a member the directory names but cannot be found
    zipfile.BadZipFile,  # no zip directory, a bad CRC
    zlib.error,  # compressed data that does not inflate
    NotImplementedError,  # a compression method zipfile lacks
    RuntimeError,  # an encrypted member
)
"""What reading a damaged ``.npz`` raises (numpy and :mod:`zipfile`): a FormatError."""


def write_frequency_file(path: str | Path, keys: npt.ArrayLike, counts: npt.ArrayLike) -> None:
    """Write ``keys`` and their ``counts`` as a frequency file (``.npz``, exactly at ``path``)."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts).reshape(-1)
    if keys.size != counts.size:
        raise FormatError(f"{path}: {keys.size} keys but {counts.size} counts")
    with open(path, "wb") as f:
        np.savez(f, keys=keys, counts=counts)


def read_frequency_file(path: str | Path) -> tuple[Keys, np.ndarray]:
    """``(keys, counts)`` of a frequency file; FormatError names what is wrong: not an
    ``.npz`` (a plain ``.npy`` array, anything else), a damaged archive, missing arrays."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(np.lib.format.MAGIC_PREFIX))
            if not magic.startswith(_ZIP_MAGIC):
                what = (
                    "a plain .npy array"
                    if magic == np.lib.format.MAGIC_PREFIX
                    else "not a zip archive"
                )
                raise FormatError(f"{path}: not a frequency file (.npz with keys, counts): {what}")
            f.seek(0)
            data = np.load(f, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):  # np.load decides by the same magic
                raise FormatError(f"{path}: not a frequency file (.npz with keys, counts)")
            with data:
                if "keys" not in data or "counts" not in data:
                    raise FormatError(f"{path}: a frequency file needs arrays 'keys' and 'counts'")
                keys, counts = data["keys"], data["counts"]
    except _DAMAGED as exc:
        raise FormatError(
            f"{path}: not a frequency file (.npz with keys, counts): {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(keys, np.ndarray) or not isinstance(counts, np.ndarray):  # raw bytes
        raise FormatError(f"{path}: 'keys' and 'counts' must be .npy arrays in the .npz")
    if keys.ndim != 1 or counts.shape != keys.shape:
        raise FormatError(f"{path}: keys {keys.shape} and counts {counts.shape} must be 1-D, equal")
    if keys.dtype.kind not in "iu" or counts.dtype.kind not in "iuf":
        raise FormatError(f"{path}: keys must be integers and counts numbers")
    return int64_keys(keys, path, 0), counts


def count_access_log(path: str | Path, chunk_keys: int = 1 << 22) -> tuple[Keys, np.ndarray]:
    """Distinct keys of an access log (a keyset-format file with repeats) and their counts."""
    size = os.path.getsize(path)
    if size % 8:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int64 keys")
    keys, counts = np.empty(0, np.int64), np.empty(0, np.int64)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_keys * 8):
            k, c = np.unique(np.frombuffer(chunk, dtype=np.int64), return_counts=True)
            merged, inverse = np.unique(np.concatenate([keys, k]), return_inverse=True)
            total = np.zeros(merged.size, dtype=np.int64)
            np.add.at(total, inverse, np.concatenate([counts, c]))
            keys, counts = merged, total
    return keys, counts
