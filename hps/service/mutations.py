"""Mutating routes (bearer token, checked by :class:`hps.service.limits.TokenAndBodyLimits`)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Annotated, cast

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hps.errors import FormatError, RequestError
from hps.service import direct, upload_form, uploads
from hps.service.paths import MAX_PATH_CHARS, ServerPaths
from hps.service.schemas import (
    MAX_WRITE_KEYS,
    WRITE,
    DeleteBody,
    WarmupBody,
    WarmupKeys,
    WarmupKeyset,
)
from hps.service.state import AdminState
from hps.types import JSON

# Declares the scheme in the OpenAPI document; TokenAndBodyLimits has checked the token.
bearer = HTTPBearer(auto_error=False, description="the admin token (--token-file, HPS_ADMIN_TOKEN)")
Auth = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
router = APIRouter(tags=["admin"])


def _state(request: Request) -> AdminState:
    state: AdminState = request.app.state.hps
    return state


@router.delete("/v1/models/{model}/tables/{table}/keys", responses=WRITE)
def delete_keys(model: str, table: str, body: DeleteBody, request: Request, _: Auth) -> JSON:
    """Remove keys from L3, L2 and every serving process's L1 (Kafka, else the journal)."""
    state = _state(request)
    spec = state.spec(model, table)
    return direct.delete(state, spec, np.unique(np.asarray(body.keys, dtype=np.int64)))


@router.post("/v1/models/{model}/reload", responses=WRITE)
def reload(model: str, request: Request, _: Auth) -> JSON:
    """Reload the model in Triton: every instance restarts (fresh L1, L3 reopened)."""
    state = _state(request)
    state.reset_reader()
    return {"reloaded": state.reload(model)}


@router.post("/v1/models/{model}/warmup", responses=WRITE)
def warmup(model: str, body: WarmupBody, request: Request, _: Auth) -> JSON:
    """Load keys into every instance's L1 (told through the node's change journal)."""
    from hps.cache.warmup import hottest
    from hps.io.frequency import read_frequency_file
    from hps.io.keyset import read_keyset

    state = _state(request)
    cfg = state.config.model(model)
    tables = [body.table] if body.table else cfg.table_names
    for t in tables:
        state.spec(model, t)
    if isinstance(body, WarmupKeys):
        keys = np.asarray(body.keys, dtype=np.int64)
    elif isinstance(body, WarmupKeyset):
        path = ServerPaths.of(state).file(body.keyset_path)  # confined: hps.service.paths
        try:
            keys = read_keyset(path, max_keys=MAX_WRITE_KEYS)
        except OSError:
            raise FormatError(f"{body.keyset_path}: cannot read the keyset file") from None
    else:
        fkeys, counts = read_frequency_file(ServerPaths.of(state).file(body.frequency_path))
        keys = hottest(fkeys, counts, body.top_k or min(fkeys.size, MAX_WRITE_KEYS))
    return direct.warmup_keys(state, model, dict.fromkeys(tables, keys))


TEXT_FIELDS = frozenset({"format", "path"})
FILE_FIELDS = frozenset({"keys", "vectors"})
IMPORT_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["format"],
                "additionalProperties": False,
                "properties": {
                    "format": {"type": "string", "enum": ["sparse", "npy"]},
                    "keys": {
                        "type": "string",
                        "format": "binary",
                        "description": "`key` / keys .npy",
                    },
                    "vectors": {
                        "type": "string",
                        "format": "binary",
                        "description": "`emb_vector` / .npy",
                    },
                    "path": {
                        "type": "string",
                        "maxLength": MAX_PATH_CHARS,
                        "description": "server-side folder instead of uploads: an absolute "
                        "path under the control plane's path roots (hps_admin.path_roots)",
                    },
                },
            }
        }
    },
}


@router.post(
    "/v1/models/{model}/tables/{table}/import",
    status_code=202,
    responses=WRITE,
    openapi_extra={"requestBody": IMPORT_BODY},
)
async def import_table(model: str, table: str, request: Request, _: Auth) -> JSON:
    """Load a table from an upload or a server-side folder; progress at ``/v1/jobs/{id}``.

    Multipart fields: ``format`` (``sparse``: HugeCTR's ``key`` + ``emb_vector``; ``npy``: a
    keys and a vectors ``.npy``), then files ``keys`` and ``vectors``, or ``path`` (a folder
    on the server holding ``key`` + ``emb_vector``, or ``keys.npy`` + ``vectors.npy``, under
    the path roots: anything else is a 400 ``path not allowed or not found``).
    The whole input is validated first (sizes, dims, finite values, and values the table's
    row format can hold: float16's range): a bad one gets a 4xx and nothing is written. Rows
    are stored in the table's format (``hps_row_dtype``), encoded as they are written. A
    job that fails while writing (a tier down) left the rows before its ``rows_done``
    written: run the same import again (upserts are idempotent).
    """
    state = _state(request)
    spec = state.spec(model, table)
    staged = state.uploads_dir / uuid.uuid4().hex
    form = await upload_form.receive(request, staged, TEXT_FIELDS, FILE_FIELDS)
    format: uploads.Format | None = None
    try:
        format, folder = _source(state, form, staged)
        src = uploads.source(folder, format, spec)
        total = await run_in_threadpool(uploads.validate, src)
    except BaseException as exc:
        shutil.rmtree(staged, ignore_errors=True)
        if form.files and format is not None:
            uploads.by_field(exc, staged, format, spec.name)  # not the staging path
        raise
    # recorded in the state dir (resumed after a restart); the staged folder goes when it ends
    job = state.submit_import(src, format, folder, staged if form.files else None, total)
    return {"job": job.id, "rows": total, "status_url": f"/v1/jobs/{job.id}"}


def _source(state: AdminState, form: upload_form.Form, staged: Path) -> tuple[uploads.Format, Path]:
    """The import's format and the folder to import from: ``staged`` holding the uploaded
    files under the format's names, or the server-side ``path`` (confined)."""
    fmt = form.text.get("format")
    if fmt not in ("sparse", "npy"):
        raise FormatError("form field `format` must be `sparse` or `npy`")
    format = cast(uploads.Format, fmt)
    path = form.text.get("path")
    if path is not None and form.files:
        raise RequestError("give either uploaded files (keys, vectors) or path, not both")
    if path is not None:
        return format, ServerPaths.of(state).folder(path, uploads.names(format))
    if set(form.files) != set(FILE_FIELDS):
        raise RequestError("give uploaded files keys and vectors, or a server-side path")
    return format, uploads.place(staged, format)
