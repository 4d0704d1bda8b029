"""One model's routes: ``GET /v1/models/{model}`` (its report), and adding and removing
models at runtime (:mod:`hps.service.models`).

The mutating ones take the bearer token like every other mutating route (checked by
:class:`hps.service.limits.TokenAndBodyLimits` before the body is read).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from hps.redact import redact_mapping
from hps.service import info, models
from hps.service.mutations import Auth
from hps.service.schemas import MODEL_WRITE, READ, ModelEntry
from hps.service.state import AdminState
from hps.types import JSON

router = APIRouter(tags=["models"])


def _state(request: Request) -> AdminState:
    state: AdminState = request.app.state.hps
    return state


@router.post("/v1/models", status_code=202, responses=MODEL_WRITE)
def add_model(entry: ModelEntry, request: Request, _: Auth) -> JSON:
    """Add a model from a ps.json model entry and serve it, as a job (progress at
    ``/v1/jobs/{id}``, kind ``add_model``): its tables are imported as its first version
    (live), then its Triton models (``<model>``, and ``<model>_ctr`` for a CTR
    ``dense_file``) are loaded. Nothing restarts; the other models are not touched.

    A model served already (or a name one of its Triton models would take) is a 409, as is
    a removed model whose rows are kept (``DELETE /v1/models/{model}?purge=true`` first).
    The files' sizes and dimensions are checked before the answer, their values when the
    job starts; a job that fails leaves the model unserved and none of its rows."""
    job = models.submit_add(_state(request), entry.entry())
    return {
        "job": job.id,
        "model": entry.model,
        "rows": job.rows_total,
        "status_url": f"/v1/jobs/{job.id}",
    }


@router.get("/v1/models/{model}", responses=READ)
def model(model: str, request: Request) -> JSON:
    """One model the node serves, as ``GET /v1/models`` lists it: its live version,
    instances and tables. A model not served (never, or removed): 404."""
    return redact_mapping(info.model_info(_state(request), model))


@router.delete("/v1/models/{model}", responses=MODEL_WRITE)
def remove_model(
    model: str,
    request: Request,
    _: Auth,
    purge: Annotated[
        bool, Query(description="also drop the rows of every version of it in every tier")
    ] = False,
) -> JSON:
    """Stop serving a model: recorded removed (a restarted ``hps serve`` does not serve it
    either), its Triton models unloaded once their requests in flight finish. Its rows stay
    unless ``purge=true``; a model removed before can be purged later the same way. The
    last model the node serves: 409; a model it never served: 404."""
    return models.remove(_state(request), model, purge)
