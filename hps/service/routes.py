"""Read routes: health, readiness, config, models and tables, lookup, jobs."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from hps.redact import redact_mapping
from hps.service import health, info, ops
from hps.service.schemas import EXACT_BUSY, READ, WRITE, LookupBody, errors
from hps.service.state import AdminState
from hps.types import JSON

router = APIRouter()


def _state(request: Request) -> AdminState:
    state: AdminState = request.app.state.hps
    return state


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """The process lives (no dependency is checked). Answered on the event loop, not on
    one of the worker threads the sync routes share (busy ones cannot delay it)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["health"],
    responses={503: {"description": "not ready: the body names each failed check and why"}},
)
def readyz(request: Request) -> JSONResponse:
    """Ready when Triton, every model, one inference per model and every tier answer."""
    ok, checks = health.readiness(_state(request))
    body = redact_mapping({"ready": ok, "checks": checks})  # a check's error names no secret
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/v1/config", tags=["models"])
def config(request: Request) -> JSON:
    """The effective ps.json (defaults filled in), every secret-named value redacted."""
    return redact_mapping(_state(request).config.model_dump(mode="json"))


@router.get("/v1/models", tags=["models"], responses=errors(502, 503))
def models(request: Request) -> JSON:
    """Every model and table: dims, rows per tier, L1, hit rates, lag, versions; topology."""
    return redact_mapping(info.models_info(_state(request)))  # e.g. a broker's error text


@router.get("/v1/models/{model}/tables/{table}", tags=["models"], responses=READ | EXACT_BUSY)
def table(
    model: str,
    table: str,
    request: Request,
    exact: Annotated[
        bool, Query(description="count L3's rows exactly (a key scan; else RocksDB's estimate)")
    ] = False,
) -> JSON:
    """One table: dims, rows per tier (``rows_estimated`` names the tiers whose count is the
    store's estimate: L3 unless ``exact``), L1 capacity and policy, hit rates, lag, last
    version. At most a few exact counts run at once; past them: 429."""
    state = _state(request)
    return redact_mapping(info.one_table(state, state.spec(model, table), exact))


@router.post("/v1/models/{model}/tables/{table}/lookup", tags=["debug"], responses=WRITE)
def lookup(model: str, table: str, body: LookupBody, request: Request) -> JSON:
    """Where each key is found (l2, l3, default), its vector and version. Never writes L1."""
    state = _state(request)
    spec = state.spec(model, table)
    keys = np.asarray(body.keys, dtype=np.int64)
    return {"model": model, "table": table, "results": ops.lookup(state, spec, keys)}


@router.get("/v1/jobs/{job_id}", tags=["jobs"], responses=errors(404))
def job(job_id: str, request: Request) -> JSON:
    """Progress of an import: state, rows done, rows/s, result or error."""
    return _state(request).jobs.get(job_id).view()
