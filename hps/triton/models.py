"""Models added and removed while ``hps serve`` runs (the control plane's ``POST /v1/models``
and ``DELETE /v1/models/{model}``): the record is :mod:`hps.versions.models`; this is
Triton's part, over the repository ``hps serve`` keeps beside L3
(:func:`hps.triton.repository.repository_dir`).

- :func:`add_and_serve`: import the model's tables as its first version, write its Triton
  models' folders (the embedding model, and ``<model>_ctr`` for a CTR model) with the
  parameters ``hps serve`` gave the others, and load them. The other models are not touched.
- :func:`remove`: record it removed (a restart will not serve it), unload its Triton models
  (requests in flight finish), delete their folders, and with ``purge`` drop its rows in
  every tier.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from hps.config import ModelConfig, PSConfig
from hps.errors import BackendUnavailable, ConfigError
from hps.triton.client import ModelControl
from hps.triton.repository import get_parameter, prepare_repository, served_models
from hps.versions.models import add_model, mark_removed, purge, served_config

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
    served = served_config(config)
    try:
        names = prepare_repository(served, repository, base_dir=base or None,
                                   metrics_interval_s=interval, models=[entry.model])  # fmt: skip
        for name in names:
            control.load(name)
    except BaseException:
        remove(served, entry.model, control, repository, purge_rows=True)
        raise
    return version, names


def remove(
    config: PSConfig, model: str, control: ModelControl, repository: Path, *, purge_rows: bool
) -> list[str]:
    """Stop serving ``model`` (and with ``purge_rows`` drop its rows); its Triton models."""
    served = served_config(config)
    names = [s.triton_name for s in served_models(served) if s.hps_model == model]
    if not names:
        raise ConfigError(f"model {model!r} is not served here")
    mark_removed(served, model)
    for name in names:
        control.unload(name)
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    while any(control.states().get(n) in ("READY", "UNLOADING") for n in names):
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"Triton did not unload {names} in {UNLOAD_TIMEOUT_S:.0f}s")
        time.sleep(0.1)
    for name in names:
        shutil.rmtree(repository / name, ignore_errors=True)
    if purge_rows:
        purge(served, model)
    return names
