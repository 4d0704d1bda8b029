"""build_session: the one place where a ps.json becomes a ready LookupSession."""

from __future__ import annotations

import logging
from typing import Any

from hps.config import PSConfig
from hps.lookup import L1Cache, LookupSession
from hps.storage import EmbeddingStore, open_store

log = logging.getLogger(__name__)


def build_session(
    config: PSConfig,
    *,
    persistent_mode: str | None = None,
    with_cache: bool = True,
    volatile: EmbeddingStore | None = None,
    persistent: EmbeddingStore | None = None,
    device_id: int | None = None,
) -> LookupSession:
    """Open L2 and L3 as configured (or take ready ones), build the L1 caches, wire them.

    ``persistent_mode`` ("read_write", "read_only", "secondary") overrides how L3 is opened,
    e.g. by the extra processes of a multi-instance deployment. ``with_cache=False`` builds
    no L1 (the consumer and the import commands need none). ``device_id`` places the L1
    caches on that GPU (default: each model's first ``deployed_device_list`` entry).
    """
    if volatile is None:
        volatile = open_store(config.volatile_db)
    if persistent is None:
        kw: dict[str, Any] = {"mode": persistent_mode} if persistent_mode else {}
        persistent = open_store(config.persistent_db, **kw)
    session = LookupSession(
        config.models,
        volatile,
        persistent,
        cache_missed_embeddings=config.volatile_db.cache_missed_embeddings,
    )
    if with_cache and any(m.gpucache for m in config.models):
        session.caches.update(_build_caches(config, session, device_id))
    if config.fuse_embedding_table:
        from hps.fused import FusedLookup

        session.fused = FusedLookup(session)
    return session


def _build_caches(
    config: PSConfig, session: LookupSession, device_id: int | None
) -> dict[str, L1Cache]:
    from hps.cache import build_cache, cache_capacity
    from hps.io.sparse_model import table_rows

    caches: dict[str, L1Cache] = {}
    for model in config.models:
        if not model.gpucache:
            continue
        for i, spec in enumerate(model.tables):
            rows = table_rows(model, i, session.persistent)
            device = model.deployed_device_list[0] if device_id is None else device_id
            capacity = cache_capacity(model, rows)
            caches[spec.name] = build_cache(spec, model.hps_cache, capacity, device_id=device)
    if caches:
        from hps.cache.kernels import warm_up

        seconds = warm_up()  # numba: compile or load the cached kernel now, not on a request
        log.info("L1 kernels ready in %.2fs", seconds)
    return caches
