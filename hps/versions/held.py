"""Version 1's ps.json entry against the rows the node holds, before it is first recorded.

A model with no record is version 1, described by its ps.json entry as it is now
(:class:`hps.versions.registry.VersionRegistry`). The first change of the record (the
model's first versioned import, usually) records version 1 from that entry for good: from
then on its instances, ``hps consume`` and a rollback open version 1's tables as recorded.
An entry edited since version 1 was imported (``hps_row_dtype`` or
``embedding_vecsize_per_table`` changed for the retrain) would record version 1 in a row
format or dimension its rows are not in, and every one of them would refuse them; one
with a table added (a retrain with one more) would record version 1 with a table it never
had, which a rollback to it would serve as default values. :func:`check_held` refuses
that first record instead, before anything is written.

Only the tiers that keep a record of a table's format another process can read without
writing are asked: L3 (its per-table format record) and a Redis L2 (``hps_tm{<table>}``).
An in-process L2 holds nothing across processes, and a shared-memory L2 is filled from L3
or from the version's files by the serving processes that attach it. Only L3 tells which
tables version 1 has: a Redis L2 may hold a table's rows or not (``initial_cache_rate``,
eviction), and a model none of whose tables L3 holds was never imported, so its entry has
nothing to disagree with. An L3 folder without a database in it (no ``CURRENT``: an empty
volume before the first import) holds nothing.
"""

from __future__ import annotations

from contextlib import ExitStack

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError
from hps.loading.imports import holds_a_database
from hps.tiers import RowStore
from hps.topology import topology
from hps.types import TableSpec


def check_held(config: PSConfig, entry: ModelConfig) -> None:
    """ConfigError unless every tier that records its tables' formats holds each table of
    ``entry`` (its model's version 1, as the ps.json describes it) in the configured row
    format and dimension, or not at all (a table never imported), and L3 holds every one of
    them or none (an entry with a table added, or a model never imported). Reads only."""
    wrong = _mismatches(config, entry.at_version(1).tables)
    if wrong:
        raise ConfigError(
            f"model {entry.model!r}: its version 1 would be recorded from the ps.json entry as "
            f"it is now, which does not describe the rows the node holds: {'; '.join(wrong)}. "
            "Version 1 is recorded from the ps.json entry at the model's first versioned "
            "import, and served, updated and rolled back to as recorded: restore the entry "
            "version 1 was imported from (its embedding_table_names, sparse_files, dense_file, "
            "hps_row_dtype and embedding_vecsize_per_table). A retrain edits no part of the "
            "entry: give the new version's files, row formats and dimensions with the import "
            "instead (hps import --version N --sparse-files ... --dense-file ... --row-dtype "
            "... --dims ..., or the control plane's sparse_files, dense_file, row_dtype and "
            "dims); a retrain with other tables is another model. Nothing was recorded or "
            "written"
        )


def _mismatches(config: PSConfig, specs: list[TableSpec]) -> list[str]:
    """One line per table a tier holds in another format or dimension than its spec's, and
    one per table L3 does not hold where it holds another of ``specs`` (version 1's)."""
    with ExitStack() as stack:
        wrong = []
        for store in _recording_tiers(config, stack):
            missing = []
            for spec in specs:
                held = store.stored_format(spec)
                if held is None:
                    missing.append(spec)
                elif held[0] is not spec.fmt or held[1] != spec.dim:
                    wrong.append(
                        f"table {spec.table} is held in {store.level} ({store.backend}) as "
                        f"{held[0].name} rows of dimension {held[1]} but configured as "
                        f"{spec.row_dtype} rows of dimension {spec.dim}"
                    )
            if store.level == "L3" and len(missing) < len(specs):
                wrong.extend(
                    f"table {spec.table} is not held by L3 ({store.backend}), which holds the "
                    "model's other tables: version 1 has no such table"
                    for spec in missing
                )
        return wrong


def _recording_tiers(config: PSConfig, stack: ExitStack) -> list[RowStore]:
    """L3 opened read-only where it holds a database, and a Redis L2; each closed with
    ``stack``."""
    stores = []
    l3 = config.persistent_db
    if l3.type != "disabled" and holds_a_database(l3.path):
        stores.append(_closed_with(stack, RowStore.open(l3, "L3", "read_only")))
    if topology(config).l2 == "server":
        stores.append(_closed_with(stack, RowStore.open(config.volatile_db, "L2")))
    return stores


def _closed_with(stack: ExitStack, store: RowStore | None) -> RowStore:
    assert store is not None  # an enabled tier
    stack.callback(store.close)
    return store
