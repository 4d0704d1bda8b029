"""The one loader: whole tables from files into L3 and L2, validated before anything is written.

Used by ``hps import``, a serving process's start-up and reload (:mod:`hps.triton.serving`)
and the control plane's import route. A :class:`TableSource` is a table's files, checked
when it is made (sizes, dtypes) and, by :meth:`TableSource.validate`, read once through
(reserved keys, NaN or infinity, duplicate keys: the last occurrence of a key wins, as in
an upsert, and the count is reported; values the table's row format cannot hold, i.e.
beyond float16's range). :class:`Loader` then streams it in chunks, each encoded into the
table's row format (``hps_row_dtype``, :mod:`hps.rowformat`) as it streams.

What happens to L2 (:data:`L2Action`) depends on whose L2 it is, which
:func:`l2_action` reads from the :class:`hps.topology.Topology`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from hps.errors import FormatError, InvalidValueError
from hps.io.npy import npy_rows, read_npy_pair
from hps.io.progress import Progress
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model, sparse_model_rows
from hps.tiers import Tiers, check_encodable, encode_rows
from hps.topology import Topology
from hps.types import Keys, TableSpec, Vectors
from hps.validate import as_rows

log = logging.getLogger(__name__)

Chunks = Iterator[tuple[Keys, Vectors]]

L2Action = Literal["skip", "invalidate", "fill"]
"""``skip``: leave L2 alone (another process's in-process L2); ``invalidate``: remove the
table's keys (a node's shared L2, refilled by its serving processes); ``fill``: insert the
first ``l2_share`` of the rows and, when L3 is written too, remove the rest (stale)."""

SAMPLE_ROWS = 64


@dataclass(frozen=True)
class TableSource:
    """One table's files: a HugeCTR sparse-model folder or a ``.npy`` key/vector pair."""

    spec: TableSpec
    files: tuple[Path, ...]
    rows: int
    kind: Literal["sparse", "npy"]

    def chunks(self, chunk_rows: int = 1 << 18) -> Chunks:
        if self.kind == "sparse":
            return read_sparse_model(self.files[0].parent, self.spec.dim, chunk_rows)
        return read_npy_pair(self.files[0], self.files[1], self.spec.dim, chunk_rows)

    def stamp(self) -> list[str | int]:
        """What identifies this version of the files: paths, sizes, modification times, and
        the row format they are stored in (when not float32: older records stay current)."""
        out: list[str | int] = []
        for f in self.files:
            st = f.stat()
            out += [str(f), st.st_size, st.st_mtime_ns]
        if self.spec.row_dtype != "float32":
            out.append(f"row_dtype={self.spec.row_dtype}")
        return out

    def _keys(self) -> np.ndarray:
        if self.kind == "sparse":
            if self.rows == 0:  # an empty file cannot be mapped
                return np.empty(0, "<i8")
            return np.memmap(self.files[0], dtype="<i8", mode="r")
        return np.asarray(np.load(self.files[0], mmap_mode="r"))

    def _vectors(self) -> np.ndarray:
        if self.kind == "sparse":
            if self.rows == 0:
                return np.empty((0, self.spec.dim), "<f4")
            return np.memmap(self.files[1], dtype="<f4", mode="r").reshape(-1, self.spec.dim)
        return np.asarray(np.load(self.files[1], mmap_mode="r"))

    def sample(self, n: int = SAMPLE_ROWS) -> tuple[Keys, Vectors]:
        """Up to ``n`` rows spread evenly over the files (with the last one)."""
        if self.rows == 0:
            return np.empty(0, np.int64), np.empty((0, self.spec.dim), np.float32)
        at = np.unique(np.linspace(0, self.rows - 1, min(n, self.rows)).astype(np.int64))
        return (
            np.asarray(self._keys()[at], dtype=np.int64),
            np.asarray(self._vectors()[at], dtype=np.float32),
        )

    def validate(self) -> int:
        """Read the files once; raise on bad rows (FormatError), or on values the table's
        row format cannot hold (InvalidValueError naming the table). Returns the number of
        duplicate keys."""
        for keys, vectors in self.chunks():
            try:
                _, vectors = as_rows(self.spec, keys, vectors)
            except Exception as exc:
                raise FormatError(f"{self.files[0]}: {exc}") from None
            try:
                check_encodable(self.spec, vectors)
            except InvalidValueError as exc:
                raise InvalidValueError(f"{exc} (in {self.files[-1]})") from None
        return int(self.rows - np.unique(self._keys()).size)


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


def l3_matches(tiers: Tiers, source: TableSource) -> bool:
    """Whether L3 holds the source's rows: a sample of keys with exactly its vectors, as
    the table's format stores them (encoding is deterministic)."""
    if tiers.persistent is None or source.rows == 0:
        return False
    keys, vectors = source.sample()
    # The last occurrence of a duplicated key wins: compare only keys the sample has once.
    once = np.unique(keys, return_counts=True)
    single = np.isin(keys, once[0][once[1] == 1])
    try:
        want = encode_rows(source.spec, vectors[single])
    except InvalidValueError:
        return False  # not importable as configured: validate() says why
    got, found = tiers.persistent.fetch(source.spec.name, keys[single])
    return bool(found.all()) and bool(np.array_equal(got, want))


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
        the table's row format once, as it streams (float32: written as read)."""
        spec = source.spec
        write_l3 = self.l3 and self.tiers.persistent is not None
        l2 = self.tiers.volatile if self.l2 != "skip" else None
        share = self.l2_share if self.tiers.persistent is not None else 1.0
        to_l2 = int(round(share * source.rows)) if self.l2 == "fill" else 0
        bar = Progress(f"import {spec.name}", source.rows, enabled=self.progress)
        done = in_l2 = 0
        for keys, vectors in source.chunks():
            rows = encode_rows(spec, vectors)
            if write_l3:
                assert self.tiers.persistent is not None
                self.tiers.persistent.insert(spec.name, keys, rows)
            if l2 is not None:
                n = max(0, min(keys.size, to_l2 - done))
                if n:
                    l2.insert(spec.name, keys[:n], rows[:n])
                    in_l2 += n
                if n < keys.size and write_l3:
                    l2.remove(spec.name, keys[n:])
                if not write_l3 and n == 0:
                    break  # filling L2 only, and its share is in
            done += keys.size
            bar.advance(keys.size)
            if self.on_rows is not None:
                self.on_rows(keys.size)
        return done if write_l3 else in_l2
