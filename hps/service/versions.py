"""The work behind ``/v1/models/{model}/versions``: list, import (a job), activate, retire.

A few calls into the core each (:mod:`hps.versions`, :func:`hps.triton.activation.activate`),
with the control plane's checks first, so that what the state of a version forbids is a
:class:`hps.errors.ConflictError` (409) and changes nothing:

- import: the number is taken (any state, retired too) -> 409; the model's first versioned
  import while its ps.json entry does not describe the rows version 1 holds (edited for the
  retrain) -> 409; the node keeps no version record (no state folder) -> 400; client-named
  files are confined (:mod:`hps.service.paths`); row formats, dimensions or dense weights
  that do not fit the model -> 400. The files' sizes and dimensions (the version's) are
  checked before the job is queued, their values when it starts, before anything is
  written. A job that fails leaves nothing of the version.
- activate: unknown version -> 404; loading or retired -> 409; no model repository of
  ``hps serve`` to write the version folders into -> 409.
- retire: unknown -> 404; live, served (kept for rollback below the live one, or named by
  the version policy an activation that did not finish wrote into the model repository)
  or loading while an import holds it -> 409; loading but abandoned (its import died: no
  import holds its marker) -> retired, its rows dropped, as ``hps versions retire`` does;
  retired already -> 200, nothing to do, unless its rows were left (a drop that failed):
  they are dropped now.

The checks run before the node's lock of version changes is taken; the core checks again
under it, and what it refuses then (another activation or retire, of this process or
another, changed the version meanwhile) is the same 409, not a 500.

Imports, activations and retires of this control plane never overlap with its other writes
of L2/L3 (:attr:`AdminState.writes`); activations and retires run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import asdict
from pathlib import Path

from hps.config import ModelConfig
from hps.errors import ConfigError, ConflictError, RequestError
from hps.loading.loader import TableSource, sparse_source
from hps.service import uploads
from hps.service.info import counting_exactly
from hps.service.job_records import Job, Work
from hps.service.paths import ServerPaths
from hps.service.schemas import VersionImportBody
from hps.service.state import AdminState
from hps.service.version_report import versions_report
from hps.types import JSON
from hps.versions import VersionRegistry

IMPORT_JOB = "import_version"
_submitting = threading.Lock()  # version imports are checked and queued one at a time


def listing(state: AdminState, model: str, exact: bool) -> JSON:
    """Every version of ``model`` with its rows and bytes per tier (``exact``: L3's counted
    exactly, bounded as :func:`hps.service.info.counting_exactly` says)."""
    state.config.model(model)  # an unknown model: 404
    with state.reading() as reader, counting_exactly(reader, exact):  # 429 past the bound
        return versions_report(state.config, model, reader, exact)


def _registry(state: AdminState) -> VersionRegistry:
    registry = VersionRegistry(state.config)
    if registry.path is None:
        raise RequestError(
            "model versions need a node state folder to be recorded in (a persistent_db, "
            "or a shared volatile_db): this node serves version 1 only"
        )
    return registry


def _entry(state: AdminState, model: str, body: VersionImportBody) -> ModelConfig:
    """The new version's entry: the ps.json's, with the client's files (confined), row
    formats and dimensions (400 where they do not fit the model)."""
    from hps.versions.rollout import version_entry

    base = state.config.model(model)
    paths = ServerPaths.of(state)
    sparse = None
    if body.sparse_files is not None:
        if len(body.sparse_files) != len(base.tables):
            raise RequestError(
                f"model {model!r} has {len(base.tables)} tables ({base.table_names}) but "
                f"{len(body.sparse_files)} sparse files were given"
            )
        sparse = [str(paths.folder(p, uploads.names("sparse"))) for p in body.sparse_files]
    dense = str(paths.file(body.dense_file)) if body.dense_file is not None else None
    row_dtype, dims = body.listed()
    try:
        return version_entry(
            state.config, model, sparse_files=sparse, dense_file=dense, row_dtype=row_dtype,
            dims=dims,
        )  # fmt: skip
    except ConfigError as exc:  # the body's values do not fit the model
        raise RequestError(str(exc)) from None


def _sources(entry: ModelConfig, version: int) -> list[TableSource]:
    """The version's sparse files as sources of its tables (sizes and dimensions checked)."""
    at = entry.at_version(version)
    if len(at.sparse_files) != len(at.tables):
        raise RequestError(f"model {entry.model!r} names no sparse files to import")
    return [sparse_source(s, p) for s, p in zip(at.tables, at.sparse_files, strict=True)]


def submit_import(state: AdminState, model: str, body: VersionImportBody) -> Job:
    """Queue the import of ``body.version`` of ``model`` (202; progress at
    ``/v1/jobs/{id}``). A model not recorded yet whose ps.json entry does not describe the
    rows the node holds of version 1 (edited for this retrain) is a 409: its first record
    would record version 1 so (:meth:`VersionRegistry.check_unrecorded`)."""
    state.config.model(model)
    registry = _registry(state)
    version = body.version
    target = f"{model}@{version}"
    # the number is checked and taken in one step: of concurrent imports of one number,
    # one is queued and the others are a 409 (its record is written when its job starts)
    with _submitting:
        if target in state.jobs.pending_targets(IMPORT_JOB):  # before the record: see below
            raise ConflictError(
                f"model {model!r} version {version} is being imported (a job queued or "
                "running): import under a new number"
            )
        # a job that ended after the look above has recorded its version (or failed,
        # leaving nothing of it)
        taken = {v.version: v.state for v in registry.versions(model)}
        if version in taken:
            raise ConflictError(
                f"model {model!r} version {version} exists ({taken[version]}): "
                "import under a new number"
            )
        try:
            registry.check_unrecorded(model)
        except ConfigError as exc:
            raise ConflictError(str(exc)) from None
        entry = _entry(state, model, body)
        sources = _sources(entry, version)
        job = Job(IMPORT_JOB, target, sum(s.rows for s in sources), params=_params(model, body))
        return state.jobs.submit(job, _import_work(state, entry, version, sources))


def _params(model: str, body: VersionImportBody) -> dict[str, str]:
    """The job's record of ``body`` (:func:`resume_import` reads it back; "": not given)."""
    given = body.model_dump(exclude={"version", "dense_file"})
    return {
        "model": model,
        "version": str(body.version),
        "dense_file": body.dense_file or "",
        **{key: "" if value is None else json.dumps(value) for key, value in given.items()},
    }


def _import_work(
    state: AdminState, entry: ModelConfig, version: int, sources: list[TableSource]
) -> Work:
    from hps.versions.rollout import import_version

    def work(job: Job) -> JSON:
        for source in sources:  # every value read once before anything is written
            uploads.validate(source)
        with state.writes:
            rows = import_version(state.config, entry, version)
        job.rows_done = sum(rows.values())
        state.reset_reader()
        return {"model": entry.model, "version": version, "state": "ready", "rows": rows}

    return work


def resume_import(state: AdminState, job: Job) -> Work:
    """The work of a version import found queued at start (checked again)."""
    p = job.params
    model = p["model"]
    given = {key: json.loads(p[key]) for key in ("sparse_files", "row_dtype", "dims") if p.get(key)}
    body = VersionImportBody(version=int(p["version"]), dense_file=p.get("dense_file") or None,
                             **given)  # fmt: skip
    taken = {v.version for v in _registry(state).versions(model)}
    if body.version in taken:
        raise ConflictError(f"model {model!r} version {body.version} exists")
    entry = _entry(state, model, body)
    return _import_work(state, entry, body.version, _sources(entry, body.version))


def activate(state: AdminState, model: str, version: int) -> JSON:
    """Make ``version`` live through Triton (:func:`hps.triton.activation.activate`)."""
    from hps.service.triton_admin import LOAD_TIMEOUT_S
    from hps.triton.activation import activate as activate_on
    from hps.triton.client import ModelControl

    state.config.model(model)
    registry = VersionRegistry(state.config)
    info = registry.get(model, version)  # unknown: 404
    if info.state not in ("ready", "live"):
        raise ConflictError(f"model {model!r} version {version} is {info.state}, not ready")
    repository = state.repository
    if repository is None or not repository.is_dir():
        raise ConflictError(
            f"no model repository of hps serve at {repository or '(none: no state folder)'} "
            "to write the version folders into; start hps serve with the node's state "
            "folder, or give hps admin --repository"
        )
    with state.versions_lock:
        state.wait_loaded(model)  # not while a reload of it runs
        control = ModelControl(state.triton.url, state.triton.admin_key, timeout=LOAD_TIMEOUT_S)
        # versions no longer kept are retired (their rows dropped) once it is live
        kept = registry.kept(model, live=version)
        retiring = any(
            (v.state in ("ready", "live") and v.version not in kept) or v.rows_left
            for v in registry.versions(model)
        )
        with state.writes if retiring else contextlib.nullcontext():
            try:
                done = activate_on(state.config, model, version, control, Path(repository))
            except ConfigError as exc:  # e.g. retired meanwhile (the core's check, locked)
                raise ConflictError(str(exc)) from None
        # Triton unloads the versions no longer served after the load returns (a rollback);
        # until they are gone its strict readiness is false: answer once it is back
        state.wait_loaded(model)
    state.reset_reader()
    return asdict(done)


def retire(state: AdminState, model: str, version: int) -> JSON:
    """Drop ``version``'s rows in every tier and record it retired."""
    from hps.versions.rollout import _abandoned, check_unserved
    from hps.versions.rollout import retire as retire_version

    state.config.model(model)
    registry = VersionRegistry(state.config)
    info = registry.get(model, version)  # unknown: 404
    answer: JSON = {"model": model, "version": version, "state": "retired"}
    if info.state == "retired" and not info.rows_left:
        return {**answer, "changed": False}
    if info.state == "live":
        raise ConflictError(f"model {model!r} version {version} is live: activate another first")
    if info.state == "loading" and not _abandoned(state.config, model, version):
        raise ConflictError(f"model {model!r} version {version} is loading (an import writes it)")
    if info.state != "retired":
        try:  # served by the record, or named by the policy Triton was last given
            check_unserved(state.config, registry, model, version, state.repository)
        except ConfigError as exc:
            raise ConflictError(str(exc)) from None
    with state.versions_lock, state.writes:
        # read again under the lock: of concurrent retires of one version, the first
        # changes it, the others find it retired (nothing left to drop) and say so
        again = VersionRegistry(state.config).get(model, version)
        if again.state == "retired" and not again.rows_left:
            return {**answer, "changed": False}
        try:
            retire_version(state.config, model, version, state.repository)
        except ConfigError as exc:  # e.g. made live meanwhile (the core's check, locked)
            raise ConflictError(str(exc)) from None
    state.reset_reader()
    return {**answer, "changed": True}
