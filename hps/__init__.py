"""HPS: a hierarchical inference parameter server for recommendation-model embeddings.

``import hps`` needs no GPU, Triton, Redis or Kafka; those are imported when configured.
"""

from hps.build import build_session
from hps.config import PSConfig, load_config, parse_config
from hps.errors import HPSError
from hps.lookup import LookupSession
from hps.tiers import Tiers
from hps.topology import Topology, topology
from hps.types import TableSpec

__all__ = [
    "HPSError",
    "LookupSession",
    "PSConfig",
    "TableSpec",
    "Tiers",
    "Topology",
    "build_session",
    "load_config",
    "parse_config",
    "topology",
]
__version__ = "0.1.0"
