"""L1: the embedding cache (CuPy on a GPU, NumPy otherwise), its policies, warm-up and refresh.

``build_cache`` makes one :class:`EmbeddingCache` for one table from its model's ``hps_cache``
settings; ``cache_capacity`` sizes it (``gpucacheper`` x table rows, or an explicit size).
"""

from __future__ import annotations

import math

from hps.cache.embedding_cache import EmbeddingCache, cache_nbytes
from hps.cache.policies import POLICIES
from hps.cache.xp import available_xps, select_xp
from hps.config import CacheConfig, ModelConfig
from hps.config.model import MAX_CACHE_ROWS
from hps.errors import ConfigError
from hps.types import ArrayModule, TableSpec

__all__ = [
    "MIN_CAPACITY",
    "POLICIES",
    "EmbeddingCache",
    "available_xps",
    "build_cache",
    "cache_capacity",
    "cache_nbytes",
    "select_xp",
]

# Rows of a cache whose table size is unknown or tiny (an empty L3 filled later by Kafka).
MIN_CAPACITY = 1024


def cache_capacity(model_cfg: ModelConfig, table_rows: int) -> int:
    """Rows of L1 for a table of ``table_rows`` rows; 0 when the model has ``gpucache: false``.

    ``hps_cache.capacity`` when set, else ``ceil(gpucacheper x table_rows)``, at least
    :data:`MIN_CAPACITY` and at most :data:`hps.config.model.MAX_CACHE_ROWS`.
    """
    if not model_cfg.gpucache:
        return 0
    if model_cfg.hps_cache.capacity is not None:
        return model_cfg.hps_cache.capacity
    rows = math.ceil(model_cfg.gpucacheper * max(0, table_rows))
    return min(MAX_CACHE_ROWS, max(MIN_CAPACITY, rows))


def build_cache(
    spec: TableSpec,
    cfg: CacheConfig,
    capacity: int,
    device_id: int | None = None,
    *,
    xp: ArrayModule | None = None,
) -> EmbeddingCache:
    """One table's cache on ``xp``, storing rows in the table's format (``spec.fmt``).

    ``xp``: the array module its model's caches run on (``hps.build`` resolves
    ``hps_cache.device`` once per model, ``auto`` by calibration: :mod:`hps.cache.auto`);
    default: what ``cfg.device`` picks alone (``auto``: CuPy on a usable GPU).
    ``device_id`` chooses the GPU (one of ``deployed_device_list``; default: the current one).
    """
    if capacity < 1:
        raise ConfigError(f"{spec.name}: L1 cache capacity must be at least 1 row, got {capacity}")
    return EmbeddingCache(
        spec.dim,
        capacity,
        xp=select_xp(cfg.device) if xp is None else xp,
        policy=cfg.policy,
        static_fraction=cfg.static_fraction,
        frequency_window=cfg.frequency_window,
        name=spec.name,
        device_id=device_id,
        fmt=spec.fmt,
    )
