"""Version 1's ps.json entry against the rows the node holds, before it is first recorded.

A model with no record is version 1, described by its ps.json entry as it is now
(:class:`hps.versions.registry.VersionRegistry`). The first change of the record (the
model's first versioned import, usually) records version 1 from that entry for good: from
then on its instances, ``hps consume`` and a rollback open version 1's tables as recorded.
An entry edited since version 1 was imported (``hps_row_dtype`` or
``embedding_vecsize_per_table`` changed for the retrain) would record version 1 in a row
format or dimension its rows are not in, and every one of them would refuse them.
:func:`check_held` refuses that first record instead, before anything is written.

Only the tiers that keep a record of a table's format another process can read without
writing are asked: L3 (its per-table format record) and a Redis L2 (``hps_tm{<table>}``).
An in-process L2 holds nothing across processes, and a shared-memory L2 is filled from L3
or from the version's files by the serving processes that attach it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError
from hps.tiers import RowStore
from hps.topology import topology
from hps.types import TableSpec


def check_held(config: PSConfig, entry: ModelConfig) -> None:
    """ConfigError unless every tier that records its tables' formats holds each table of
    ``entry`` (its model's version 1, as the ps.json describes it) in the configured row
    format and dimension, or not at all (a table never imported). Reads only."""
    wrong = _mismatches(config, entry.at_version(1).tables)
    if wrong:
        raise ConfigError(
            f"model {entry.model!r}: its version 1 would be recorded from the ps.json entry as "
            f"it is now, which does not describe the rows the node holds: {'; '.join(wrong)}. "
            "Version 1 is recorded from the ps.json entry at the model's first versioned "
            "import, and served, updated and rolled back to as recorded: restore the entry "
            "version 1 was imported from (its hps_row_dtype and embedding_vecsize_per_table), "
            "and give the new version's row formats and dimensions with the import instead "
            "(hps import --version N --row-dtype ... --dims ..., or the control plane's "
            "row_dtype and dims). Nothing was recorded or written"
        )


def _mismatches(config: PSConfig, specs: list[TableSpec]) -> list[str]:
    """One line per table a tier holds in another format or dimension than its spec's."""
    with ExitStack() as stack:
        wrong = []
        for store in _recording_tiers(config, stack):
            for spec in specs:
                held = store.stored_format(spec)
                if held is not None and (held[0] is not spec.fmt or held[1] != spec.dim):
                    wrong.append(
                        f"table {spec.table} is held in {store.level} ({store.backend}) as "
                        f"{held[0].name} rows of dimension {held[1]} but configured as "
                        f"{spec.row_dtype} rows of dimension {spec.dim}"
                    )
        return wrong


def _recording_tiers(config: PSConfig, stack: ExitStack) -> list[RowStore]:
    """L3 opened read-only where it exists, and a Redis L2; each closed with ``stack``."""
    stores = []
    l3 = config.persistent_db
    if l3.type != "disabled" and Path(l3.path).exists():
        stores.append(_closed_with(stack, RowStore.open(l3, "L3", "read_only")))
    if topology(config).l2 == "server":
        stores.append(_closed_with(stack, RowStore.open(config.volatile_db, "L2")))
    return stores


def _closed_with(stack: ExitStack, store: RowStore | None) -> RowStore:
    assert store is not None  # an enabled tier
    stack.callback(store.close)
    return store
