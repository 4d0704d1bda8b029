"""Model-version routes: list, import, activate, retire (:mod:`hps.service.versions`).

The mutating ones take the bearer token like every other (checked by
:class:`hps.service.limits.TokenAndBodyLimits` before the body is read).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from hps.service import versions
from hps.service.mutations import Auth
from hps.service.schemas import EXACT_BUSY, READ, VERSION_WRITE, VersionImportBody
from hps.service.state import AdminState
from hps.types import JSON, MAX_VERSION

router = APIRouter(tags=["versions"])
VersionParam = Annotated[int, Path(ge=1, le=MAX_VERSION, description="the model version")]


def _state(request: Request) -> AdminState:
    state: AdminState = request.app.state.hps
    return state


@router.get("/v1/models/{model}/versions", responses=READ | EXACT_BUSY)
def list_versions(
    model: str,
    request: Request,
    exact: Annotated[bool, Query(description="count L3's rows exactly (a key scan)")] = False,
) -> JSON:
    """Every version of the model, oldest first: number, state (``loading``, ``ready``,
    ``live``, ``retired``), ``rows_left`` (retired, its rows not dropped yet: a drop that
    failed, done again by a retire of it or the next activation), ``shared_rows_left``
    (retired, its rows in a shared Redis L2 kept while another node holds it: dropped by
    the control plane once none does), created (unix time; null
    for a version 1 never recorded), whether Triton serves it, its tables' ``dims`` and
    ``row_dtypes``, rows and bytes per tier
    (null where a tier cannot tell); with the live version, the served ones and
    ``hps_keep_versions``."""
    return versions.listing(_state(request), model, exact)


@router.post("/v1/models/{model}/versions", status_code=202, responses=VERSION_WRITE)
def import_version(model: str, body: VersionImportBody, request: Request, _: Auth) -> JSON:
    """Import a new version beside the live one, as a job (progress at ``/v1/jobs/{id}``).

    ``sparse_files`` (one server-side folder per table), ``dense_file``, ``row_dtype`` and
    ``dims`` default to the ps.json entry's; client-named paths must lie under the path
    roots (else 400 ``path not allowed or not found``); row formats or dimensions that are
    not one for every table or one per table, or dense weights that do not take the
    dimensions, are a 400. The version becomes ``ready``; nothing served changes until it
    is activated. A number used before (even retired) is a 409, and so is a first versioned
    import whose ps.json entry does not describe the rows version 1 holds (an entry edited
    for the retrain: give the new formats and dimensions here instead)."""
    state = _state(request)
    job = versions.submit_import(state, model, body)
    return {
        "job": job.id,
        "model": model,
        "version": body.version,
        "rows": job.rows_total,
        "status_url": f"/v1/jobs/{job.id}",
    }


@router.post("/v1/models/{model}/versions/{version}/activate", responses=VERSION_WRITE)
def activate(model: str, version: VersionParam, request: Request, _: Auth) -> JSON:
    """Make a ready version live (Triton loads it, warm, before it takes traffic); answers
    once it is: ``live``, ``previous``, ``served`` (the versions Triton serves now),
    ``retired`` (versions beyond ``hps_keep_versions``, retired now), ``rows_left`` (retired
    versions whose rows could not be dropped yet, e.g. L3 held by ``hps consume``: the
    activation is done regardless; the next one or a retire drops them) and ``problem``
    (why; null when none). Activating a kept older version is a rollback (no import).
    Unknown: 404; loading or retired: 409."""
    return versions.activate(_state(request), model, version)


@router.delete("/v1/models/{model}/versions/{version}", responses=VERSION_WRITE)
def retire(model: str, version: VersionParam, request: Request, _: Auth) -> JSON:
    """Retire a version: its rows dropped in every tier, its number never reused. The live
    version, a served one (kept below the live one) or one an import is writing: 409 (one
    whose import died is retired). When the
    drop fails (502/503) the version stays retired with ``rows_left``: retire it again."""
    return versions.retire(_state(request), model, version)
