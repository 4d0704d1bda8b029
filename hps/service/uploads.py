"""Import sources: uploads staged to disk, or server-side paths; validated before any write.

Layout of a staged source (a folder): ``key`` + ``emb_vector`` (a HugeCTR sparse model) or
``keys.npy`` + ``vectors.npy``, made a :class:`hps.loading.loader.TableSource` (sizes, dtypes and
dimension checked); :func:`validate` reads it whole once (finite values, reserved keys,
values the table's row format can hold), so that a bad input is refused with a 4xx before
anything is written. The loader encodes the rows into the table's format as it writes them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from hps.errors import RequestError
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE
from hps.loading.loader import TableSource, npy_source, sparse_source
from hps.types import TableSpec

Format = Literal["sparse", "npy"]
NPY_FILES = ("keys.npy", "vectors.npy")
UPLOAD_CHUNK_BYTES = 8 << 20
"""Vector bytes per write of a control-plane import: a quarter of a command-line import's
(:data:`hps.io.chunks.CHUNK_BYTES`), since the server holds it beside its serving work."""


def names(fmt: Format) -> tuple[str, str]:
    return (KEY_FILE, VECTOR_FILE) if fmt == "sparse" else NPY_FILES


def place(folder: Path, fmt: Format) -> Path:
    """Name the uploaded files in ``folder`` (``keys``, ``vectors``: the form's fields) as
    ``fmt``'s files; the folder."""
    for field, name in zip(("keys", "vectors"), names(fmt), strict=True):
        (folder / field).rename(folder / name)
    return folder


def by_field(exc: BaseException, folder: Path, fmt: Format, table: str) -> None:
    """Name the uploaded files in ``exc``'s message by their form fields (``keys``,
    ``vectors``), as :func:`place` named them in ``folder``, and the ``table`` they were
    for: the client sent fields, and where the server staged them is none of its business."""
    if not exc.args or not isinstance(exc.args[0], str):
        return
    text = exc.args[0]
    for field, name in zip(("keys", "vectors"), names(fmt), strict=True):
        text = text.replace(str(folder / name), f"`{field}`")
    text = text.replace(str(folder), "the upload")
    exc.args = (text if table in text else f"{table}: {text}", *exc.args[1:])


def source(folder: Path, fmt: Format, spec: TableSpec) -> TableSource:
    """The folder's files as a source of ``spec``, read in chunks of
    :data:`UPLOAD_CHUNK_BYTES`; sizes and dtypes checked."""
    if fmt == "sparse":
        base = sparse_source(spec, folder)
    else:
        base = npy_source(spec, folder / NPY_FILES[0], folder / NPY_FILES[1])
    return replace(base, chunk_bytes=UPLOAD_CHUNK_BYTES)


def validate(src: TableSource) -> int:
    """Read the whole source once (finite values, reserved keys; values beyond float16's
    range for a float16 table: InvalidValueError, a 400); its row count."""
    if src.rows == 0:
        raise RequestError(f"{src.spec.name}: the input holds no rows")
    src.validate()
    return src.rows
