"""Bring L3 (and a shared L2) up to date with the sparse files a ps.json names.

:func:`import_tables` is what ``hps import`` and every serving process's start-up and reload
run (HugeCTR imported at start-up too). Under the node's import lock (one process works,
the others find the work done), a table is imported when its files are not the ones
recorded as imported (paths, sizes, modification times, in a record beside L3) and L3 does
not already hold them (a sample of rows with exactly the files' vectors: a retrained table,
same keys with new vectors, is imported again). Every file of every table is validated
before anything is written, and a table is recorded only once it is completely loaded.

A table's record includes its row format (``hps_row_dtype``), so a format change is seen at
the next import or start-up: a tier that holds the table in another format or dimension
refuses it with a ConfigError naming ``hps import --force``; with ``force`` the table is
dropped in every tier and imported again in its new format.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hps.config import PSConfig
from hps.loading.loader import Loader, TableSource, l2_action, l3_matches, sparse_source
from hps.tiers import Tiers
from hps.topology import Topology

log = logging.getLogger(__name__)


@contextmanager
def import_lock(state: Path) -> Iterator[None]:
    """The node's import lock, beside ``state`` (L3's folder, or the ps.json's stem)."""
    lock = state.with_name(state.name + ".hps-import.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ImportRecord:
    """Which version of each table's files was imported completely (a JSON file)."""

    def __init__(self, state: Path) -> None:
        self.path = state.with_name(state.name + ".hps-import.json")
        self.tables: dict[str, list[str | int]] = (
            json.loads(self.path.read_text()) if self.path.exists() else {}
        )

    def current(self, source: TableSource) -> bool:
        return self.tables.get(source.spec.name) == source.stamp()

    def mark(self, source: TableSource) -> None:
        self.tables[source.spec.name] = source.stamp()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.tables, indent=1))
        tmp.replace(self.path)


def sparse_sources(config: PSConfig, models: list[str] | None = None) -> list[TableSource]:
    """The ``sparse_files`` of the models (all by default), their sizes checked."""
    return [
        sparse_source(spec, path)
        for m in config.models
        if models is None or m.model in models
        for spec, path in zip(m.tables, m.sparse_files, strict=False)
    ]


def import_tables(
    config: PSConfig,
    topo: Topology,
    sources: list[TableSource] | None = None,
    *,
    force: bool = False,
    progress: bool = False,
) -> dict[str, int]:
    """Import what is new or changed (everything with ``force``); rows imported per table.

    A missing L3 is created (empty if there is nothing to import), so readers can open it.
    A table stored in another format or dimension is refused (ConfigError), unless
    ``force``: then it is dropped in every tier and imported in its configured format.
    """
    sources = sparse_sources(config) if sources is None else sources
    state = topo.state_dir
    if state is None:
        return {}  # no L3 and no shared L2: every serving process loads its own L2
    with import_lock(state):
        record = ImportRecord(state)
        fresh = topo.l3 and not Path(config.persistent_db.path).exists()
        todo = [s for s in sources if force or fresh or not record.current(s)]
        if todo and topo.l3 and not fresh and not force:
            reader = Tiers.open(config, l3_mode="read_only", l2=False)
            reader.open_tables(s.spec for s in todo)
            try:
                held = [s for s in todo if l3_matches(reader, s)]
            finally:
                reader.close()
            for s in held:
                log.info("%s: L3 already holds %s", s.spec.name, s.files[0].parent)
                record.mark(s)
            todo = [s for s in todo if s not in held]
        if not todo and not fresh:
            return {}  # L3 may have a writer of its own (hps consume): open it only to import
        for s in todo:
            duplicates = s.validate()
            if duplicates:
                log.warning(
                    "%s: %d duplicate keys in %s; the last occurrence of each wins",
                    s.spec.name,
                    duplicates,
                    s.files[0],
                )
        action = l2_action(topo, own=False)
        writer = Tiers.open(config, l3_mode="read_write", l2=action != "skip")
        try:
            writer.open_tables((s.spec for s in todo), replace=force)
        except BaseException:
            writer.close()
            raise
        loader = Loader(writer, action, config.volatile_db.initial_cache_rate, progress=progress)
        imported: dict[str, int] = {}
        try:
            for s in todo:
                log.info("%s: importing %s", s.spec.name, s.files[0].parent)
                imported[s.spec.name] = loader.load(s)
                record.mark(s)
        finally:
            writer.close()
    return imported
