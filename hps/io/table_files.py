"""A table's two files, keys and vectors, opened once and read by offset.

Every pass over one :class:`TableFiles` (validation, the load, a digest) reads the same
files: a path replaced meanwhile (a trainer publishing a retrain) is not seen, and the
files' stamp is that of the opened ones (``fstat``). After a pass,
:meth:`TableFiles.written` tells whether the opened files were written meanwhile (what was
read may mix two versions) and :meth:`TableFiles.replaced` whether their paths now name
other files (what was read is the files as opened). A file
that ends before its rows (truncated after its size was checked) raises the format's error
naming the file and the row.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from hps.errors import FormatError
from hps.io.chunks import rows_per_chunk
from hps.io.durable import replacing
from hps.types import Keys, Vectors

Stat = tuple[int, int, int, int]  # device, inode, size, mtime_ns
DIGEST_READ = 1 << 23  # bytes per read of a content digest (8 MiB)


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

    def digest_into(self, digest: hashlib.blake2b) -> None:
        """Feed the opened file's size and every byte (as opened: its size then) to
        ``digest``, reading it sequentially from the start."""
        size = self.opened[2]
        digest.update(size.to_bytes(8, "little"))
        at = 0
        while at < size:
            data = os.pread(self.file.fileno(), min(DIGEST_READ, size - at), at)
            if not data:
                raise self.error(
                    f"{self.path}: ends at byte {at}, before its {size} bytes (truncated while "
                    "it was read: rewritten in place?)"
                )
            digest.update(data)
            at += len(data)

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
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)

    def key_chunk(self, lo: int, n: int) -> Keys:
        return int64_keys(self.keys.read(lo, n), self.keys.path, lo)

    def vector_chunk(self, lo: int, n: int) -> Vectors:
        """Rows ``lo`` to ``lo + n`` as float32; the format's error names the first row with
        a finite value beyond float32's range (wider float files: a cast would make it
        infinite)."""
        vectors = self.vectors.read(lo, n).reshape(n, self.vectors.width)
        if vectors.dtype.itemsize > 4:
            beyond = np.isfinite(vectors) & (np.abs(vectors) > np.finfo(np.float32).max)
            if beyond.any():
                row = int(np.argmax(beyond.any(axis=1)))
                value = vectors[row][beyond[row]][0]
                raise self.vectors.error(
                    f"{self.vectors.path}: row {lo + row} holds {value}, beyond float32's range"
                )
        return vectors.astype(np.float32, copy=False)

    @property
    def row_bytes(self) -> int:
        """Bytes of one vector as a chunk holds it: as read, or as float32 when that is wider."""
        return self.vectors.width * max(self.vectors.dtype.itemsize, 4)

    def chunks(
        self, chunk_rows: int | None = None, budget: int | None = None
    ) -> Iterator[tuple[Keys, Vectors]]:
        """``(keys, vectors)`` chunks of ``chunk_rows`` rows, in file order (default: as
        many as :func:`hps.io.chunks.rows_per_chunk` gives vectors of :attr:`row_bytes`
        within ``budget`` bytes)."""
        if chunk_rows is None:
            chunk_rows = rows_per_chunk(self.row_bytes, budget)
        for lo in range(0, self.rows, chunk_rows):
            n = min(chunk_rows, self.rows - lo)
            yield self.key_chunk(lo, n), self.vector_chunk(lo, n)

    def stamp(self) -> list[str | int]:
        """Path, size and modification time of each file as opened (``fstat``)."""
        return self.keys.stamp() + self.vectors.stamp()

    def digest(self) -> str:
        """The content of both files as opened, as a BLAKE2b digest (hex): equal digests,
        equal bytes (a .npy file's header too). One sequential read of each file, the first
        time (the files as opened do not change; :meth:`written` says when they did)."""
        if self._digest is None:
            digest = hashlib.blake2b(digest_size=32)
            self.keys.digest_into(digest)
            self.vectors.digest_into(digest)
            self._digest = digest.hexdigest()
        return self._digest

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


class TableWriter:
    """Writes a table in chunks: int64 keys to ``keys_path``, 2-D vectors of ``dtype`` (of
    ``width`` values each, when given) to ``vectors_path``. A context manager: the files
    written are temporaries that replace the two paths only when the block ends without an
    exception, synced (:func:`hps.io.durable.replacing`): a failure or an interrupt
    meanwhile leaves the paths as they were. :attr:`rows` counts the rows written.

    A format with headers writes them in :meth:`_begin` (before the first row) and
    :meth:`_end` (after the last one, the count known)."""

    def __init__(
        self,
        keys_path: Path,
        vectors_path: Path,
        dtype: npt.DTypeLike,
        width: int | None = None,
        error: type[FormatError] = FormatError,
    ) -> None:
        self.keys_path, self.vectors_path = keys_path, vectors_path
        self.dtype = np.dtype(dtype)
        self.width = width
        self.error = error
        self.rows = 0
        self._files: tuple[BinaryIO, BinaryIO] | None = None
        self._writing: AbstractContextManager[TableWriter] | None = None

    def write(self, keys: Keys, vectors: npt.NDArray[np.generic]) -> None:
        assert self._files is not None, "write inside the with block"
        keys = np.asarray(keys, dtype="<i8")
        vectors = np.asarray(vectors, dtype=self.dtype)
        if (
            vectors.ndim != 2
            or vectors.shape[0] != keys.size
            or self.width not in (None, vectors.shape[1])
        ):
            raise self.error(f"{self.vectors_path}: {keys.size} keys but vectors {vectors.shape}")
        kf, vf = self._files
        kf.write(keys.tobytes())
        vf.write(np.ascontiguousarray(vectors).tobytes())
        self.rows += keys.size

    def _begin(self, keys: BinaryIO, vectors: BinaryIO) -> None:
        """Before the first row: nothing (headerless files)."""

    def _end(self, keys: BinaryIO, vectors: BinaryIO) -> None:
        """After the last row: nothing (headerless files)."""

    @contextmanager
    def _replacing(self) -> Iterator[TableWriter]:
        with replacing(self.keys_path, self.vectors_path) as (kf, vf):
            self._files = kf, vf
            try:
                self._begin(kf, vf)
                yield self
                self._end(kf, vf)
            finally:
                self._files = None

    def __enter__(self) -> TableWriter:
        self._writing = self._replacing()
        return self._writing.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._writing is not None
        writing, self._writing = self._writing, None
        writing.__exit__(kind, exc, tb)
