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
from hps.errors import HPSError
from hps.tiers import Tiers
from hps.tiers.node_records import NodeRecords
from hps.tiers.rows import RowStore
from hps.topology import topology
from hps.types import TableSpec
from hps.versions.node_record import HOLDING, IMPORTED, fingerprints, holders, node_name
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
    raw, me, now = _records(config), node_name(VersionRegistry(config)), time.time()
    out = {}
    for entry in entries:
        nodes = holders(raw, entry.model, entry.version, besides=me, now=now, states=states)
        if nodes:
            out[(entry.model, entry.version)] = nodes
    return out


def imported_elsewhere(config: PSConfig, entry: ModelConfig) -> dict[str, str | None]:
    """The other nodes whose records hold ``entry`` (a model entry at its version) imported
    whole (ready or live) in a shared Redis L2, each with the fingerprint of the files it
    imported it from (None: unknown, an older release's record); empty without a Redis L2.
    Redis unreachable: :class:`hps.errors.BackendError`."""
    if topology(config).l2 != "server":
        return {}
    raw, me, now = _records(config), node_name(VersionRegistry(config)), time.time()
    return fingerprints(raw, entry.model, entry.version, besides=me, now=now, states=IMPORTED)


def _records(config: PSConfig) -> dict[bytes, bytes]:
    records = NodeRecords(config.volatile_db)
    try:
        return records.all()
    finally:
        records.close()


def not_as_here(tiers: Tiers, spec: TableSpec) -> bool:
    """Whether the shared L2 holds ``spec``'s table in another format or dimension: rows
    another node imported under this version number (this node's import of it was refused),
    not this node's to drop."""
    stored = tiers.volatile.stored_format(spec) if tiers.volatile is not None else None
    if stored is None or (stored[0] is spec.fmt and stored[1] == spec.dim):
        return False
    log.warning("%s: the shared L2 holds it as %s rows of dimension %d, another node's "
                "version: kept", spec.name, stored[0].name, stored[1])  # fmt: skip
    return True


def release(config: PSConfig) -> list[tuple[str, int]]:
    """Drop the shared L2's rows of the versions recorded ``shared_rows_left`` that no other
    node holds any more (their tables another node imported in another format left as they
    are), and record them dropped, its files on this node deleted with them
    (:func:`hps.versions.rollout.drop_version_files`); the ``(model, version)`` released. A
    version that cannot be (its recorded entry unreadable, a drop refused) is logged once
    and left for the next call; the others go on. Redis unreachable:
    :class:`hps.errors.BackendError`."""
    registry = VersionRegistry(config)
    left = registry.shared_rows_left()
    if not left:
        return []
    raw, me, now = _records(config), node_name(registry), time.time()
    released: list[tuple[str, int]] = []
    l2: Tiers | None = None
    try:
        for model, info in left:
            if holders(raw, model, info.version, besides=me, now=now):
                continue
            try:
                l2 = l2 or Tiers(RowStore.open(config.volatile_db, "L2"), None)
                for spec in info.model_config().tables:
                    if not not_as_here(l2, spec):
                        l2.drop_table(spec, reopen=False)
                registry.set_state(model, info.version, "retired", rows_left=info.rows_left)
            except (HPSError, ValueError) as exc:  # ValueError: an entry pydantic refuses
                if (model, info.version) not in _FAILED:
                    log.warning("model %s version %d: its rows in the shared L2 not dropped "
                                "yet: %s", model, info.version, exc)  # fmt: skip
                    _FAILED.add((model, info.version))
                continue
            _FAILED.discard((model, info.version))
            if not info.rows_left:  # its last rows gone: its files on this node go too
                from hps.versions.rollout import drop_files_logged

                drop_files_logged(config, model, info.version)
            released.append((model, info.version))
            log.info("model %s version %d: no other node holds it any more; its rows in the "
                     "shared L2 dropped", model, info.version)  # fmt: skip
    finally:
        if l2 is not None:
            l2.close()
    return released


_FAILED: set[tuple[str, int]] = set()  # versions whose release failed, warned of
