"""Activating a model version on a Triton server (``hps versions activate``, the control
plane's ``POST /v1/models/{model}/versions/{n}/activate``).

Each HPS model version is a Triton model version (:mod:`hps.versions`). Triton loads the
versions the record says to serve (:meth:`hps.versions.VersionRegistry.served`: the kept
ones up to the live one) and sends an unversioned request to the highest ready one, so:

1. the model folders (the embedding model and, for a CTR model, ``<model>_ctr``) get the
   new version's folder and a version policy naming the versions to serve;
2. Triton loads them: the new version's instances import nothing (the version is imported),
   fill their L2 and warm their L1 before Triton sends them traffic; versions no longer
   served are unloaded once their in-flight requests finish (a rollback);
3. once Triton has unloaded the versions no longer served (their requests in flight
   finished), the version is recorded live, and versions beyond ``hps_keep_versions`` are
   retired (their rows dropped in every tier), with any retired before whose rows were left.

The switch is done once the version is recorded live: a drop of old rows that fails then
(L3 held by ``hps consume``) does not fail the activation. It is logged, the versions are
reported in :attr:`Activation.rows_left` (recorded retired with their rows left: the next
activation, a retire of them or a purge drops them), and the activation returns.

A failed load leaves Triton serving what it served and the record unchanged (the folders'
policy is put back). A crash between 2 and 3 leaves each request answered by one whole
version, and a restarted ``hps serve`` serves the version recorded live.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hps.config import PSConfig
from hps.errors import ConfigError
from hps.triton.client import ModelControl
from hps.triton.repository import served_models, write_versions
from hps.versions import VersionRegistry
from hps.versions.rollout import retire_held

log = logging.getLogger(__name__)

UNLOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Activation:
    """What :func:`activate` did."""

    model: str
    live: int  # the version now live
    previous: int  # the version live before
    served: list[int]  # the versions Triton serves now
    retired: list[int]  # versions retired now (beyond hps_keep_versions)
    rows_left: list[int]  # retired versions whose rows are not dropped yet (a drop failed)
    problem: str | None  # why the first of them was not dropped


def activate(
    config: PSConfig, model: str, version: int, control: ModelControl, repository: Path
) -> Activation:
    """Make ``version`` (ready, or live already) the live version of ``model`` on the Triton
    server ``control`` reaches, whose repository is ``repository``; under the node's lock of
    version changes (no retire of another process interleaves)."""
    registry = VersionRegistry(config)
    with registry.changing():
        return _activate(config, registry, model, version, control, repository)


def _activate(
    config: PSConfig,
    registry: VersionRegistry,
    model: str,
    version: int,
    control: ModelControl,
    repository: Path,
) -> Activation:
    previous = registry.live(model)
    info = registry.get(model, version)
    if info.state not in ("ready", "live"):
        raise ConfigError(f"model {model!r} version {version} is {info.state}, not ready")
    served = registry.served(model, live=version)
    names = [s.triton_name for s in served_models(config) if s.hps_model == model]
    for name in names:
        write_versions(repository / name, served)
    try:
        # new versions load and warm (the embedding and the CTR model side by side); Triton
        # then routes to them
        with ThreadPoolExecutor(len(names)) as pool:
            for done in [pool.submit(control.load, name) for name in names]:
                done.result()
    except BaseException:
        old = registry.served(model)
        for name in names:
            write_versions(repository / name, old)
        raise
    loaded = _unloaded(control, names, served)  # in-flight requests finish on the old ones
    registry.set_live(model, version, served)
    # not what Triton was just told to serve, even if a version imported meanwhile (which
    # changes what is kept) leaves it beyond the kept ones
    retired = [v for v in registry.beyond_kept(model) if v not in loaded and v not in served]
    left, problem = _retire(config, model, sorted({*retired, *registry.rows_left(model)}))
    return Activation(model, version, previous, served, retired, left, problem)


def _retire(config: PSConfig, model: str, versions: list[int]) -> tuple[list[int], str | None]:
    """Retire ``versions`` (the switch is done: a failure is logged, not raised); those
    whose rows are left, and why the first was."""
    left: list[int] = []
    problem: str | None = None
    for v in versions:
        try:
            retire_held(config, model, v)
        except Exception as exc:  # noqa: BLE001 - reported; the version is live regardless
            log.error("model %s: %s", model, exc)
            left.append(v)
            problem = problem or str(exc)
    return left, problem


def _unloaded(control: ModelControl, names: list[str], served: list[int]) -> set[int]:
    """Wait (at most :data:`UNLOAD_TIMEOUT_S`) until Triton has unloaded every version of
    ``names`` not in ``served``; the versions still loaded then (not to be retired)."""
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    while True:
        busy = {
            v
            for name in names
            for v, state in control.version_states(name).items()
            if v not in served and state in ("READY", "UNLOADING", "LOADING")
        }
        if not busy or time.monotonic() > deadline:
            if busy:
                log.warning("Triton still holds versions %s after %.0fs", sorted(busy),
                            UNLOAD_TIMEOUT_S)  # fmt: skip
            return busy
        time.sleep(0.05)
