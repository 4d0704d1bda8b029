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
   finished), the version is recorded live, and the ready versions no longer kept
   (:meth:`hps.versions.VersionRegistry.kept`: never the one live before, nor one above) are
   retired (their rows dropped in every tier), with any retired before whose rows were left.

The switch is done once the version is recorded live: a drop of old rows that fails then
(L3 held by ``hps consume``) does not fail the activation. It is logged, the versions are
reported in :attr:`Activation.rows_left` (recorded retired with their rows left: the next
activation, a retire of them or a purge drops them), and the activation returns.

A failed load leaves Triton serving what it served and the record unchanged: the folders'
policy is put back, and a model whose load succeeded beside the one that failed (the
embedding model beside ``<model>_ctr``) is loaded again with it; an undo that fails too is
an error saying which model serves which versions. A crash between 2 and 3 leaves each
request answered by one whole version, and a restarted ``hps serve`` serves the version
recorded live.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hps.config import PSConfig
from hps.errors import BackendError, ConfigError
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
    retired: list[int]  # versions retired now (no longer kept)
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
    _load(registry, model, version, names, control, repository, served)
    loaded = _unloaded(control, names, served)  # in-flight requests finish on the old ones
    registry.set_live(model, version, served)
    # not what Triton was just told to serve, even if a version imported meanwhile (which
    # changes what is kept) leaves it beyond the kept ones
    retired = [v for v in registry.beyond_kept(model) if v not in loaded and v not in served]
    left, problem = _retire(
        config, model, sorted({*retired, *registry.rows_left(model)}), repository
    )
    return Activation(model, version, previous, served, retired, left, problem)


def _load(
    registry: VersionRegistry,
    model: str,
    version: int,
    names: list[str],
    control: ModelControl,
    repository: Path,
    served: list[int],
) -> None:
    """Have Triton load ``names`` (the embedding and the CTR model side by side), whose
    folders' policy names ``served``: the new versions load and warm, then Triton routes to
    them. Should one load fail, every folder gets its old policy back and each model whose
    load succeeded is loaded again with it (Triton unloads the new versions), so Triton
    serves what it served; the load's error is raised. Should that undo fail too, the error
    says which model serves which versions now (each model left on the new ones keeps
    their policy in its folder, so that no retire drops a version it serves)."""
    with ThreadPoolExecutor(len(names)) as pool:
        loads = {name: pool.submit(control.load, name) for name in names}
        try:
            for done in loads.values():
                done.result()
            return
        except BaseException as exc:
            error = exc
    # the pool has waited for every load: each one's outcome is known
    ok = [name for name, done in loads.items() if done.exception() is None]
    old = registry.served(model)
    for name in names:
        write_versions(repository / name, old)
    stuck: dict[str, str] = {}
    for name in ok:
        try:
            control.load(name)
        except Exception as exc:  # noqa: BLE001 - reported below, with the load's error
            write_versions(repository / name, served)  # what Triton still serves
            stuck[name] = str(exc)
    if not stuck:
        raise error
    live = registry.live(model)
    now = "; ".join(
        f"{name} serves versions {served} (unversioned requests: version {version}), "
        f"its undo failed: {stuck[name]}"
        if name in stuck
        else f"{name} serves versions {old}"
        for name in names
    )
    raise BackendError(
        f"model {model!r}: activating version {version} failed ({error}) and undoing it "
        f"failed too: {now}; the record keeps version {live} live. Activate version {live} "
        f"again to put Triton back on it, or version {version} to finish the activation"
    ) from error


def _retire(
    config: PSConfig, model: str, versions: list[int], repository: Path
) -> tuple[list[int], str | None]:
    """Retire ``versions`` (the switch is done: a failure is logged, not raised); those
    whose rows are left, and why the first was."""
    left: list[int] = []
    problem: str | None = None
    for v in versions:
        try:
            retire_held(config, model, v, repository)
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
