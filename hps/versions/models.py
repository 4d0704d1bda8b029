"""Models added and removed at runtime, recorded beside their versions.

A model added at runtime (``POST /v1/models``) is not in the ps.json: its entry lives in the
node's version record (:mod:`hps.versions.registry`), flagged ``runtime``, and every process
that reads the ps.json as served (:func:`served_config`, called by
:func:`hps.triton.serving.serving_config`) sees it beside the ps.json's models. A removed model
(``DELETE /v1/models/{model}``) is flagged ``removed``: no process serves it any more, even if
the ps.json names it; its rows stay until it is purged (``?purge=true``: every version's rows
dropped in every tier, the versions recorded retired). A removed model's name can be added
again once it is purged; its version numbers go on from the highest it had. An add whose
Triton load fails is undone that way (recorded removed, purged, its version's files on this
node deleted: :func:`hps.versions.rollout.drop_version_files`), so that it can be submitted
again.

Triton's part (writing the model's folder and loading it, unloading it) is
:mod:`hps.triton.models`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import cast

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError, UnknownTableError
from hps.types import JSON
from hps.versions.registry import VersionRegistry
from hps.versions.rollout import _abandoned, drop_files_logged, drop_versions, import_version
from hps.versions.rollout import drop_version_files as drop_version_files  # hps.triton.models

log = logging.getLogger(__name__)


def served_config(config: PSConfig) -> PSConfig:
    """``config`` with the models this node serves: the ps.json's but those removed at
    runtime, then those added at runtime (each at its live version; one still importing
    its first version has none yet and is not served)."""
    registry = VersionRegistry(config)
    if registry.path is None or not registry.path.exists():
        return config
    models = [m for m in config.models if not registry.removed(m.model)]
    for name in registry.runtime_models():
        try:
            models.append(registry.model_at(name, registry.live(name)))
        except UnknownTableError:  # being added: not live yet
            continue
    return config.model_copy(update={"models": models})


def _served_names(config: PSConfig, registry: VersionRegistry) -> set[str]:
    """The ps.json's models not removed, and those added at runtime that have a live
    version (one whose first import is under way, or died, is not served)."""
    names = {m.model for m in config.models if not registry.removed(m.model)}
    return names | {n for n in registry.runtime_models() if _has_live(registry, n)}


def _has_live(registry: VersionRegistry, model: str) -> bool:
    return any(v.state == "live" for v in registry.versions(model))


def _clear_a_died_add(config: PSConfig, registry: VersionRegistry, name: str) -> None:
    """A model added at runtime whose first import died (the process killed) is left
    ``loading`` with no live version: drop what it wrote and record it retired, so that
    the name can be added again. One whose import runs is a ConfigError."""
    if name not in registry.runtime_models() or _has_live(registry, name):
        return
    pending = [v for v in registry.versions(name) if v.state != "retired" or v.rows_left]
    if any(v.state != "loading" or not _abandoned(config, name, v.version) for v in pending):
        raise ConfigError(f"model {name!r} is being added (its first version is importing)")
    if pending:
        kept = drop_versions(config, [v.model_config() for v in pending])
        for v in pending:
            registry.set_state(name, v.version, "retired",
                               shared_rows_left=(name, v.version) in kept)  # fmt: skip
            if (name, v.version) not in kept:
                drop_files_logged(config, name, v.version)
        log.warning(
            "model %s: dropped the rows of an add that died (version %s)",
            name, ", ".join(str(v.version) for v in pending),
        )  # fmt: skip


def add_model(config: PSConfig, entry: ModelConfig, *, progress: bool = False) -> int:
    """Record ``entry`` as a model of this node and import its tables as its first version
    (live); the version number (1, or after the highest a purged model of that name had).
    Its tables must name their sparse files; a served model's name is a ConfigError."""
    registry = VersionRegistry(config)
    name = entry.model
    _clear_a_died_add(config, registry, name)
    with registry.editing() as doc:
        if name in _served_names(config, registry):
            raise ConfigError(f"model {name!r} is served already; import a new version of it")
        taken = {
            n
            for served in _served_names(config, registry)
            for n in registry.model_at(served, registry.live(served)).triton_names
        }
        if clash := sorted(taken.intersection(entry.triton_names)):
            raise ConfigError(
                f"model {name!r} would be served as {clash}, a Triton model served already "
                "(a model's CTR network is served as <model>_ctr): choose another name"
            )
        rec = cast(JSON, doc.get(name) or {})
        old = cast(dict[str, JSON], rec.get("versions", {}))
        if any(cast(JSON, v)["state"] != "retired" for v in old.values()):
            raise ConfigError(
                f"model {name!r} was removed but its rows are kept; remove it with purge first"
            )
        version = max(map(int, old), default=0) + 1
        previous = doc.get(name)
        doc[name] = {"runtime": name not in {m.model for m in config.models}, "versions": old}
    with_model = config.model_copy(
        update={"models": [*(m for m in config.models if m.model != name), entry]}
    )
    try:
        import_version(with_model, entry, version, progress=progress)
    except BaseException:
        with registry.editing() as doc:  # as it was before
            if previous is None:
                doc.pop(name, None)
            else:
                doc[name] = previous
        raise
    VersionRegistry(with_model).set_live(name, version)
    return version


def mark_removed(config: PSConfig, model: str, *, check_last: bool = True) -> None:
    """Record ``model`` removed (no process serves it from now on); its rows stay. Removing
    the last model the node serves is a ConfigError, unless not ``check_last`` (a model
    whose add failed at its Triton load: it never served, so nothing served is lost)."""
    registry = VersionRegistry(config)
    current = registry.versions(model)  # the ps.json's implicit version 1 made explicit
    with registry.editing() as doc:
        if check_last and _served_names(config, registry) - {model} == set():
            raise ConfigError(f"model {model!r} is the last one this node serves")
        rec = cast(JSON, doc.get(model) or {})
        rec.setdefault("versions", {str(v.version): asdict(v) for v in current})
        rec["removed"] = True
        doc[model] = rec


def purge(config: PSConfig, model: str) -> list[int]:
    """Drop the rows of every version of a removed model in every tier (those of retired
    versions whose rows were left too) and record them retired; the versions purged."""
    registry = VersionRegistry(config)
    if not registry.removed(model):
        raise ConfigError(f"model {model!r} is served: remove it before purging it")
    infos = [v for v in registry.versions(model) if v.state != "retired" or v.rows_left]
    kept = drop_versions(config, [v.model_config() for v in infos])
    dropped = {v.version for v in infos}
    with registry.editing() as doc:
        rec = cast(JSON, doc.get(model) or {})
        versions = cast(dict[str, JSON], rec.get("versions", {}))
        for n, v in versions.items():
            cast(JSON, v)["state"] = "retired"
            cast(JSON, v)["rows_left"] = False
            if int(n) in dropped:  # one retired before keeps its shared rows' flag
                cast(JSON, v)["shared_rows_left"] = (model, int(n)) in kept
        doc[model] = rec
    for info in infos:
        if (model, info.version) not in kept:
            drop_files_logged(config, model, info.version)
    return [info.version for info in infos]
