"""The ps.json of HugeCTR's HPS, as frozen typed models.

A ps.json written for HugeCTR is accepted as it is (defaults are HugeCTR's, v24.06). Keys
that start with ``hps_`` are our extensions. Keys of older HugeCTR releases are accepted
with a warning naming their replacement; any other unknown key is a :class:`ConfigError`
naming the key and the file. Keys that only tuned HugeCTR's C++ internals are accepted and
ignored (docs/config.md lists them).

One module per section; import the names from here:

- :mod:`hps.config.ps`: the whole document (:class:`PSConfig`), :func:`load_config`,
  :func:`parse_config`;
- :mod:`hps.config.model`: ``models[]`` (:class:`ModelConfig`) and its ``hps_cache``
  (:class:`CacheConfig`);
- :mod:`hps.config.databases`: ``volatile_db`` and ``persistent_db``;
- :mod:`hps.config.update_source`: ``update_source``;
- :mod:`hps.config.admin`: ``hps_admin``, the control plane's settings;
- :mod:`hps.config.common`: what they share (the frozen base, names, secrets from the
  environment, deprecated keys).
"""

from hps.config.admin import AdminConfig
from hps.config.common import NAME_RE, NO_LIMIT
from hps.config.databases import OverflowPolicy, PersistentDBConfig, VolatileDBConfig
from hps.config.model import CacheConfig, ModelConfig
from hps.config.ps import PSConfig, load_config, parse_config
from hps.config.update_source import UpdateSourceConfig

__all__ = [
    "AdminConfig",
    "NAME_RE",
    "NO_LIMIT",
    "CacheConfig",
    "ModelConfig",
    "OverflowPolicy",
    "PSConfig",
    "PersistentDBConfig",
    "UpdateSourceConfig",
    "VolatileDBConfig",
    "load_config",
    "parse_config",
]
