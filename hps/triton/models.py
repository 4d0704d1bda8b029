"""Models added and removed while ``hps serve`` runs (the control plane's ``POST /v1/models``
and ``DELETE /v1/models/{model}``): the record is :mod:`hps.versions.models`; this is
Triton's part, over the repository ``hps serve`` keeps beside L3
(:func:`hps.loading.imports.repository_dir`).

- :func:`add_and_serve`: import the model's tables as its first version, write its Triton
  models' folders (the embedding model, and ``<model>_ctr`` for a CTR model) with the
  parameters ``hps serve`` gave the others, and load them. The other models are not touched.
  When that fails (Triton unreachable, a load refused), the add is undone step by step,
  each step tried whatever the others did: recorded removed, its Triton models unloaded
  (one that never loaded failing to unload is only a warning), their folders deleted, its
  rows purged in every tier and its version's files deleted; the name can be added again,
  and the error raised is the load's.
- :func:`remove`: record it removed (a restart will not serve it), unload its Triton models
  (requests in flight finish), delete their folders, and with ``purge`` drop its rows in
  every tier. An unload that failed leaves the folders (:func:`left_loaded`): removing the
  model again unloads them (:func:`unload`) before anything else.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from hps.config import ModelConfig, PSConfig
from hps.errors import BackendUnavailable, ConfigError
from hps.triton.client import ModelControl
from hps.triton.repository import get_parameter, prepare_repository, served_models
from hps.versions.models import (
    add_model,
    drop_version_files,
    mark_removed,
    purge,
    served_config,
)

log = logging.getLogger(__name__)

UNLOAD_TIMEOUT_S = 120.0


def _parameters(repository: Path) -> tuple[str, float]:
    """``base_dir`` and ``metrics_interval_s`` as ``hps serve`` wrote them for its models."""
    for cfg in sorted(repository.glob("*/config.pbtxt")):
        text = cfg.read_text()
        base, interval = get_parameter(text, "base_dir"), get_parameter(text, "metrics_interval_s")
        if base is not None and interval is not None:
            return base, float(interval)
    raise ConfigError(f"{repository}: no model written by hps serve to take parameters from")


def add_and_serve(
    config: PSConfig, entry: ModelConfig, control: ModelControl, repository: Path
) -> tuple[int, list[str]]:
    """Add ``entry`` as a new model and serve it; (its version, its Triton models)."""
    base, interval = _parameters(repository)  # before anything is recorded
    version = add_model(config, entry)
    served = config
    try:
        served = served_config(config)
        names = prepare_repository(served, repository, base_dir=base or None,
                                   metrics_interval_s=interval, models=[entry.model])  # fmt: skip
        for name in names:
            control.load(name)
    except BaseException:
        _undo_add(served, entry, version, control, repository)
        raise
    return version, names


def _undo_add(
    config: PSConfig, entry: ModelConfig, version: int, control: ModelControl, repository: Path
) -> None:
    """Undo the add of ``entry`` (its first ``version``) whose Triton load failed, each step
    whatever the others did: what fails is logged, never raised (the load's error is the
    one the caller raises). Its rows are dropped once it is recorded removed."""
    model, names = entry.model, list(entry.triton_names)
    try:
        mark_removed(config, model, check_last=False)  # first: a restart does not serve it
        removed = True
    except Exception as exc:  # noqa: BLE001 - the load's error is the one to raise
        removed = False
        log.error("model %s: its add failed, but it could not be recorded removed (%s); "
                  "DELETE /v1/models/%s?purge=true removes it", model, exc, model)  # fmt: skip
    unloading = []
    for name in names:
        try:
            control.unload(name)
            unloading.append(name)
        except Exception as exc:  # noqa: BLE001 - never loaded, or Triton unreachable
            log.warning("model %s: Triton model %s not unloaded after the failed add (%s)",
                        model, name, exc)  # fmt: skip
    _wait_unloaded(control, unloading)
    for name in names:
        shutil.rmtree(repository / name, ignore_errors=True)
    if not removed:
        return
    try:
        purge(config, model)
    except Exception as exc:  # noqa: BLE001
        log.error("model %s: its add failed and its rows could not be dropped (%s); "
                  "DELETE /v1/models/%s?purge=true drops them", model, exc, model)  # fmt: skip
    try:
        drop_version_files(config, model, version)
    except Exception as exc:  # noqa: BLE001
        log.warning("model %s: the files of its failed add's version %d were not deleted "
                    "(%s)", model, version, exc)  # fmt: skip


def _wait_unloaded(control: ModelControl, names: list[str]) -> None:
    """Until Triton has unloaded ``names`` (requests in flight finished), within
    :data:`UNLOAD_TIMEOUT_S`; not knowing (Triton unreachable) is a warning."""
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    while names:
        try:
            states = control.states()
        except Exception as exc:  # noqa: BLE001
            log.warning("Triton models %s: unload not confirmed (%s)", names, exc)
            return
        if not any(states.get(n) in ("READY", "UNLOADING") for n in names):
            return
        if time.monotonic() > deadline:
            log.warning("Triton did not unload %s in %.0fs", names, UNLOAD_TIMEOUT_S)
            return
        time.sleep(0.1)


def remove(
    config: PSConfig, model: str, control: ModelControl, repository: Path, *, purge_rows: bool
) -> list[str]:
    """Stop serving ``model`` (and with ``purge_rows`` drop its rows); its Triton models."""
    served = served_config(config)
    names = [s.triton_name for s in served_models(served) if s.hps_model == model]
    if not names:
        raise ConfigError(f"model {model!r} is not served here")
    mark_removed(served, model)
    unload(control, repository, names)
    if purge_rows:
        purge(served, model)
    return names


def left_loaded(repository: Path, model: str) -> list[str]:
    """The Triton models of ``model`` whose folders are still in the repository: a removal
    recorded whose unload failed (Triton unreachable) left them, maybe still served."""
    return [n for n in (model, f"{model}_ctr") if (repository / n).is_dir()]


def unload(control: ModelControl, repository: Path, names: list[str]) -> None:
    """Unload the Triton models ``names`` (requests in flight finish), then delete their
    folders; BackendUnavailable when Triton cannot be told or does not unload them within
    :data:`UNLOAD_TIMEOUT_S` (the folders stay: a later removal finishes it)."""
    for name in names:
        control.unload(name)
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    while any(control.states().get(n) in ("READY", "UNLOADING") for n in names):
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"Triton did not unload {names} in {UNLOAD_TIMEOUT_S:.0f}s")
        time.sleep(0.1)
    for name in names:
        shutil.rmtree(repository / name, ignore_errors=True)
