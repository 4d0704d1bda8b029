"""L2 (volatile) and L3 (persistent) storage backends behind one interface.

Backends are chosen by the ``type`` name in ps.json and imported only when configured.
"""

from __future__ import annotations

import importlib
from typing import Any

from hps.errors import ConfigError
from hps.storage.base import EmbeddingStore

__all__ = ["BACKENDS", "EmbeddingStore", "open_store"]

# config name -> "module:Class"; aliases of HugeCTR's names map to the same class.
BACKENDS: dict[str, str] = {
    "hash_map": "hps.storage.hash_map:HashMapStore",
    "parallel_hash_map": "hps.storage.hash_map:HashMapStore",
    "multi_process_hash_map": "hps.storage.multi_process_hash_map:SharedHashMapStore",
    "rocks_db": "hps.storage.rocks_db:RocksDBStore",
    "rocksdb": "hps.storage.rocks_db:RocksDBStore",
    "redis_cluster": "hps.storage.redis_cluster:RedisStore",
    "redis": "hps.storage.redis_cluster:RedisStore",
}


def open_store(cfg: Any, **options: Any) -> EmbeddingStore | None:
    """Build the backend ``cfg.type`` names (``None`` for ``disabled``).

    ``cfg`` is a VolatileDBConfig or PersistentDBConfig; ``options`` go to the backend's
    ``from_config`` (e.g. ``mode="secondary"`` for RocksDB in a reader process).
    """
    if cfg.type == "disabled":
        return None
    target = BACKENDS.get(cfg.type)
    if target is None:
        raise ConfigError(f"unknown storage type {cfg.type!r}; known: {sorted(BACKENDS)}")
    module, cls = target.split(":")
    store: EmbeddingStore = getattr(importlib.import_module(module), cls).from_config(
        cfg, **options
    )
    return store
