"""Importing and retiring model versions (what ``hps versions`` and the control
plane's ``/v1/models/{model}/versions`` routes call).

- :func:`import_version`: a new version beside the live one. Its entry is the ps.json's
  model entry with the sparse files (and dense weights) of the new version; its rows go to
  its own namespace in every tier (:attr:`hps.types.TableSpec.name`), nothing served changes.
  The dense and network files are copied into the node's versions folder, so the version
  stays what it was imported as even if the files are replaced later.
- :func:`retire`: drop a version's rows in every tier (not the live one, nor a served one;
  a ``loading`` one only once its importer is gone: a process that died mid-import). It is
  recorded retired first, with its rows left until the drop succeeds: a retired version's
  rows are always dropped in the end (again by a later retire, activation or purge).

Activating a version is Triton's part: :mod:`hps.triton.activation`.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TypeVar

from hps.config import ModelConfig, PSConfig
from hps.config.model import CTR_SUFFIX, MAX_DIM
from hps.ctr.network import check_dense_inputs
from hps.errors import BackendError, ConfigError, HPSError, UnknownTableError
from hps.loading.imports import (
    ImportRecord,
    import_lock,
    import_tables,
    node_file,
    repository_dir,
    sparse_sources,
)
from hps.loading.loader import TableSource
from hps.rowformat import ROW_DTYPES
from hps.tiers import Tiers
from hps.topology import topology
from hps.versions.node_record import HOLDING, IMPORTED
from hps.versions.registry import VersionRegistry, VersionState, check_number
from hps.versions.shared_rows import holding, imported_elsewhere, not_as_here

log = logging.getLogger(__name__)
T = TypeVar("T")

VERSIONS_DIR = ".hps-versions"  # node folder: <model>/<n>/ holds a version's dense files


def version_entry(
    config: PSConfig,
    model: str,
    *,
    sparse_files: list[str] | None = None,
    dense_file: str | None = None,
    row_dtype: Sequence[str] | None = None,
    dims: Sequence[int] | None = None,
    base: ModelConfig | None = None,
) -> ModelConfig:
    """A new version's entry: ``base`` (the ps.json's entry of ``model``) with these files
    (paths made absolute), row formats (``row_dtype``, as ``hps_row_dtype`` names them) and
    dimensions (``dims``), each one for every table or one per table, so that a retrain in
    another format or dimension needs no edit of the ps.json (whose entry describes version
    1). A ConfigError for a count that is not the tables', an unknown row format, a
    dimension below 1, and CTR dense weights that do not take the version's dimensions
    (:func:`hps.ctr.network.check_dense_inputs`, when ``dense_file`` or ``dims`` is given).
    The version's sparse files are checked against its dimensions when it is imported."""
    entry = base or config.model(model)
    update: dict[str, object] = {}
    if sparse_files is not None:
        if len(sparse_files) != len(entry.tables):
            raise ConfigError(
                f"model {model!r} has {len(entry.tables)} tables but "
                f"{len(sparse_files)} sparse files were given"
            )
        update["sparse_files"] = [str(Path(p).resolve()) for p in sparse_files]
    if dense_file is not None:
        update["dense_file"] = str(Path(dense_file).resolve())
    if row_dtype is not None:
        # the formats named replace fp8_quant's (HugeCTR's int8 rows), which would contradict them
        update.update(hps_row_dtype=_row_dtypes(entry, row_dtype), fp8_quant=False)
    if dims is not None:
        update["embedding_vecsize_per_table"] = _dims(entry, dims)
    new = entry.model_copy(update=update)
    if new.serves_ctr and (dense_file is not None or dims is not None):
        check_dense_inputs(new)
    return new


def _row_dtypes(entry: ModelConfig, row_dtype: Sequence[str]) -> list[str]:
    """Each table's row format; ConfigError for an unknown one or a wrong count."""
    for name in row_dtype:
        if name not in ROW_DTYPES:
            raise ConfigError(
                f"model {entry.model!r}: unknown row format {name!r}: one of "
                f"{', '.join(ROW_DTYPES)}"
            )
    return _per_table(entry, "row formats", row_dtype)


def _dims(entry: ModelConfig, dims: Sequence[int]) -> list[int]:
    """Each table's dimension; ConfigError for one below 1, above MAX_DIM or a wrong count."""
    for dim in dims:
        if not 1 <= dim <= MAX_DIM:
            raise ConfigError(
                f"model {entry.model!r}: a table's dimension is a positive integer up to "
                f"{MAX_DIM}, not {dim}"
            )
    return _per_table(entry, "dimensions", dims)


def _per_table(entry: ModelConfig, what: str, values: Sequence[T]) -> list[T]:
    """``values`` for each table of ``entry``: one for every table, or one per table."""
    n = len(entry.tables)
    if len(values) not in (1, n):
        raise ConfigError(
            f"model {entry.model!r} has {n} tables ({', '.join(entry.table_names)}) but "
            f"{len(values)} {what} were given: give one for every table or one per table"
        )
    return list(values) * n if len(values) == 1 else list(values)


def _snapshot(
    config: PSConfig, entry: ModelConfig, version: int
) -> tuple[ModelConfig, dict[str, str]]:
    """The entry with its dense and network files in the node's versions folder, and the
    copies to make (destination: source). A ``network_file`` that is not a file on this
    node is left as given, not copied: nothing reads it (HugeCTR's network JSON, which a
    HugeCTR ps.json may name at a path of its own nodes)."""
    state = topology(config).state_dir
    assert state is not None  # VersionRegistry.begin refuses a node without one
    update: dict[str, object] = {}
    copies: dict[str, str] = {}
    for key in ("dense_file", "network_file"):
        src = getattr(entry, key)
        if src and (key == "dense_file" or Path(src).is_file()):
            dest = node_file(state, VERSIONS_DIR) / entry.model / str(version) / Path(src).name
            copies[str(dest)] = src
            update[key] = str(dest)
    return entry.model_copy(update=update), copies


def import_version(
    config: PSConfig, entry: ModelConfig, version: int, *, progress: bool = False
) -> dict[str, int]:
    """Import ``entry`` (see :func:`version_entry`) as ``version`` of its model, beside the
    versions there are; rows imported per table. The version is recorded with the
    :func:`fingerprint` of its files; where another node sharing the Redis L2 imported
    that number from other files, it is refused (:func:`check_same_files`) before anything
    is recorded or written. On failure nothing of it is left recorded, its partial rows
    are dropped and its files on this node (its import's marker, its copied dense and
    network files) deleted."""
    check_number(version)  # before its marker is made
    registry = VersionRegistry(config)
    model = entry.model
    if len(entry.sparse_files) != len(entry.tables):
        raise ConfigError(f"model {model!r} version {version}: no sparse files to import")
    registry.check_new(model, version)  # before its files are read
    snapshot, copies = _snapshot(config, entry, version)
    at = snapshot.at_version(version)
    served = config.model_copy(
        update={"models": [at if m.model == model else m for m in config.models]}
    )
    with _importing(config, model, version), ExitStack() as files:
        # opened once: the files fingerprinted are the files imported, whatever replaces them
        sources = [files.enter_context(s.opened()) for s in sparse_sources(served, [model])]
        print_ = fingerprint(sources)
        whole = check_same_files(config, at, print_)
        registry.begin(snapshot, version, print_)
        return _import(served, registry, at, sources, copies, whole=whole, progress=progress)


def fingerprint(sources: Sequence[TableSource]) -> str:
    """What identifies a version's files by content: a BLAKE2b digest over each table's
    name, dimension and content digest (:meth:`hps.loading.loader.TableSource.digest`:
    every byte of its key and vector files, with its row format), in table order. Equal
    fingerprints: imports that leave the same rows. One read of every file."""
    digest = hashlib.blake2b(digest_size=32)
    for source in sources:
        digest.update(f"{source.spec.table}:{source.spec.dim}:{source.digest()}\n".encode())
    return f"blake2b:{digest.hexdigest()}"


def check_same_files(config: PSConfig, at: ModelConfig, print_: str) -> bool:
    """Whether another node sharing the Redis L2 holds ``at`` (a model entry at its
    version) imported whole: an import of it then keeps the rows there (they may have
    taken updates since). A ConfigError where such a node imported it from other files
    than those whose :func:`fingerprint` is ``print_``: a lookup would get that node's rows
    from the shared L2 and this node's from its L3, one request answered by two models. A
    node whose record gives no fingerprint (an older release) refuses nothing: its rows
    are kept, as before there were fingerprints."""
    others = imported_elsewhere(config, at)
    differ = sorted(node for node, theirs in others.items() if theirs not in (None, print_))
    if differ:
        also = f" (and {len(differ) - 1} other nodes)" if len(differ) > 1 else ""
        raise ConfigError(
            f"model {at.model!r} version {at.version} was imported by node {differ[0]}{also} "
            f"from other files (fingerprint {others[differ[0]]}, these: {print_}), and the "
            "Redis L2 the nodes share holds its rows: import the same files or another "
            "version number. Nothing was recorded or written"
        )
    return bool(others)


def _import(
    served: PSConfig,
    registry: VersionRegistry,
    at: ModelConfig,
    sources: list[TableSource],
    copies: dict[str, str],
    *,
    whole: bool,
    progress: bool,
) -> dict[str, int]:
    """Copy the version's dense and network files and import ``sources`` (its tables) with
    ``served`` (the ps.json with the model's entry at ``at``); ``whole``: another node holds
    it imported, whose rows in a shared L2 are kept."""
    model, version = at.model, at.version
    try:
        for dest, src in copies.items():
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(src, dest)
            except OSError as exc:
                raise ConfigError(f"model {model!r}: cannot copy {src}: {exc}") from None
        # Every node imports the version into a shared L2 (Redis): the rows of a node that
        # imported it whole (from the same files: check_same_files), and the updates they
        # took since, are not overwritten by the next ones' snapshots; rows nobody holds
        # whole (a failed import's) are.
        rows = import_tables(served, topology(served), sources, progress=progress,
                             keep_l2_rows=whole)  # fmt: skip
    except BaseException:
        for dest in copies:
            Path(dest).unlink(missing_ok=True)
        try:
            # forgotten below, so nothing would drop rows kept for a node still importing
            drop_versions(served, [at], IMPORTED)
        except Exception as exc:  # noqa: BLE001 - the import's own error is the one to raise
            # Its rows stay: recorded `loading` and abandoned, it is retired by hand (which
            # drops them) rather than forgotten with rows a later import would mix with.
            log.error("model %s version %d: the failed import's rows could not be dropped "
                      "(%s); retire it to drop them", model, version, exc)  # fmt: skip
        else:
            registry.forget(model, version)
        raise
    registry.set_state(model, version, "ready")
    return rows


def _marker(config: PSConfig, model: str, version: int) -> Path:
    state = topology(config).state_dir
    assert state is not None  # VersionRegistry refuses to record versions without one
    return node_file(state, VERSIONS_DIR) / model / f"{version}.importing"


@contextmanager
def _importing(config: PSConfig, model: str, version: int) -> Iterator[None]:
    """Held while ``version`` is imported: a ``loading`` version nobody holds was abandoned
    (its importer died) and may be retired. An import that fails or is refused leaves no
    files: :func:`_clean_up`."""
    marker = _marker(config, model, version)
    with _locked(marker) as created:
        try:
            yield
        except BaseException:
            _clean_up(config, model, version, created)
            raise


@contextmanager
def _locked(marker: Path) -> Iterator[bool]:
    """``marker``, made if missing, locked exclusively until the block ends; whether this
    process made it. A marker deleted while this process waited for its lock (by the
    import that held it, which failed) is made again: the lock is on the file the path
    names."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd, created = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(marker, os.O_WRONLY), False
            except FileNotFoundError:
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _names(marker, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield created
    finally:
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` names the open file ``fd``."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _clean_up(config: PSConfig, model: str, version: int, created: bool) -> None:
    """After an import of ``version`` failed or was refused: its files go (marker, copied
    files, their folders) once it is not recorded (forgotten, or never begun); the marker
    alone, made by this import, where the number is another import's (refused: it
    exists). A version left recorded ``loading`` (its rows could not be dropped) keeps
    its files until it is retired. A failure here is logged: the import's error is the
    one raised."""
    try:
        try:
            recorded = any(v.version == version for v in VersionRegistry(config).versions(model))
        except UnknownTableError:
            recorded = False
        if not recorded:
            drop_version_files(config, model, version)
        elif created:
            marker = _marker(config, model, version)
            marker.unlink(missing_ok=True)
            with suppress(OSError):  # another version's files there: kept
                marker.parent.rmdir()
    except (HPSError, OSError) as exc:
        log.warning("model %s version %d: the files of its failed import were not deleted "
                    "(%s)", model, version, exc)  # fmt: skip


def _abandoned(config: PSConfig, model: str, version: int) -> bool:
    marker = _marker(config, model, version)
    if not marker.exists():
        return True
    with open(marker, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def drop_versions(
    config: PSConfig, entries: list[ModelConfig], held_as: frozenset[VersionState] = HOLDING
) -> set[tuple[str, int]]:
    """Drop the tables of ``entries`` (model entries at their version) in every tier, under
    the node's import lock (no import writes L3 meanwhile), and their import records: an
    import of the same number after a failed one imports every table again. The
    ``(model, version)`` whose rows in a shared Redis L2 are kept, another node holding
    them in a state of ``held_as`` (:mod:`hps.versions.shared_rows`), are returned."""
    topo = topology(config)
    state = topo.state_dir
    with import_lock(state) if state is not None else nullcontext():
        held = holding(config, entries, held_as)
        tiers = Tiers.open(config, l3_mode="read_write")
        try:
            for entry in entries:
                nodes = held.get((entry.model, entry.version))
                if nodes:
                    held_by = ", ".join(nodes)
                    log.info("model %s version %d: its rows in the shared L2 kept (%s holding "
                             "it)", entry.model, entry.version, held_by)  # fmt: skip
                for spec in entry.tables:
                    keep_l2 = nodes or (topo.l2 == "server" and not_as_here(tiers, spec))
                    (tiers.subset(l2=False) if keep_l2 else tiers).drop_table(spec, reopen=False)
        finally:
            tiers.close()
        if state is not None:
            ImportRecord(state).forget(s.name for entry in entries for s in entry.tables)
    return set(held)


def retire(config: PSConfig, model: str, version: int, repository: Path | None = None) -> None:
    """Record ``version`` retired and drop its rows in every tier (not the live one, nor
    one Triton serves: :func:`check_unserved`, with the model repository ``repository``,
    default ``hps serve``'s), under the node's lock of version changes. A version retired
    before whose rows are left (a drop that failed) has them dropped now."""
    registry = VersionRegistry(config)
    with registry.changing():
        retire_held(config, model, version, repository)


def retire_held(config: PSConfig, model: str, version: int, repository: Path | None = None) -> None:
    """:func:`retire` for a caller that holds ``VersionRegistry.changing`` (an activation).

    The version is recorded retired (nothing starts serving it or routes updates to it)
    with its rows left, then they are dropped, then recorded dropped: when the drop fails
    (L3 held by ``hps consume``: BackendError) or the process dies before it ends, the
    record says so and the next retire of it, activation of the model or purge drops
    them (dropping is idempotent). A failed drop is a BackendError saying the version is
    retired and what to run. Its rows dropped, its files on this node go too (its copied
    dense and network files, its import's marker: :func:`drop_version_files`), unless its
    rows in a shared L2 are kept for another node: then they go with those rows
    (:func:`hps.versions.shared_rows.release`)."""
    registry = VersionRegistry(config)
    info = registry.get(model, version)
    if info.state == "live":
        raise ConfigError(f"model {model!r} version {version} is live: activate another first")
    if info.state == "retired" and not info.rows_left:
        return
    if info.state == "loading" and not _abandoned(config, model, version):
        raise ConfigError(f"model {model!r} version {version} is being imported")
    if info.state != "retired":
        check_unserved(config, registry, model, version, repository)
    registry.set_state(model, version, "retired", rows_left=True)  # first: nothing serves it
    try:
        kept = drop_versions(config, [info.model_config()])
    except Exception as exc:
        raise BackendError(
            f"model {model!r} version {version} is retired but its rows could not be dropped "
            f"({exc}); they are dropped by the next retire of it (hps versions retire), "
            "activation of the model or purge"
        ) from exc
    registry.set_state(model, version, "retired", shared_rows_left=bool(kept))
    if not kept:
        drop_files_logged(config, model, version)
    log.info("model %s: version %d retired, its rows dropped%s", model, version,
             " (in the shared L2 once no other node holds it)" if kept else "")  # fmt: skip


def check_unserved(
    config: PSConfig,
    registry: VersionRegistry,
    model: str,
    version: int,
    repository: Path | None = None,
) -> None:
    """ConfigError where Triton may serve ``version`` of ``model``: the record serves it
    (:meth:`VersionRegistry.served`), or the version policy last written into the model
    repository ``repository`` (default ``hps serve``'s: :func:`written_policy`) names it,
    which the record does not know of after an activation that did not finish (its
    process killed after Triton loaded the version, or a failed load it could not undo)."""
    if version in registry.served(model):
        raise ConfigError(
            f"model {model!r} version {version} is served (kept for rollback below the live "
            "one): activate a version below it first"
        )
    named = sorted(name for name, given in written_policy(config, model, repository).items()
                   if version in given)  # fmt: skip
    if named:
        live = registry.live(model)
        raise ConfigError(
            f"model {model!r} version {version} may be served by Triton: the version policy "
            f"written for {', '.join(named)} names it, though the record does not (an "
            f"activation that did not finish); activate version {live} (the recorded live "
            f"one) to put Triton back on the record, or {version} to finish that "
            "activation, before retiring it"
        )


_POLICY = re.compile(r"^version_policy:\s*\{\s*specific:\s*\{\s*versions:\s*\[([^\]]*)\]", re.M)


def written_policy(
    config: PSConfig, model: str, repository: Path | None = None
) -> dict[str, list[int]]:
    """Per Triton model of ``model`` (``<model>``, ``<model>_ctr``) in the model repository
    ``repository`` (default: the one ``hps serve`` writes beside L3), the versions its
    version policy names as an activation last wrote it (what Triton was told to load); a
    model without a folder there (no repository, a removed model) is left out. Local files
    only: cheap."""
    repository = repository or repository_dir(config)
    if repository is None:
        return {}
    out: dict[str, list[int]] = {}
    others = {m.model for m in config.models} - {model}
    for name in (model, model + CTR_SUFFIX):
        if name in others:  # another model's Triton model (a model named <model>_ctr)
            continue
        path = repository / name / "config.pbtxt"
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        found = _POLICY.search(text)
        if found is not None:
            out[name] = [int(v) for v in re.findall(r"\d+", found.group(1))]
    return out


def drop_version_files(config: PSConfig, model: str, version: int) -> None:
    """Delete what ``version`` of ``model`` left on this node beside its rows (the marker of
    its import, its copied dense and network files), and the model's folder there once
    empty: for a version whose rows are dropped (retired, purged, a failed add's)."""
    state = topology(config).state_dir
    if state is None:
        return
    marker = _marker(config, model, version)
    marker.unlink(missing_ok=True)
    folder = marker.parent  # <node>.hps-versions/<model>
    shutil.rmtree(folder / str(version), ignore_errors=True)
    with suppress(OSError):  # another version's files there: kept
        folder.rmdir()


def drop_files_logged(config: PSConfig, model: str, version: int) -> None:
    """:func:`drop_version_files`, a failure logged: the version's rows are dropped and
    recorded so, and files left behind serve nothing."""
    try:
        drop_version_files(config, model, version)
    except Exception as exc:  # noqa: BLE001 - what matters (its rows) is done
        log.warning("model %s version %d: its files on this node were not deleted (%s)",
                    model, version, exc)  # fmt: skip
