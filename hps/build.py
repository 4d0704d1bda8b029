"""build_session: the one place where a ps.json becomes a ready LookupSession."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hps.config import PSConfig
from hps.lookup import LookupSession
from hps.pipeline import L1Cache
from hps.tiers import AccessMode, Tiers

if TYPE_CHECKING:
    from hps.cache.auto import L1Device

log = logging.getLogger(__name__)


def build_session(
    config: PSConfig,
    *,
    tiers: Tiers | None = None,
    l3_mode: AccessMode = "read_write",
    with_cache: bool = True,
    device_id: int | None = None,
    rows_on_device: bool = False,
) -> LookupSession:
    """Open the tiers (or take ready ones), build the L1 caches, then the session with both.

    ``l3_mode`` is how L3 is opened when ``tiers`` is not given (a serving process takes it
    from :func:`hps.topology.topology`). ``with_cache=False`` builds no L1 (the consumer and
    the import commands need none). ``device_id`` places the L1 caches on that GPU (default:
    each model's first ``deployed_device_list`` entry). Each model's caches run where
    :func:`hps.cache.auto.choose_l1_device` says (``hps_cache.device: auto``: the faster of
    CuPy and NumPy for its configured request, timed here, with the rows left on the GPU
    where ``rows_on_device``: a CTR instance); the choice is logged, one line per model, and
    kept in ``session.l1_devices``.
    """
    tiers = tiers if tiers is not None else Tiers.open(config, l3_mode=l3_mode)
    tiers.open_tables(t for m in config.models for t in m.tables)
    caches: dict[str, L1Cache] = {}
    devices: dict[str, L1Device] = {}
    if with_cache and any(m.gpucache for m in config.models):
        caches, devices = _build_caches(config, tiers, device_id, rows_on_device)
    return LookupSession(
        config.models,
        tiers,
        caches=caches,
        cache_missed_embeddings=config.volatile_db.cache_missed_embeddings,
        l1_devices=devices,
    )


def _build_caches(
    config: PSConfig, tiers: Tiers, device_id: int | None, rows_on_device: bool
) -> tuple[dict[str, L1Cache], dict[str, L1Device]]:
    from hps.cache import build_cache, cache_capacity
    from hps.cache.auto import choose_l1_device
    from hps.io.sparse_model import table_rows

    caches: dict[str, L1Cache] = {}
    devices: dict[str, L1Device] = {}
    for model in config.models:
        if not model.gpucache:
            continue
        device = model.deployed_device_list[0] if device_id is None else device_id
        rows = [table_rows(model, i, tiers.persistent) for i in range(len(model.tables))]
        capacities = [cache_capacity(model, n) for n in rows]
        choice, xp = choose_l1_device(
            model, capacities=capacities, device_id=device, rows_on_device=rows_on_device
        )
        log.info("%s", choice.message())
        devices[model.model] = choice
        for spec, capacity in zip(model.tables, capacities, strict=True):
            caches[spec.name] = build_cache(
                spec, model.hps_cache, capacity, device_id=device, xp=xp
            )
    if caches:
        from hps.cache.kernels import warm_up

        seconds = warm_up()  # numba: compile or load the cached kernel now, not on a request
        log.info("L1 kernels ready in %.2fs", seconds)
    return caches, devices
