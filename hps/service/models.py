"""The work behind ``POST /v1/models`` (add a model, as a job) and ``DELETE
/v1/models/{model}`` (stop serving it; with ``purge``, drop its rows).

A few calls into the core (:mod:`hps.triton.models`, :mod:`hps.versions.models`), with the
control plane's checks first, so that a refusal changes nothing:

- add: the entry is a ps.json model entry (validated by the route: 422); a model served now
  or being added (its name, or one of its Triton models' names) -> 409; a removed model
  whose rows are kept -> 409 (purge it first); no node state folder -> 400; no model
  repository of ``hps serve`` -> 409. Its tables need ``sparse_files``, one per table (400),
  and every file it names (sparse files, ``dense_file``, ``network_file``,
  ``hps_cache.frequency_file`` and ``warmup_keyset``) is confined to the path roots
  (:mod:`hps.service.paths`). The files' sizes and dimensions are checked before the job
  is queued, their values when it starts, before anything is written. The job imports the
  tables as the model's first version (live) and loads its Triton models
  (:func:`hps.triton.models.add_and_serve`); a failure leaves it unserved and none of its
  rows (a failed import is undone; a failed load is removed and purged).
- remove: a model the node never served -> 404; the last one it serves -> 409. A served
  model is recorded removed, its Triton models unloaded (requests in flight finish) and
  their folders deleted; ``purge`` drops every version's rows in every tier. A model
  removed before: only ``purge`` has something to do.

Both run one at a time with activations and retires (:attr:`AdminState.versions_lock`),
and never beside this control plane's other writes of L2/L3 (:attr:`AdminState.writes`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from hps.config import ModelConfig
from hps.errors import ConfigError, ConflictError, RequestError, UnknownTableError
from hps.loading.loader import TableSource, sparse_source
from hps.service import uploads
from hps.service.job_records import Job, Work
from hps.service.paths import ServerPaths
from hps.service.state import AdminState
from hps.triton.repository import served_models
from hps.types import JSON
from hps.versions import VersionInfo, VersionRegistry

ADD_JOB = "add_model"


def _repository(state: AdminState) -> Path:
    repository = state.repository
    if repository is None or not repository.is_dir():
        raise ConflictError(
            f"no model repository of hps serve at {repository or '(none: no state folder)'} "
            "to write the model's folders into; start hps serve with the node's state "
            "folder, or give hps admin --repository"
        )
    return Path(repository)


def registry_of(state: AdminState) -> VersionRegistry:
    """The node's record, where models added or removed at runtime are kept (400: none)."""
    registry = VersionRegistry(state.config)
    if registry.path is None:
        raise RequestError(
            "models are added and removed at runtime in the node's state folder (a "
            "persistent_db, or a shared volatile_db); this node has none: it serves the "
            "ps.json's models"
        )
    return registry


def _check_addable(state: AdminState, entry: ModelConfig) -> VersionRegistry:
    """409 unless ``entry``'s model and Triton names are free on this node."""
    registry = registry_of(state)
    name = entry.model
    config = state.config
    if name in {m.model for m in config.models}:
        raise ConflictError(
            f"model {name!r} is served already; import a new version of it "
            f"(POST /v1/models/{name}/versions)"
        )
    taken = {s.triton_name: s.hps_model for s in served_models(config)}
    for s in served_models(config.model_copy(update={"models": [entry]})):
        if s.triton_name in taken:
            raise ConflictError(
                f"model {name!r} would be served as Triton model {s.triton_name!r}, which "
                f"serves model {taken[s.triton_name]!r}"
            )
    if registry.removed(name) and any(v.state != "retired" for v in registry.versions(name)):
        raise ConflictError(
            f"model {name!r} was removed but its rows are kept: remove it with purge first "
            f"(DELETE /v1/models/{name}?purge=true)"
        )
    if any(v.state == "loading" for v in _recorded(registry, name)):
        raise ConflictError(f"model {name!r} is being added")
    return registry


def _recorded(registry: VersionRegistry, name: str) -> list[VersionInfo]:
    try:
        return registry.versions(name)
    except UnknownTableError:  # neither in the ps.json nor recorded
        return []


def _confined(state: AdminState, entry: ModelConfig) -> ModelConfig:
    """``entry`` with every file it names checked against the path roots (resolved)."""
    paths = ServerPaths.of(state)
    if len(entry.sparse_files) != len(entry.tables):
        raise RequestError(
            f"model {entry.model!r} has {len(entry.tables)} tables ({entry.table_names}) but "
            f"{len(entry.sparse_files)} sparse_files: a model added at runtime is imported "
            "from one HugeCTR sparse-model folder per table"
        )
    sparse = [str(paths.folder(p, uploads.names("sparse"))) for p in entry.sparse_files]
    update: dict[str, object] = {"sparse_files": sparse}
    for key in ("dense_file", "network_file"):
        if getattr(entry, key):
            update[key] = str(paths.file(getattr(entry, key)))
    cache = {
        key: str(paths.file(value))
        for key in ("frequency_file", "warmup_keyset")
        if (value := getattr(entry.hps_cache, key))
    }
    if cache:
        update["hps_cache"] = entry.hps_cache.model_copy(update=cache)
    return entry.model_copy(update=update)


def _sources(entry: ModelConfig) -> list[TableSource]:
    """The model's sparse files as sources of its tables (sizes and dimensions checked)."""
    return [sparse_source(s, p) for s, p in zip(entry.tables, entry.sparse_files, strict=True)]


def submit_add(state: AdminState, entry: ModelConfig) -> Job:
    """Queue the addition of ``entry`` (202; progress at ``/v1/jobs/{id}``)."""
    _check_addable(state, entry)
    entry = _confined(state, entry)
    sources = _sources(entry)
    _repository(state)
    params = {"entry": json.dumps(entry.model_dump(mode="json"))}
    job = Job(ADD_JOB, entry.model, sum(s.rows for s in sources), params=params)
    return state.jobs.submit(job, _add_work(state, entry, sources))


def _add_work(state: AdminState, entry: ModelConfig, sources: list[TableSource]) -> Work:
    from hps.service.triton_admin import LOAD_TIMEOUT_S
    from hps.triton.client import ModelControl
    from hps.triton.models import add_and_serve

    def work(job: Job) -> JSON:
        for source in sources:  # every value read once before anything is written
            uploads.validate(source)
        repository = _repository(state)
        with state.versions_lock, state.writes:
            _check_addable(state, entry)  # again: the node's models may have changed since
            control = ModelControl(state.triton.url, state.triton.admin_key, timeout=LOAD_TIMEOUT_S)
            try:
                version, names = add_and_serve(state.config, entry, control, repository)
            except ConfigError as exc:  # what the record forbids now (another process)
                raise ConflictError(str(exc)) from None
        job.rows_done = job.rows_total
        state.reset_reader()
        return {"model": entry.model, "version": version, "state": "live", "triton_models": names}

    return work


def resume_add(state: AdminState, job: Job) -> Work:
    """The work of an addition found queued at start (checked again)."""
    entry = _confined(state, ModelConfig.model_validate(json.loads(job.params["entry"])))
    _check_addable(state, entry)
    return _add_work(state, entry, _sources(entry))


def remove(state: AdminState, model: str, purge: bool) -> JSON:
    """Stop serving ``model``; with ``purge`` drop its rows in every tier."""
    from hps.service.triton_admin import LOAD_TIMEOUT_S
    from hps.triton.client import ModelControl
    from hps.triton.models import left_loaded, unload
    from hps.triton.models import remove as remove_on
    from hps.versions.models import purge as purge_rows

    registry = registry_of(state)
    served = [m.model for m in state.config.models]
    answer: JSON = {"model": model, "served": False}
    if model not in served and not registry.removed(model):
        raise UnknownTableError(f"unknown model {model!r}; served: {served}")
    if model in served and len(served) == 1:
        raise ConflictError(f"model {model!r} is the last one this node serves: add another first")
    kept = [v.version for v in registry.versions(model) if v.state != "retired" or v.rows_left]
    if model not in served:  # removed before: what its removal left undone, its rows if asked
        repository = state.repository
        left = left_loaded(repository, model) if repository is not None else []
        if left:  # its unload failed: Triton may still serve it (before its rows go)
            assert repository is not None
            control = ModelControl(state.triton.url, state.triton.admin_key, timeout=LOAD_TIMEOUT_S)
            with state.versions_lock:
                unload(control, repository, left)
        if not purge or not kept:
            return {**answer, "changed": bool(left), "unloaded": left, "purged": [],
                    "shared_rows_kept": _shared_rows_kept(state, model)}  # fmt: skip
        with state.versions_lock, state.writes:
            state.reset_reader()
            try:
                purged = purge_rows(state.config, model)
            except ConfigError as exc:  # added again meanwhile (another process)
                raise ConflictError(str(exc)) from None
        state.reset_reader()
        return {**answer, "changed": True, "unloaded": left, "purged": purged,
                "shared_rows_kept": _shared_rows_kept(state, model)}  # fmt: skip
    repository = _repository(state)
    with state.versions_lock:
        state.wait_loaded(model)  # not while a reload of it runs
        control = ModelControl(state.triton.url, state.triton.admin_key, timeout=LOAD_TIMEOUT_S)
        with state.writes if purge else contextlib.nullcontext():
            state.reset_reader()
            try:
                names = remove_on(state.config, model, control, repository, purge_rows=purge)
            except ConfigError as exc:  # e.g. removed meanwhile by another process
                raise ConflictError(str(exc)) from None
    state.reset_reader()
    return {**answer, "changed": True, "unloaded": names, "purged": kept if purge else [],
            "shared_rows_kept": _shared_rows_kept(state, model)}  # fmt: skip


def _shared_rows_kept(state: AdminState, model: str) -> list[int]:
    """The versions of ``model`` whose rows a shared Redis L2 keeps for another node
    (dropped by this node's control plane once none holds them: docs/versions.md)."""
    return [v.version for v in registry_of(state).versions(model) if v.shared_rows_left]
