"""L2 (volatile) and L3 (persistent) storage backends behind one interface.

Backends are chosen by the ``type`` name in ps.json and imported only when configured.
"""

from __future__ import annotations

import importlib

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.errors import ConfigError
from hps.storage.base import AccessMode, EmbeddingStore, Placement

__all__ = ["BACKENDS", "AccessMode", "EmbeddingStore", "Placement", "open_store", "store_class"]

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


def store_class(type_name: str) -> type[EmbeddingStore]:
    """The backend class registered for a ps.json ``type`` (imported now)."""
    target = BACKENDS.get(type_name)
    if target is None:
        raise ConfigError(f"unknown storage type {type_name!r}; known: {sorted(BACKENDS)}")
    module, cls = target.split(":")
    try:
        found: type[EmbeddingStore] = getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise ConfigError(
            f"storage type {type_name!r} needs {exc.name}: pip install 'hps[redis]'"
        ) from None
    return found


def open_store(
    cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
) -> EmbeddingStore | None:
    """Open the backend ``cfg.type`` names (``None`` for ``disabled``)."""
    if cfg.type == "disabled":
        return None
    return store_class(cfg.type).from_config(cfg, mode)
