"""Keyset files (as HugeCTR's embedding training cache wrote them): raw native-endian int64
keys, no header, no separators."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hps.errors import BatchTooLargeError, FormatError
from hps.types import Keys

CHUNK_KEYS = 1 << 20
"""Keys :func:`first_keys` reads at a time (8 MiB)."""


def read_keyset(path: str | Path, max_keys: int | None = None, *, setting: str = "") -> Keys:
    """The keys of a keyset file; BatchTooLargeError, before anything is read, when it holds
    more than ``max_keys``. With ``setting`` (the configuration key that named the file), a
    file that cannot be read (missing, a folder) is a FormatError naming it and the path;
    without, the OSError (a caller that must not show the path says what it wants)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = _key_bytes(f, path)
            if max_keys is not None and size // 8 > max_keys:
                raise BatchTooLargeError(
                    f"{path}: {size // 8:,} keys, more than the {max_keys:,} allowed"
                )
            return np.fromfile(f, dtype=np.int64)
    except OSError as exc:
        if not setting:
            raise
        raise _unreadable(path, setting, exc) from None


def first_keys(
    path: str | Path,
    count: int,
    *,
    exclude: Keys | None = None,
    setting: str = "",
    chunk_keys: int | None = None,
) -> Keys:
    """The first ``count`` distinct keys of a keyset file, in the order of their first
    occurrence, leaving out ``exclude``: what ``first_occurrences(keys[~isin(keys,
    exclude)])[:count]`` of the whole file gives, read ``chunk_keys`` (default
    :data:`CHUNK_KEYS`) at a time and no further than needed, so a file far larger than
    ``count`` costs memory for ``count`` keys and one chunk. Errors as :func:`read_keyset`'s."""
    path = Path(path)
    chunk_keys = CHUNK_KEYS if chunk_keys is None else chunk_keys
    # the keys to leave out, sorted: ``exclude``, then also those found
    skip = np.unique(np.asarray([] if exclude is None else exclude, dtype=np.int64))
    parts: list[Keys] = []  # distinct keys of each chunk, in order of first occurrence
    have = 0
    try:
        with open(path, "rb") as f:
            _key_bytes(f, path)
            while have < count:
                chunk = _read_chunk(f, chunk_keys)
                if chunk.size == 0:
                    break
                chunk = chunk[~_in_sorted(chunk, skip)]
                _, first = np.unique(chunk, return_index=True)
                parts.append(chunk[np.sort(first)])
                have += first.size
                if have < count:  # chunk[first] is sorted: merged into skip
                    skip = np.insert(skip, np.searchsorted(skip, chunk[first]), chunk[first])
    except OSError as exc:
        if not setting:
            raise
        raise _unreadable(path, setting, exc) from None
    found = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return found[: max(0, count)]


def write_keyset(path: str | Path, keys: Keys) -> None:
    np.ascontiguousarray(keys, dtype=np.int64).tofile(Path(path))


def _read_chunk(f: BinaryIO, n: int) -> Keys:
    """The next ``n`` keys of ``f`` (fewer at its end)."""
    return np.fromfile(f, dtype=np.int64, count=n)


def _key_bytes(f: BinaryIO, path: Path) -> int:
    size = os.fstat(f.fileno()).st_size
    if size % 8:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int64 keys")
    return size


def _unreadable(path: Path, setting: str, exc: OSError) -> FormatError:
    return FormatError(f"{setting} {path}: cannot read: {exc.strerror or exc}")


def _in_sorted(keys: Keys, ordered: Keys) -> np.ndarray:
    """Mask of ``keys`` found in the sorted ``ordered``."""
    if ordered.size == 0:
        return np.zeros(keys.size, dtype=bool)
    pos = np.minimum(np.searchsorted(ordered, keys), ordered.size - 1)
    return np.asarray(ordered[pos] == keys)
