"""Import sources: uploads staged to disk, or server-side paths; validated before any write.

Layout of a staged source (a folder): ``key`` + ``emb_vector`` (a HugeCTR sparse model) or
``keys.npy`` + ``vectors.npy``, made a :class:`hps.loading.loader.TableSource` (sizes, dtypes and
dimension checked); :func:`validate` reads it whole once (finite values, reserved keys,
values the table's row format can hold), so that a bad input is refused with a 4xx before
anything is written. The loader encodes the rows into the table's format as it writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hps.errors import RequestError
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE
from hps.loading.loader import Chunks, TableSource, npy_source, sparse_source
from hps.types import TableSpec

Format = Literal["sparse", "npy"]
NPY_FILES = ("keys.npy", "vectors.npy")
CHUNK_BYTES = 8 << 20  # vector bytes per write: bounds the memory of an import of any size


def names(fmt: Format) -> tuple[str, str]:
    return (KEY_FILE, VECTOR_FILE) if fmt == "sparse" else NPY_FILES


def place(folder: Path, fmt: Format) -> Path:
    """Name the uploaded files in ``folder`` (``keys``, ``vectors``: the form's fields) as
    ``fmt``'s files; the folder."""
    for field, name in zip(("keys", "vectors"), names(fmt), strict=True):
        (folder / field).rename(folder / name)
    return folder


@dataclass(frozen=True)
class ChunkedSource(TableSource):
    """A TableSource read in chunks of :data:`CHUNK_BYTES` of vectors (bounds memory)."""

    def chunks(self, chunk_rows: int = 0) -> Chunks:
        return super().chunks(chunk_rows or max(1, CHUNK_BYTES // (4 * self.spec.dim)))


def source(folder: Path, fmt: Format, spec: TableSpec) -> TableSource:
    """The folder's files as a source of ``spec``; sizes and dtypes checked."""
    if fmt == "sparse":
        base = sparse_source(spec, folder)
    else:
        base = npy_source(spec, folder / NPY_FILES[0], folder / NPY_FILES[1])
    return ChunkedSource(base.spec, base.files, base.rows, base.kind)


def validate(src: TableSource) -> int:
    """Read the whole source once (finite values, reserved keys; values beyond float16's
    range for a float16 table: InvalidValueError, a 400); its row count."""
    if src.rows == 0:
        raise RequestError(f"{src.spec.name}: the input holds no rows")
    src.validate()
    return src.rows
