"""The one loader: whole tables from files into L3 and L2, validated before anything is written.

Used by ``hps import``, a serving process's start-up and reload (:mod:`hps.triton.serving`)
and the control plane's import route. A :class:`TableSource` is a table's files, checked
when it is made (sizes, dtypes) and, by :meth:`TableSource.validate`, read once through
(reserved keys, NaN or infinity, duplicate keys: the last occurrence of a key wins, as in
an upsert, and the count is reported; values the table's row format cannot hold, i.e.
beyond float16's range). :class:`Loader` then streams it in chunks, each encoded into the
table's row format (``hps_row_dtype``, :mod:`hps.rowformat`) as it streams. An import holds
the files open from before its validation to the end of its load
(:meth:`TableSource.opened`), so the rows it writes are those it validated and stamped.

Memory: the load holds a chunk (32 MiB of vectors at most, whatever the dimension; 256k
rows up to dimension 32: :mod:`hps.io.chunks`) and its encoded copy; the validation also a
sorted copy of every key (8 bytes per row) to count duplicates, refused before anything is
read where the memory available (:func:`available_memory`) cannot hold it; :func:`l3_holds`
a chunk (and the keys of differing rows awaiting a later occurrence: at most
``AWAITED_KEYS``).

What happens to L2 (:data:`L2Action`) depends on whose L2 it is, which
:func:`l2_action` reads from the :class:`hps.topology.Topology`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from hps.errors import FormatError, HPSError, InvalidValueError
from hps.io.chunks import CHUNK_BYTES
from hps.io.npy import npy_rows, open_npy_pair
from hps.io.progress import Progress
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, open_sparse_model, sparse_model_rows
from hps.io.table_files import TableFiles, path_stamp
from hps.tiers import Tiers, check_encodable, encode_rows
from hps.topology import Topology
from hps.types import Keys, TableSpec, Vectors
from hps.validate import as_rows

log = logging.getLogger(__name__)

Chunks = Iterator[tuple[Keys, Vectors]]

L2Action = Literal["skip", "invalidate", "fill", "absent"]
"""``skip``: leave L2 alone (another process's in-process L2); ``invalidate``: remove the
table's keys (a node's shared L2, refilled by its serving processes); ``fill``: insert the
first ``l2_share`` of the rows and, when L3 is written too, remove the rest (stale);
``absent``: insert those of the first ``l2_share`` that L2 lacks and leave the rest (a
model version that another node imported into a shared L2 before, and whose rows updates
may have reached since)."""

KEY_SCAN_ROWS = 1 << 20  # keys per chunk of the duplicate count's comparison (8 MiB)
AWAITED_KEYS = 1 << 20  # differing rows l3_holds lets wait for a later occurrence (8 MiB)
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2, as a container sees its own


def available_memory() -> int | None:
    """Bytes this process may still take: ``MemAvailable`` of /proc/meminfo, or less where
    a cgroup limit applies (``memory.max`` minus ``memory.current``); None where neither is
    known (then nothing is refused for want of memory)."""
    figures = [f for f in (_meminfo_available(), _cgroup_available()) if f is not None]
    return min(figures) if figures else None


def _meminfo_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """The limit less the working set (``memory.current`` less ``inactive_file``, as the
    kubelet counts it): page cache the kernel reclaims before it refuses memory is free."""
    try:
        limit = (CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((CGROUP / "memory.current").read_text()) - _inactive_file()
        return max(0, int(limit) - max(used, 0))
    except (OSError, ValueError):
        return None


def _inactive_file() -> int:
    try:
        for line in (CGROUP / "memory.stat").read_text().splitlines():
            if line.startswith("inactive_file "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class TableSource:
    """One table's files: a HugeCTR sparse-model folder or a ``.npy`` key/vector pair.

    Each pass (:meth:`chunks`, :meth:`validate`, :meth:`digest`) opens the files for its
    own length, unless the source is :meth:`opened`: then every pass reads the files as
    they were opened, whatever replaces their paths meanwhile, and :meth:`stamp` is theirs.
    """

    spec: TableSpec
    files: tuple[Path, ...]
    rows: int
    kind: Literal["sparse", "npy"]
    handles: TableFiles | None = field(default=None, compare=False, repr=False)
    chunk_bytes: int | None = None
    """Bytes of vectors one chunk of a pass holds (None: :data:`hps.io.chunks.CHUNK_BYTES`)."""

    @contextmanager
    def opened(self) -> Iterator[TableSource]:
        """This source with its files opened until the block ends (itself if they are)."""
        if self.handles is not None:
            yield self
            return
        with self._open() as files:
            if files.rows != self.rows:
                raise FormatError(
                    f"{self.files[0]}: {files.rows} rows now, {self.rows} when it was checked "
                    "(replaced meanwhile): run the import again"
                )
            yield replace(self, handles=files)

    @property
    def where(self) -> str:
        """The files, as a log line names them: the sparse-model folder, or the .npy pair."""
        if self.kind == "sparse":
            return str(self.files[0].parent)
        return " + ".join(str(f) for f in self.files)

    def _open(self) -> TableFiles:
        if self.kind == "sparse":
            return open_sparse_model(self.files[0].parent, self.spec.dim)
        return open_npy_pair(self.files[0], self.files[1], self.spec.dim)

    def chunks(self, chunk_rows: int = 0) -> Chunks:
        """``(keys, float32 vectors)`` chunks in file order, of ``chunk_rows`` rows; 0 (the
        default): sized by bytes (:func:`hps.io.chunks.rows_per_chunk`: :attr:`chunk_bytes`
        of vectors, at most 256k rows), so a pass holds as much whatever the table's
        dimension."""
        with self.opened() as src:
            assert src.handles is not None
            yield from src.handles.chunks(chunk_rows or None, self.chunk_bytes)

    def stamp(self) -> list[str | int]:
        """What identifies this version of the files: paths, sizes, modification times (of
        the opened files when :meth:`opened`, else as the paths name them now), and the row
        format they are stored in (when not float32: older records stay current)."""
        out = path_stamp(self.files) if self.handles is None else self.handles.stamp()
        if self.spec.row_dtype != "float32":
            out.append(f"row_dtype={self.spec.row_dtype}")
        return out

    def digest(self) -> str:
        """What identifies this version of the files by content: a digest of every byte of
        both (:meth:`hps.io.table_files.TableFiles.digest`: one sequential read of each),
        with the row format they are imported in. Equal digests: an import leaves the same
        rows."""
        with self.opened() as src:
            assert src.handles is not None
            return f"blake2b:{src.handles.digest()}:{self.spec.row_dtype}"

    @property
    def validation_bytes(self) -> int:
        """Memory :meth:`validate` takes: every key (8 bytes a row) and a chunk of vectors
        as read with its checked copy."""
        chunk = min(self.rows * self.spec.dim * 4, self.chunk_bytes or CHUNK_BYTES)
        return self.rows * 8 + 2 * chunk

    def check_memory(self) -> None:
        """Before anything is read: an HPSError naming the table, its files and both figures
        when :meth:`validate` needs more memory than is available (:func:`available_memory`),
        rather than a MemoryError after a read of the whole table."""
        free = available_memory()
        if free is not None and self.validation_bytes > free:
            raise HPSError(
                f"{self.spec.name}: validating {self.where} needs {self.validation_bytes:,} "
                f"bytes of memory ({self.rows:,} keys of 8 bytes, and a chunk); "
                f"{free:,} bytes available"
            )

    def validate(self) -> int:
        """Read the files once; raise on bad rows (FormatError), or on values the table's
        row format cannot hold (InvalidValueError naming the table). Returns the number of
        duplicate keys, counted on a sorted copy of every key: 8 bytes per row of memory,
        on top of a chunk (:attr:`validation_bytes`: more than is available is refused
        unread, :meth:`check_memory`)."""
        self.check_memory()
        keys = np.empty(self.rows, np.int64)
        lo = 0
        with self.opened() as src:
            for chunk, vectors in src.chunks():
                _check_finite(vectors, self.files[-1], lo)
                try:
                    _, vectors = as_rows(self.spec, chunk, vectors)
                except Exception as exc:
                    raise FormatError(f"{self.files[0]}: {exc}") from None
                try:
                    check_encodable(self.spec, vectors)
                except InvalidValueError as exc:
                    raise InvalidValueError(f"{exc} (in {self.files[-1]})") from None
                keys[lo : lo + chunk.size] = chunk
                lo += chunk.size
        return _duplicates(keys)


def _check_finite(vectors: np.ndarray, path: Path, first_row: int) -> None:
    """FormatError naming the vectors file and the first row with a NaN or an infinity."""
    if vectors.dtype.kind != "f" or vectors.ndim == 0 or not len(vectors):
        return
    finite = np.isfinite(vectors).reshape(len(vectors), -1).all(axis=1)
    if not finite.all():
        row = first_row + int(np.argmin(finite))
        raise FormatError(f"{path}: row {row} holds NaN or infinity")


def _duplicates(keys: np.ndarray) -> int:
    """Keys that repeat an earlier one: ``keys`` sorted in place, then neighbours compared
    a chunk at a time (no array of the keys' size beyond ``keys``)."""
    keys.sort()
    total = 0
    for lo in range(0, keys.size - 1, KEY_SCAN_ROWS):
        hi = min(keys.size - 1, lo + KEY_SCAN_ROWS)
        total += int(np.count_nonzero(keys[lo + 1 : hi + 1] == keys[lo:hi]))
    return total


def sparse_source(spec: TableSpec, path: str | Path) -> TableSource:
    path = Path(path)
    rows = sparse_model_rows(path, spec.dim)
    return TableSource(spec, (path / KEY_FILE, path / VECTOR_FILE), rows, "sparse")


def npy_source(spec: TableSpec, keys_path: str | Path, vectors_path: str | Path) -> TableSource:
    rows = npy_rows(keys_path, vectors_path, spec.dim)
    return TableSource(spec, (Path(keys_path), Path(vectors_path)), rows, "npy")


def l2_action(topo: Topology, *, own: bool) -> L2Action:
    """What a load does to L2: ``own`` when this process is the one the L2 belongs to."""
    if topo.l2 is None:
        return "skip"
    if topo.l2 == "process":
        return "fill" if own else "skip"
    if topo.l2 == "node" and topo.l3 and not own:
        return "invalidate"
    return "fill"


def l3_holds(tiers: Tiers, source: TableSource) -> bool:
    """Whether L3 holds exactly the rows an import of ``source`` leaves: every key, with the
    vector of its last occurrence in the files as the table's format stores it (encoding
    is deterministic). Every row is compared, never a sample: one read of the files and a
    fetch of every key from L3, a chunk at a time, stopping at the first key L3 lacks. A
    row that differs is forgiven only when its key occurs again later (a duplicate: the
    last occurrence is the one imported); once more than ``AWAITED_KEYS`` keys await a
    later occurrence the table is taken as not held (imported again: upserts of the same
    rows change nothing). An empty table is never held (importing it creates it)."""
    if tiers.persistent is None or source.rows == 0:
        return False
    awaiting = np.empty(0, np.int64)  # keys whose latest occurrence so far differs from L3
    for keys, vectors in source.chunks():
        try:
            want = encode_rows(source.spec, vectors)
        except InvalidValueError:
            return False  # not importable as configured: validate() says why
        got, found = tiers.persistent.fetch(source.spec.name, keys)
        if not found.all():
            return False
        same = (got == want).reshape(keys.size, -1).all(axis=1)
        if same.all() and not awaiting.size:
            continue
        distinct, last = np.unique(keys[::-1], return_index=True)  # each key's last row here
        last_same = same[::-1][last]
        awaiting = np.union1d(np.setdiff1d(awaiting, distinct[last_same]), distinct[~last_same])
        if awaiting.size > AWAITED_KEYS:
            return False
    return not awaiting.size


@dataclass
class Loader:
    """Streams :class:`TableSource` s into the tiers.

    ``l3``: write every row to L3. ``l2`` / ``l2_share``: see :data:`L2Action`.
    ``on_rows`` is called with the rows of each chunk written (progress of a job).
    """

    tiers: Tiers
    l2: L2Action
    l2_share: float = 1.0
    l3: bool = True
    progress: bool = False
    on_rows: Callable[[int], None] | None = None

    def load(self, source: TableSource) -> int:
        """Rows written: to L3, or to L2 when only L2 is loaded. Each chunk is encoded into
        the table's row format once, as it streams (float32: written as read). L3's last
        chunk is a synced write: every row is durable when this returns (a sync of the WAL
        covers the writes before it), so a record of the import written next is true."""
        spec = source.spec
        write_l3 = self.l3 and self.tiers.persistent is not None
        l2 = self.tiers.volatile if self.l2 != "skip" else None
        share = self.l2_share if self.tiers.persistent is not None else 1.0
        to_l2 = int(round(share * source.rows)) if self.l2 in ("fill", "absent") else 0
        bar = Progress(f"import {spec.name}", source.rows, enabled=self.progress)
        done = in_l2 = 0
        for keys, vectors in source.chunks():
            rows = encode_rows(spec, vectors)
            if write_l3:
                assert self.tiers.persistent is not None
                last = done + keys.size >= source.rows
                self.tiers.persistent.insert(spec.name, keys, rows, durable=last)
            if l2 is not None:
                n = max(0, min(keys.size, to_l2 - done))
                if n:
                    write = l2.insert_absent if self.l2 == "absent" else l2.insert
                    write(spec.name, keys[:n], rows[:n])
                    in_l2 += n
                if n < keys.size and write_l3 and self.l2 != "absent":
                    l2.remove(spec.name, keys[n:])
                if not write_l3 and n == 0:
                    break  # filling L2 only, and its share is in
            done += keys.size
            bar.advance(keys.size)
            if self.on_rows is not None:
                self.on_rows(keys.size)
        return done if write_l3 else in_l2
