"""Bring L3 (and a shared L2) up to date with the sparse files a ps.json names.

:func:`import_tables` is what ``hps import`` and every serving process's start-up and reload
run (HugeCTR imported at start-up too). Under the node's import lock (one process works,
the others find the work done), a table is imported unless its rows are already imported,
which is decided on the files' whole content, never on a sample (:func:`_unchanged`): the
files recorded as imported (paths, sizes, modification times, in a record beside L3) are
taken as they are; files that are not (a retrain written over them, a copy) are read once
through for a digest of their content, and are unchanged only when it equals the digest
recorded at their import (a retrained table, same keys with new vectors, is imported
again); a table the record holds no digest for (recorded by an older release, or the
record lost) is unchanged only when L3 holds exactly its rows (:func:`l3_holds`: a read of
the files and of L3). A table whose validation needs more memory than is available is
refused before any table is validated, and before its files are read at all where every
table is imported (a new L3, ``force``): :meth:`TableSource.check_memory`. Every file of
every table is validated before anything is written, the tables to import are removed
from the record (durably) before the first write or drop of any of them, and a table is
recorded again only once it is completely loaded and its rows are durable (the record
itself is written durably, once per batch of tables: :data:`RECORD_EVERY_S`), so an
interrupted import leaves them to be imported again.
Cost: a changed table's files are read once more than its import reads them (the digest),
and where the record holds no digest, once more with every key fetched from L3.

An import opens each table's files once, before validating them, and validates, digests,
loads and stamps those: files replaced meanwhile are imported as they were opened (and
recorded so; the next import imports the new ones); files rewritten in place meanwhile
fail the import of the table (FormatError), which is then not recorded.

Nothing is locked or written when there is nothing to import (every table's record is
current), and an L3 that cannot be written (``persistent_db.read_only``, or a folder this
process may not write: a read-only volume) is only checked: every table's files must be
unchanged (the same decision; a ConfigError names the first that is not), and it is served
as it is. The node's lock and records live beside L3 (:func:`node_file`); where that folder
is read-only they live in the temporary directory instead, under a name derived from L3's
path.

A table's record includes its row format (``hps_row_dtype``), so a format change is seen at
the next import or start-up: a tier that holds the table in another format or dimension
refuses it with a ConfigError naming ``hps import --force``; with ``force`` the table is
dropped in every tier and imported again in its new format. ``force`` also drops a table
whose L3 column family is damaged (:func:`_drop_damaged`), so that the damaged files go.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from hps.config import PSConfig
from hps.errors import ConfigError, FormatError
from hps.io.durable import replace_durably
from hps.loading.loader import Loader, TableSource, l2_action, l3_holds, sparse_source
from hps.tiers import Tiers
from hps.topology import Topology, topology
from hps.types import TableSpec

log = logging.getLogger(__name__)


def node_file(state: Path, suffix: str, *, writable: bool = True) -> Path:
    """The node's file ``<state><suffix>`` beside ``state`` (L3's folder, or the ps.json's
    stem), or, where that folder cannot be written (a read-only volume) and ``writable``,
    ``hps-<hash of state's path><suffix>`` in the temporary directory (every process of
    the node that sees the same read-only folder picks the same one)."""
    beside = state.with_name(state.name + suffix)
    folder = beside.parent
    if not writable or os.access(folder if folder.exists() else folder.parent, os.W_OK):
        return beside
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"hps-{digest}{suffix}"


def repository_dir(config: PSConfig) -> Path | None:
    """Where ``hps serve`` writes the Triton model repository of a node that has a state
    folder (the control plane, the CLI and a retire's check of the written version policy
    find it there); None: a temporary one."""
    state = topology(config).state_dir
    return None if state is None else node_file(state, ".hps-repository")


def l3_read_only(config: PSConfig) -> bool:
    """Whether L3 is to be served as it is: ``persistent_db.read_only``, or an existing
    database this process may not write (a read-only volume)."""
    db = config.persistent_db
    if db.type == "disabled":
        return False
    return db.read_only or (Path(db.path).exists() and not os.access(db.path, os.W_OK))


@contextmanager
def import_lock(state: Path) -> Iterator[None]:
    """The node's import lock (:func:`node_file`: beside ``state``, L3's folder or the
    ps.json's stem, unless that folder is read-only)."""
    lock = node_file(state, ".hps-import.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ImportRecord:
    """Which version of each table's files was imported completely (a JSON file): per table,
    the files' stamp (:meth:`TableSource.stamp`) and the digest of their content
    (:meth:`TableSource.digest`; absent from a record an older release wrote).

    A damaged record (not JSON, or not an object) is read as empty, with a warning naming
    it: it holds nothing the tiers lack, so each table is then checked again
    (:func:`_unchanged`) and the next import writes the record anew."""

    def __init__(self, state: Path, *, quiet: bool = False) -> None:
        self.path = node_file(state, ".hps-import.json", writable=False)
        self.tables: dict[str, object] = self._read(quiet)

    def _read(self, quiet: bool) -> dict[str, object]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if isinstance(doc, dict):
                return doc
            problem = f"a JSON {type(doc).__name__}, not an object"
        if not quiet:
            log.warning(
                "%s: damaged import record (%s): read as empty, each table is checked again",
                self.path,
                problem,
            )
        return {}

    def _entry(self, table: str) -> dict[str, object]:
        entry = self.tables.get(table)
        if isinstance(entry, list):  # an older release's: the stamp alone
            return {"stamp": entry}
        return entry if isinstance(entry, dict) else {}

    def current(self, source: TableSource) -> bool:
        """Whether the record names these very files (their stamp): nothing is read."""
        return self._entry(source.spec.name).get("stamp") == source.stamp()

    def digest(self, table: str) -> str | None:
        """The digest of the content imported for ``table``, if the record holds one."""
        digest = self._entry(table).get("digest")
        return digest if isinstance(digest, str) else None

    def mark(self, source: TableSource, digest: str, *, save: bool = True) -> None:
        """Record ``source`` as imported (its rows durable); ``save=False``: in memory only,
        until the next :meth:`save` (a batch of tables is written once)."""
        self.tables[source.spec.name] = {"stamp": source.stamp(), "digest": digest}
        if save:
            self._save()

    def save(self) -> None:
        """Write the record durably (the marks made with ``save=False``)."""
        self._save()

    def forget(self, tables: Iterable[str]) -> None:
        """Tables whose rows were dropped: their files are imported again next time."""
        gone = [t for t in tables if t in self.tables]
        for table in gone:
            del self.tables[table]
        if gone:
            self._save()

    def _save(self) -> None:
        """Replace the record durably: what it says survives a crash (the rows it names
        are durable before it is written: :meth:`hps.loading.loader.Loader.load`)."""
        replace_durably(self.path, json.dumps(self.tables, indent=1))


class FillRecord:
    """How the last fill of each table's L2 from L3 at a serving start-up ended on this
    node (a JSON file, :func:`node_file` ``.hps-l2-fill.json``): written by the serving
    process that filled, read by the control plane's ``/readyz``, dropped for a table when
    an import rewrites it."""

    SUFFIX = ".hps-l2-fill.json"

    def __init__(self, state: Path) -> None:
        self.path = node_file(state, self.SUFFIX)

    def read(self) -> dict[str, dict[str, str | int | float | None]]:
        """``{table: {"rows": copied, "problem": why it stopped or None, "at": unix time}}``."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def note(self, table: str, rows: int, problem: str | None) -> None:
        """Record a fill's outcome; a record that cannot be written is logged, not raised."""
        self._update(table, {"rows": rows, "problem": problem, "at": time.time()})

    def forget(self, table: str) -> None:
        self._update(table, None)

    def _update(self, table: str, entry: dict[str, str | int | float | None] | None) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                doc = self.read()
                if entry is None and table not in doc:
                    return
                if entry is None:
                    del doc[table]
                else:
                    doc[table] = entry
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(doc, indent=1))
                tmp.replace(self.path)
        except OSError as exc:
            log.warning("cannot record the L2 fill of %s in %s: %s", table, self.path, exc)


def sparse_sources(config: PSConfig, models: list[str] | None = None) -> list[TableSource]:
    """The ``sparse_files`` of the models (all by default), their sizes checked."""
    return [
        sparse_source(spec, path)
        for m in config.models
        if models is None or m.model in models
        for spec, path in zip(m.tables, m.sparse_files, strict=False)
    ]


def holds_a_database(path: str) -> bool:
    """Whether L3's folder holds a database (an empty folder, a fresh volume: not yet)."""
    return (Path(path) / "CURRENT").exists()


def import_tables(
    config: PSConfig,
    topo: Topology,
    sources: list[TableSource] | None = None,
    *,
    force: bool = False,
    progress: bool = False,
    keep_l2_rows: bool = False,
) -> dict[str, int]:
    """Import what is new or changed (everything with ``force``); rows imported per table.

    A missing L3 is created (empty if there is nothing to import), so readers can open it.
    A table stored in another format or dimension is refused (ConfigError), unless
    ``force``: then it is dropped in every tier and imported in its configured format.
    ``keep_l2_rows``: a shared L2 (Redis) gets only the rows it lacks (L2Action ``absent``).
    """
    sources = sparse_sources(config) if sources is None else sources
    state = topo.state_dir
    if state is None:
        return {}  # no L3 and no shared L2: every serving process loads its own L2
    record = ImportRecord(state)
    fresh = topo.l3 and not holds_a_database(config.persistent_db.path)
    if not force and not fresh and all(map(record.current, sources)):
        return {}  # nothing to do: no lock taken, nothing written
    if topo.l3 and not fresh and l3_read_only(config):
        _check_read_only(config, record, sources, force)
        return {}
    with import_lock(state), ExitStack() as files:
        record = ImportRecord(state, quiet=True)  # as another process may have left it
        fresh = topo.l3 and not holds_a_database(config.persistent_db.path)
        todo = [s for s in sources if force or fresh or not record.current(s)]
        # opened once, before anything is read: every pass reads (and the record stamps)
        # the same files, whatever replaces them meanwhile
        todo = [files.enter_context(s.opened()) for s in todo]
        if fresh or force:  # each will be validated: too big for memory is said unread
            for s in todo:
                s.check_memory()
        digests = {s.spec.name: s.digest() for s in todo}
        if todo and not fresh and not force:
            unchanged = _unchanged(config, record, todo, digests)
            for s in unchanged:
                log.info("%s: %s unchanged: already imported", s.spec.name, s.where)
                record.mark(s, digests[s.spec.name], save=False)
            if unchanged:
                record.save()
            todo = [s for s in todo if s not in unchanged]
        if not todo and not fresh:
            return {}  # L3 may have a writer of its own (hps consume): open it only to import
        for s in todo:  # every table before the first is validated
            s.check_memory()
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
        if keep_l2_rows and action == "fill":
            action = "absent"
        # before the first write or drop of any of them: a crash from here on leaves them
        # unrecorded (imported again next time), never recorded over rows of other files
        record.forget(s.spec.name for s in todo)
        writer = Tiers.open(config, l3_mode="read_write", l2=action != "skip")
        try:
            writer.open_tables((s.spec for s in todo), replace=force)
            if force:
                _drop_damaged(writer, [s.spec for s in todo])
        except BaseException:
            writer.close()
            raise
        loader = Loader(writer, action, config.volatile_db.initial_cache_rate, progress=progress)
        imported: dict[str, int] = {}
        pending = False  # marks not yet written
        saved = time.monotonic()
        try:
            for s in todo:
                log.info("%s: importing %s", s.spec.name, s.where)
                imported[s.spec.name] = loader.load(s)  # durable when it returns
                _check_loaded(s)
                record.mark(s, digests[s.spec.name], save=False)
                pending = True
                FillRecord(state).forget(s.spec.name)  # L2 is filled again from here
                if time.monotonic() - saved >= RECORD_EVERY_S:
                    record.save()
                    pending, saved = False, time.monotonic()
        finally:
            try:
                if pending:  # the tables loaded before a failure stay recorded
                    record.save()
            finally:
                writer.close()
    return imported


RECORD_EVERY_S = 1.0
"""An import of many tables writes the record at most this often (and at its end): a crash
loses the marks of the tables loaded since, which the next import then imports again."""


def _drop_damaged(writer: Tiers, specs: list[TableSpec]) -> None:
    """``hps import --force``: a table whose L3 column family is damaged (a block that fails
    its checksum, :meth:`hps.tiers.Tiers.verify_l3`) is dropped in every tier before it is
    imported again, so that its damaged files go (rows written over them would leave them
    in place)."""
    by_name = {spec.name: spec for spec in specs}
    for check in writer.verify_l3(list(by_name)):
        if not check.ok:
            log.warning(
                "%s is damaged in L3 (after %d rows: %s): dropping it in every tier to import "
                "it again",
                check.name,
                check.rows,
                check.problem,
            )
            writer.drop_table(by_name[check.name])


def _unchanged(
    config: PSConfig, record: ImportRecord, sources: list[TableSource], digests: dict[str, str]
) -> list[TableSource]:
    """The one decision whether a table's files (opened, not the ones the record stamps)
    are already imported, on their whole content, never a sample: the record's digest of
    the content imported equals theirs (``digests``, by table: needed where the record
    holds one); where the record holds none (an older release's record, or none), L3 holds
    exactly their rows (:func:`hps.loading.loader.l3_holds`), else they are not."""
    unchanged: list[TableSource] = []
    unknown: list[TableSource] = []
    for s in sources:
        recorded = record.digest(s.spec.name)
        if recorded is None:
            unknown.append(s)
        elif recorded == digests[s.spec.name]:
            unchanged.append(s)
    if unknown and config.persistent_db.type != "disabled":
        reader = Tiers.open(config, l3_mode="read_only", l2=False)
        try:
            reader.open_tables(s.spec for s in unknown)
            unchanged += [s for s in unknown if l3_holds(reader, s)]
        finally:
            reader.close()
    return unchanged


def _check_loaded(source: TableSource) -> None:
    """Before ``source`` (opened, now loaded) is recorded: a FormatError when its files
    were written meanwhile (the rows loaded may mix two versions of them); files replaced
    meanwhile were loaded as they were opened, which the record says (its stamp is
    theirs): the next import imports the new ones."""
    assert source.handles is not None
    if written := source.handles.written():
        raise FormatError(
            f"{source.spec.name}: {', '.join(map(str, written))} changed while it was imported "
            "(rewritten in place): L3 may hold rows of both versions and the table is not "
            "recorded as imported; replace files by renaming new ones over them, then import "
            "again"
        )
    if replaced := source.handles.replaced():
        log.warning(
            "%s: %s replaced while it was imported: the files as they were are imported "
            "and recorded; the next import imports the new ones",
            source.spec.name,
            ", ".join(map(str, replaced)),
        )


def _check_read_only(
    config: PSConfig, record: ImportRecord, sources: list[TableSource], force: bool
) -> None:
    """An L3 served as it is must already hold every table's files (:func:`_unchanged`)."""
    path = config.persistent_db.path
    if force:
        raise ConfigError(f"persistent_db {path} is read-only: cannot import into it")
    with ExitStack() as files:
        changed = [files.enter_context(s.opened()) for s in sources if not record.current(s)]
        digests = {s.spec.name: s.digest() for s in changed if record.digest(s.spec.name)}
        unchanged = _unchanged(config, record, changed, digests)
    missing = [s for s in changed if s.rows and s not in unchanged]
    if missing:
        s = missing[0]
        raise ConfigError(
            f"persistent_db {path} is read-only and does not hold {s.spec.name} as in "
            f"{s.where}: import it where L3 is writable, or serve L3's files"
        )
    log.info("L3 %s is read-only and holds every table's files: served as it is", path)
