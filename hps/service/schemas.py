"""Request bodies and the documented error answers of the control plane's routes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1, strict=True)]
MAX_LOOKUP_KEYS = 10_000
MAX_DELETE_KEYS = 1_000_000


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LookupBody(_Body):
    keys: list[Int64] = Field(min_length=1, max_length=MAX_LOOKUP_KEYS)


class DeleteBody(_Body):
    keys: list[Int64] = Field(min_length=1, max_length=MAX_DELETE_KEYS)


class WarmupBody(_Body):
    """One source: ``keys``, a ``keyset_path`` or a ``frequency_path`` (+ ``top_k``)."""

    table: str | None = Field(default=None, description="one table (default: every table)")
    keys: list[Int64] | None = Field(default=None, min_length=1, max_length=MAX_DELETE_KEYS)
    keyset_path: str | None = Field(default=None, description="keyset file on the server")
    frequency_path: str | None = Field(default=None, description=".npz frequency file")
    top_k: int | None = Field(default=None, ge=1, le=1 << 30, description="hottest k keys")

    @model_validator(mode="after")
    def _one_source(self) -> WarmupBody:
        given = [k for k in ("keys", "keyset_path", "frequency_path") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of keys, keyset_path, frequency_path (got {given})")
        if self.top_k is not None and self.frequency_path is None:
            raise ValueError("top_k goes with frequency_path")
        return self


class Error(BaseModel):
    error: str
    detail: Any


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route: these statuses, each with the Error body."""
    text = {
        400: "bad request (names what is wrong)",
        401: "missing or wrong bearer token",
        403: "mutations are disabled: no admin token configured",
        404: "unknown model, table or job",
        413: "request body too large",
        422: "invalid body or undecodable input",
        502: "a storage tier or Triton failed",
        503: "a tier or Triton cannot be reached now (retry)",
    }
    return {c: {"model": Error, "description": text[c]} for c in codes}


READ = errors(404, 413, 422, 502, 503)
WRITE = errors(400, 401, 403, 404, 413, 422, 502, 503)
