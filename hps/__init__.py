"""HPS: a hierarchical inference parameter server for recommendation-model embeddings.

``import hps`` needs no GPU, Triton, Redis or Kafka; those are imported when configured.
"""

from hps.build import build_session
from hps.config import PSConfig, load_config, parse_config
from hps.errors import HPSError
from hps.lookup import LookupSession
from hps.types import TableSpec

__all__ = [
    "HPSError",
    "LookupSession",
    "PSConfig",
    "TableSpec",
    "build_session",
    "load_config",
    "parse_config",
]
__version__ = "0.1.0"
