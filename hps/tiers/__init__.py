"""Below L1: the L2 and L3 of a process, and the one row-store interface to each.

- :class:`Tiers` (:mod:`hps.tiers.tiers`): L2 + L3, the L2-to-L3 fallback, write order,
  backfill, versions; what the session, the applier, the loader and the control plane hold.
  Rows here are stored rows (a table's :mod:`hps.rowformat` form); :func:`encode_rows` is
  how an edge (import, update, control-plane write) turns float32 into them.
- :class:`RowStore` (:mod:`hps.tiers.rows`): one tier's rows, typed, over a backend; where
  a rule about stored rows (a version, later a row format or a model version) is written.
- :mod:`hps.tiers.versions`: per-key update versions and key-bucket watermarks
  (:mod:`hps.tiers.watermarks`) beside the data, in side tables
  (:mod:`hps.tiers.side_tables`): what the Kafka applier writes through.

Nothing outside this package and :mod:`hps.storage` imports a store backend, the store
interface or the factory that opens them (tests/unit/test_layers.py checks it).
"""

from hps.storage import AccessMode, Placement
from hps.tiers.rows import Level, RowStore, bytes_per_row, placement_of, table_bytes
from hps.tiers.tiers import (
    IN_L2,
    IN_L3,
    NOWHERE,
    Fetched,
    Tiers,
    check_encodable,
    encode_rows,
)
from hps.tiers.versions import VersionedRows

__all__ = [
    "IN_L2",
    "IN_L3",
    "NOWHERE",
    "AccessMode",
    "Fetched",
    "Level",
    "Placement",
    "RowStore",
    "Tiers",
    "VersionedRows",
    "bytes_per_row",
    "table_bytes",
    "check_encodable",
    "encode_rows",
    "placement_of",
]
