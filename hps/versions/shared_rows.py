"""A version's rows in a Redis L2 that other nodes share: kept while another node holds it.

Every node with a Redis L2 publishes its version record there (its control plane:
:class:`hps.updates.shared_record.RecordPublisher`). When this node drops a version's rows
(a retire, an activation's retires, a purge, a died add, a failed import), the rows in that
L2 are the other nodes' too: dropping them while another node still imports, serves or keeps
that version for rollback would send that node's lookups of it to its L3 until it drops the
version as well. So the shared L2's tables of a version are dropped only when no other node's
record, published in the last :data:`hps.versions.node_record.STALE_S`, holds it
(:func:`holding`); otherwise they are kept and the version recorded ``shared_rows_left``, and
:func:`release` (run by the control plane at each publish of its record) drops them once no
node holds it: the last node to let go of a version drops its shared rows.
"""

from __future__ import annotations

import logging
import time

from hps.config import ModelConfig, PSConfig
from hps.tiers import Tiers
from hps.tiers.node_records import NodeRecords
from hps.tiers.rows import RowStore
from hps.topology import topology
from hps.versions.node_record import HOLDING, holders, node_name
from hps.versions.registry import VersionRegistry, VersionState

log = logging.getLogger(__name__)


def holding(
    config: PSConfig, entries: list[ModelConfig], states: frozenset[VersionState] = HOLDING
) -> dict[tuple[str, int], list[str]]:
    """``(model, version)`` of the ``entries`` (model entries at their version) that another
    node holds in a shared Redis L2 (in one of ``states``), with those nodes; empty without a
    Redis L2. Redis unreachable: :class:`hps.errors.BackendError` (the drop would fail
    there too)."""
    if topology(config).l2 != "server" or not entries:
        return {}
    records = NodeRecords(config.volatile_db)
    try:
        raw = records.all()
    finally:
        records.close()
    me, now = node_name(VersionRegistry(config)), time.time()
    out = {}
    for entry in entries:
        nodes = holders(raw, entry.model, entry.version, besides=me, now=now, states=states)
        if nodes:
            out[(entry.model, entry.version)] = nodes
    return out


def release(config: PSConfig) -> list[tuple[str, int]]:
    """Drop the shared L2's rows of the versions recorded ``shared_rows_left`` that no other
    node holds any more, and record them dropped; the ``(model, version)`` released."""
    registry = VersionRegistry(config)
    left = registry.shared_rows_left()
    if not left:
        return []
    entries = [v.model_config() for _, v in left]
    held = holding(config, entries)
    free = [(e, v) for e, (_, v) in zip(entries, left, strict=True)
            if (e.model, e.version) not in held]  # fmt: skip
    if not free:
        return []
    l2 = Tiers(RowStore.open(config.volatile_db, "L2"), None)
    try:
        for entry, _ in free:
            for spec in entry.tables:
                l2.drop_table(spec, reopen=False)
    finally:
        l2.close()
    for entry, info in free:
        registry.set_state(entry.model, entry.version, "retired", rows_left=info.rows_left)
        log.info("model %s version %d: no other node holds it any more; its rows in the "
                 "shared L2 dropped", entry.model, entry.version)  # fmt: skip
    return [(e.model, e.version) for e, _ in free]
