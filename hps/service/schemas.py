"""Request bodies and the documented error answers of the control plane's routes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from hps.config import ModelConfig
from hps.config.common import NAME_RE
from hps.config.model import MAX_DIM
from hps.rowformat import RowDtype
from hps.service.paths import MAX_PATH_CHARS
from hps.types import MAX_VERSION


# The document states the bounds +-(2**63 - 1024): JSON-schema tools read bounds as doubles,
# where 2**63 - 1 becomes 2**63, and generators then send keys the server must refuse.
def _json_integer(value: object) -> object:
    """JSON integers only (1.0 is one, per JSON Schema, and JSON-schema tools send such);
    no strings, no booleans."""
    if isinstance(value, (str, bytes, bool)):
        raise ValueError("must be a JSON integer")
    return value


Int64 = Annotated[
    int,
    BeforeValidator(_json_integer),
    Field(
        ge=-(2**63),
        le=2**63 - 1,
        json_schema_extra={"minimum": -(2**63) + 1024, "maximum": 2**63 - 1024},
    ),
]
MAX_LOOKUP_KEYS = 10_000
MAX_WRITE_KEYS = 1_000_000
"""Keys of one delete or warm-up: listed in the body, or read from a keyset or frequency file."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LookupBody(_Body):
    keys: list[Int64] = Field(min_length=1, max_length=MAX_LOOKUP_KEYS)


class DeleteBody(_Body):
    keys: list[Int64] = Field(min_length=1, max_length=MAX_WRITE_KEYS)


class _Warmup(_Body):
    table: str | None = Field(default=None, description="one table (default: every table)")


class WarmupKeys(_Warmup):
    keys: list[Int64] = Field(min_length=1, max_length=MAX_WRITE_KEYS)


# Server-side paths: absolute, under the control plane's path roots (hps.service.paths).
ServerPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
_UNDER_ROOTS = (
    ": an absolute path under the control plane's path roots (hps_admin.path_roots; default "
    "the ps.json's folder and the state folder); else 400 `path not allowed or not found`"
)


class WarmupKeyset(_Warmup):
    keyset_path: ServerPath = Field(
        description="keyset file on the server (raw int64 keys)" + _UNDER_ROOTS
    )


class WarmupFrequency(_Warmup):
    frequency_path: ServerPath = Field(
        description=".npz frequency file on the server" + _UNDER_ROOTS
    )
    top_k: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WRITE_KEYS,
        description=f"hottest k keys (default: all, at most the hottest {MAX_WRITE_KEYS:,})",
    )


WarmupBody = WarmupKeys | WarmupKeyset | WarmupFrequency

Dim = Annotated[
    int,
    BeforeValidator(_json_integer),
    Field(ge=1, le=MAX_DIM, json_schema_extra={"minimum": 1, "maximum": MAX_DIM}),
]
MAX_PER_TABLE = 1024
PerTable = Field(min_length=1, max_length=MAX_PER_TABLE)  # one for every table, or one per table
Version = Annotated[
    int,
    BeforeValidator(_json_integer),
    Field(ge=1, le=MAX_VERSION, json_schema_extra={"minimum": 1, "maximum": MAX_VERSION}),
]


class VersionImportBody(_Body):
    version: Version = Field(description="the new version's number: never used before")
    sparse_files: list[ServerPath] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PER_TABLE,
        description="one HugeCTR sparse-model folder (key + emb_vector) per table, in the "
        "model's table order (default: the ps.json entry's sparse_files)" + _UNDER_ROOTS,
    )
    dense_file: ServerPath | None = Field(
        default=None,
        description="the version's dense weights (default: the ps.json entry's dense_file)"
        + _UNDER_ROOTS,
    )
    row_dtype: Annotated[list[RowDtype], BeforeValidator(_one_or_list), PerTable] | None = Field(
        default=None,
        description="how every tier stores the version's rows: one format for every table, "
        "or a list of one for every table or one per table (default: the ps.json entry's "
        "hps_row_dtype, which describes version 1); another count of tables: 400",
    )
    dims: Annotated[list[Dim], BeforeValidator(_one_or_list), PerTable] | None = Field(
        default=None,
        description="the version's vector sizes: one for every table, or a list of one for "
        "every table or one per table (default: the ps.json entry's "
        "embedding_vecsize_per_table); another count of tables, or a CTR model's dense_file "
        "that does not take them: 400",
    )

    def listed(self) -> tuple[list[RowDtype] | None, list[int] | None]:
        """``row_dtype`` and ``dims`` (None: not given)."""
        return self.row_dtype, self.dims


def _one_or_list(value: object) -> object:
    """One value for every table: a list of one (its errors then name one type, not a
    union's arms). A list of more than :data:`MAX_PER_TABLE` items is refused before any
    item is validated (a body of millions would hold the event loop for seconds)."""
    if not isinstance(value, list):
        return [value]
    if len(value) > MAX_PER_TABLE:
        raise PydanticCustomError(
            "too_long",
            "List should have at most {max_length} items, not {actual_length}",
            {"max_length": MAX_PER_TABLE, "actual_length": len(value)},
        )
    return value


def _entry_schema(schema: dict[str, Any]) -> None:
    """What the validators of a model entry check, where JSON Schema can say it."""
    props = schema.get("properties", {})
    props.pop("version", None)  # not a ps.json key
    props["model"].update(pattern=NAME_RE.pattern, minLength=1)
    props["embedding_vecsize_per_table"].update(minItems=1)
    props["embedding_vecsize_per_table"]["items"].update(minimum=1)
    props["sparse_files"].update(minItems=1)
    props["sparse_files"].pop("default", None)
    schema["required"] = sorted({*schema.get("required", ()), "sparse_files"})


class ModelEntry(ModelConfig):
    """A ps.json model entry (one of ``models[]``), as ``POST /v1/models`` takes it: the
    ps.json's keys and rules. ``sparse_files`` (one HugeCTR sparse-model folder per table,
    required), ``dense_file``, ``network_file`` and ``hps_cache``'s files are absolute
    server paths under the control plane's path roots (``hps_admin.path_roots``; default
    the ps.json's folder and the state folder); else 400 ``path not allowed or not found``."""

    model_config = ConfigDict(json_schema_extra=_entry_schema)

    @model_validator(mode="before")
    @classmethod
    def _not_versioned(cls, data: object) -> object:
        if isinstance(data, dict) and "version" in data:
            raise ValueError(
                "version is not a ps.json key: a model added is served as its first version"
            )
        return data

    def entry(self) -> ModelConfig:
        """The same entry as a plain ModelConfig."""
        return ModelConfig.model_validate(self.model_dump())


class Error(BaseModel):
    error: str
    detail: object  # a message, or the list of a validation error's problems


def errors(*codes: int) -> dict[int | str, dict[str, object]]:
    """``responses=`` of a route: these statuses, each with the Error body."""
    text = {
        400: "bad request (names what is wrong); a server-side path not allowed or not found",
        401: "missing or wrong bearer token",
        403: "mutations are disabled: no admin token configured",
        404: "unknown model, table, model version or job",
        409: "the state of the model or model version forbids it (a model served already "
        "or the last one served; a version live, served, loading, retired, the number "
        "taken); nothing changed",
        413: "request body too large",
        422: "invalid body or undecodable input",
        502: "a storage tier or Triton failed",
        429: "import queue full: retry after the Retry-After header's seconds",
        503: "a tier or Triton cannot be reached now (retry)",
    }
    return {c: {"model": Error, "description": text[c]} for c in codes}


READ = errors(404, 413, 422, 502, 503)
EXACT_BUSY: dict[int | str, dict[str, Any]] = {
    429: {
        "model": Error,
        "description": "the bound of exact row counts running at once is reached: retry after "
        "the Retry-After header's seconds, or leave exact out (hps.service.info.MAX_EXACT_COUNTS)",
    }
}
"""What a read with ``exact=true`` may answer besides :data:`READ`."""
WRITE = errors(400, 401, 403, 404, 413, 422, 429, 502, 503)
VERSION_WRITE = errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503)
MODEL_WRITE = VERSION_WRITE
