"""A table's two files, keys and vectors, opened once and read by offset.

Every pass over one :class:`TableFiles` (validation, the load, a sample) reads the same
files: a path replaced meanwhile (a trainer publishing a retrain) is not seen, and the
files' stamp is that of the opened ones (``fstat``). After a pass,
:meth:`TableFiles.written` tells whether the opened files were written meanwhile (what was
read may mix two versions) and :meth:`TableFiles.replaced` whether their paths now name
other files (what was read is the files as opened). A file
that ends before its rows (truncated after its size was checked) raises the format's error
naming the file and the row.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hps.errors import FormatError
from hps.types import Keys, Vectors

Stat = tuple[int, int, int, int]  # device, inode, size, mtime_ns


def file_stat(st: os.stat_result) -> Stat:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def path_stamp(paths: tuple[Path, ...]) -> list[str | int]:
    """Path, size and modification time of each file, as the paths name them now."""
    out: list[str | int] = []
    for path in paths:
        st = path.stat()
        out += [str(path), st.st_size, st.st_mtime_ns]
    return out


@dataclass
class Column:
    """One opened file's rows: ``width`` values of ``dtype`` each, from byte ``offset`` on."""

    path: Path
    file: BinaryIO
    offset: int
    dtype: np.dtype[np.generic]
    width: int
    error: type[FormatError]
    opened: Stat  # fstat when opened

    @classmethod
    def open(cls, path: Path, error: type[FormatError]) -> tuple[BinaryIO, Stat]:
        """``path`` opened for reading, and its stat; ``error`` when it cannot be read."""
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc.strerror}") from None
        return f, file_stat(os.fstat(f.fileno()))

    def read(self, lo: int, n: int) -> np.ndarray:
        """Rows ``lo`` to ``lo + n`` (flat: ``n * width`` values)."""
        row = self.width * self.dtype.itemsize
        buf = bytearray(n * row)
        view = memoryview(buf)
        got = 0
        while got < len(buf):
            k = os.preadv(self.file.fileno(), [view[got:]], self.offset + lo * row + got)
            if k == 0:
                raise self.error(
                    f"{self.path}: ends in row {lo + got // row}, before its last row "
                    f"{lo + n - 1} (truncated while it was read: rewritten in place?)"
                )
            got += k
        return np.frombuffer(buf, self.dtype)

    def stamp(self) -> list[str | int]:
        return [str(self.path), self.opened[2], self.opened[3]]

    def written(self) -> bool:
        """Whether the opened file was written (its size or time) since it was opened."""
        return file_stat(os.fstat(self.file.fileno())) != self.opened

    def replaced(self) -> bool:
        """Whether the path now names another file (or none) than the one opened."""
        try:
            return file_stat(self.path.stat()) != self.opened
        except OSError:
            return True


@dataclass
class TableFiles:
    """The keys and vectors of ``rows`` rows, opened (a context manager: closed at its end)."""

    keys: Column
    vectors: Column
    rows: int

    def key_chunk(self, lo: int, n: int) -> Keys:
        return int64_keys(self.keys.read(lo, n), self.keys.path, lo)

    def vector_chunk(self, lo: int, n: int) -> Vectors:
        flat = self.vectors.read(lo, n)
        return flat.reshape(n, self.vectors.width).astype(np.float32, copy=False)

    def keys_at(self, at: np.ndarray) -> Keys:
        """The keys of rows ``at`` (a sample: one read each)."""
        return np.concatenate([self.key_chunk(int(i), 1) for i in at])

    def vectors_at(self, at: np.ndarray) -> Vectors:
        """The vectors of rows ``at`` (a sample: one read each)."""
        return np.concatenate([self.vector_chunk(int(i), 1) for i in at])

    def chunks(self, chunk_rows: int) -> Iterator[tuple[Keys, Vectors]]:
        """``(keys, vectors)`` chunks of ``chunk_rows`` rows, in file order."""
        for lo in range(0, self.rows, chunk_rows):
            n = min(chunk_rows, self.rows - lo)
            yield self.key_chunk(lo, n), self.vector_chunk(lo, n)

    def key_chunks(self, chunk_rows: int) -> Iterator[tuple[int, Keys]]:
        """``(first row, keys)`` chunks of the keys file alone."""
        for lo in range(0, self.rows, chunk_rows):
            yield lo, self.key_chunk(lo, min(chunk_rows, self.rows - lo))

    def stamp(self) -> list[str | int]:
        """Path, size and modification time of each file as opened (``fstat``)."""
        return self.keys.stamp() + self.vectors.stamp()

    def written(self) -> list[Path]:
        """The files written since they were opened."""
        return [c.path for c in (self.keys, self.vectors) if c.written()]

    def replaced(self) -> list[Path]:
        """The paths that now name other files than the ones opened."""
        return [c.path for c in (self.keys, self.vectors) if c.replaced()]

    def close(self) -> None:
        self.keys.file.close()
        self.vectors.file.close()

    def __enter__(self) -> TableFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def int64_keys(k: np.ndarray, path: str | Path, first_row: int) -> Keys:
    """``k`` as int64; FormatError for an unsigned key beyond int64 (a cast would wrap it
    into another, negative key). Any byte order: ``>u8`` as ``<u8``; narrower integers and
    signed ones of 8 bytes always fit."""
    if k.dtype.kind == "u" and k.dtype.itemsize >= 8 and k.size:
        above = np.flatnonzero(k > np.iinfo(np.int64).max)
        if above.size:
            row = int(above[0])
            raise FormatError(
                f"{path}: key {int(k[row])} at row {first_row + row} does not fit in int64 "
                f"({above.size} such keys in rows {first_row}-{first_row + k.size - 1})"
            )
    return k.astype(np.int64, copy=False)
