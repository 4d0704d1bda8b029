"""HugeCTR sparse-model folders: ``key`` (raw int64) and ``emb_vector`` (raw float32 rows).

This is what HugeCTR's ``model.save_params_to_files`` wrote for each embedding table
(``<name>_sparse_<i>.model/``). Both files are headerless and native-endian (little-endian
on every platform HugeCTR ran on). Readers stream in chunks so tables larger than memory
import in bounded memory (an import's validation also keeps every key, 8 bytes a row, to
count duplicates: :meth:`hps.loading.loader.TableSource.validate`). A model HugeCTR saved
with 32-bit keys (``i64_input_key: false``: uint32 keys) is refused with the conversion to
int64 keys (docs/storage.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from hps.errors import SparseModelError
from hps.io.table_files import Column, TableFiles, TableWriter
from hps.types import Keys, Vectors

if TYPE_CHECKING:
    from hps.config import ModelConfig


class CountsRows(Protocol):
    """What :func:`table_rows` needs of a tier (an L3 :class:`hps.tiers.RowStore`)."""

    def size(self, table: str) -> int: ...


KEY_FILE = "key"
VECTOR_FILE = "emb_vector"


def sparse_model_rows(path: str | Path, dim: int) -> int:
    """Rows in a sparse-model folder; raises SparseModelError when the files disagree."""
    path = Path(path)
    key_file, vec_file = path / KEY_FILE, path / VECTOR_FILE
    for f in (key_file, vec_file):
        if not f.is_file():
            raise SparseModelError(f"{path}: missing file {f.name!r} (not a HugeCTR sparse model)")
    return _rows(key_file, key_file.stat().st_size, vec_file, vec_file.stat().st_size, dim)


def _rows(key_file: Path, key_bytes: int, vec_file: Path, vec_bytes: int, dim: int) -> int:
    int64_keys = key_bytes % 8 == 0 and vec_bytes == key_bytes // 8 * dim * 4
    if not int64_keys and _holds_32bit_keys(key_bytes, vec_bytes, dim):
        # one reading of the sizes is ambiguous: int64 keys of a table twice as wide
        other = "" if key_bytes % 8 else f"; else the vector size is {2 * dim}, not {dim}"
        raise SparseModelError(
            f"{key_file}: {key_bytes} bytes are {key_bytes // 4} 32-bit keys, one per row of "
            f"{vec_file.name} at dim {dim}: a model saved with HugeCTR's i64_input_key: "
            "false? HPS reads int64 keys: convert the file, e.g. "
            f"numpy.fromfile('{key_file}', '<u4').astype('<i8').tofile(NEW_KEY_FILE) "
            f"(docs/storage.md){other}"
        )
    if key_bytes % 8:
        raise SparseModelError(f"{key_file}: {key_bytes} bytes is not a whole number of int64 keys")
    rows = key_bytes // 8
    if vec_bytes != rows * dim * 4:
        raise SparseModelError(
            f"{vec_file}: {vec_bytes} bytes, expected {rows} rows x dim {dim} x 4 = "
            f"{rows * dim * 4} (truncated file or wrong embedding_vecsize_per_table)"
        )
    return rows


def _holds_32bit_keys(key_bytes: int, vec_bytes: int, dim: int) -> bool:
    """Whether the key file's size is that of one uint32 key per row of the vector file."""
    return key_bytes > 0 and key_bytes % 4 == 0 and vec_bytes == key_bytes // 4 * dim * 4


def open_sparse_model(path: str | Path, dim: int) -> TableFiles:
    """The folder's two files, opened and their sizes checked (SparseModelError)."""
    path = Path(path)
    sparse_model_rows(path, dim)  # names a missing file
    key_file, vec_file = path / KEY_FILE, path / VECTOR_FILE
    with ExitStack() as opened:
        kf, kst = Column.open(key_file, SparseModelError)
        opened.callback(kf.close)
        vf, vst = Column.open(vec_file, SparseModelError)
        opened.callback(vf.close)
        rows = _rows(key_file, kst[2], vec_file, vst[2], dim)
        keys = Column(key_file, kf, 0, np.dtype("<i8"), 1, SparseModelError, kst)
        vectors = Column(vec_file, vf, 0, np.dtype("<f4"), dim, SparseModelError, vst)
        opened.pop_all()
    return TableFiles(keys, vectors, rows)


def read_sparse_model(
    path: str | Path, dim: int, chunk_rows: int | None = None
) -> Iterator[tuple[Keys, Vectors]]:
    """Yield ``(keys, vectors)`` chunks (of ``chunk_rows`` rows, by default sized by bytes:
    :func:`hps.io.chunks.rows_per_chunk`); the whole folder's sizes are checked before the
    first, and a file that ends early (truncated meanwhile) is a SparseModelError naming it
    and the row."""
    with open_sparse_model(path, dim) as files:
        yield from files.chunks(chunk_rows)


def write_sparse_model(path: str | Path, keys: Keys, vectors: Vectors) -> None:
    """Write a whole table (use :class:`SparseModelWriter` for chunks)."""
    with SparseModelWriter(path) as w:
        w.write(keys, vectors)


class SparseModelWriter(TableWriter):
    """Write (keys, vectors) chunks as a sparse-model folder's ``key`` and ``emb_vector``
    (the folder made if need be), which replace the folder's files only once complete
    (:class:`hps.io.table_files.TableWriter`: a failure or an interrupt leaves them as
    they were).

    ``dtype``: the element type ``emb_vector`` holds: float32 (HugeCTR's), or a table's
    stored element type for a raw export of its stored rows (``hps export --raw``).
    """

    def __init__(self, path: str | Path, dtype: npt.DTypeLike = "<f4") -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        super().__init__(
            self.path / KEY_FILE, self.path / VECTOR_FILE, dtype, error=SparseModelError
        )


def table_rows(model: ModelConfig, index: int, persistent: CountsRows | None) -> int:
    """Rows of a model's ``index``-th table: from its sparse file, else what L3 holds."""
    spec = model.tables[index]
    if model.sparse_files and os.path.isdir(model.sparse_files[index]):
        return sparse_model_rows(model.sparse_files[index], spec.dim)
    if persistent is not None:
        return persistent.size(spec.name)
    return 0
