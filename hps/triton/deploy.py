"""What a serving process does with a ps.json before it answers requests.

- :func:`serving_config` reads the ps.json as served: relative paths resolved against the
  directory ``hps serve`` started in, and ``multi_process_hash_map`` as the L2 when a model
  runs several instances and the file names no volatile_db type (one L2 per node, not one
  per Triton process).
- :func:`prepare_tables` brings L3 (and a shared L2) up to date with the tables named by
  ``sparse_files``, as HugeCTR did at start-up: a table is imported when L3 does not exist
  yet or when its files changed since the last import (size or mtime, recorded beside L3),
  which is how a reload through Triton's model-control API picks up retrained tables.
  L3 is opened for writing only then, so a separate writer (``hps consume``) can hold it
  otherwise. A file lock makes the processes of one node take turns; the first does the
  work, the others find it done.
- :func:`fill_l2` fills an L2 that lives and dies with the serving processes (an in-process
  ``hash_map``, or the node's ``multi_process_hash_map``) per ``initial_cache_rate``
  (every row when there is no L3).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hps.config import ModelConfig, PSConfig, load_config
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model, sparse_model_rows
from hps.lookup import LookupSession
from hps.types import TableSpec

log = logging.getLogger(__name__)

LOCAL_L2 = {"hash_map", "parallel_hash_map"}  # one per process
PER_NODE_L2 = {"multi_process_hash_map"}  # one per node, gone with its last process
SHARED_L2_DEFAULT = "multi_process_hash_map"


def _absolute(path: str, base: Path) -> str:
    return path if not path or os.path.isabs(path) else str((base / path).resolve())


def serving_config(path: str | Path, base_dir: str | Path | None = None) -> PSConfig:
    """The ps.json at ``path`` as a serving process uses it (see the module docstring)."""
    from hps.storage import BACKENDS

    config = load_config(path)
    base = Path(base_dir or os.getcwd())
    models = [
        m.model_copy(
            update={
                "sparse_files": [_absolute(p, base) for p in m.sparse_files],
                "dense_file": _absolute(m.dense_file, base),
                "network_file": _absolute(m.network_file, base),
                "hps_cache": m.hps_cache.model_copy(
                    update={
                        k: _absolute(v, base)
                        for k in ("frequency_file", "warmup_keyset")
                        if (v := getattr(m.hps_cache, k))
                    }
                ),
            }
        )
        for m in config.models
    ]
    update: dict[str, Any] = {"models": models}
    if config.persistent_db.type != "disabled":
        update["persistent_db"] = config.persistent_db.model_copy(
            update={"path": _absolute(config.persistent_db.path, base)}
        )
    vdb = config.volatile_db
    several = any(m.hps_instances > 1 for m in config.models)
    if several and "type" not in vdb.model_fields_set and SHARED_L2_DEFAULT in BACKENDS:
        update["volatile_db"] = vdb.model_copy(update={"type": SHARED_L2_DEFAULT})
    elif several and vdb.type in LOCAL_L2:
        log.warning("volatile_db %s is per process: each instance holds its own L2", vdb.type)
    return config.model_copy(update=update)


def only_model(config: PSConfig, model: str) -> PSConfig:
    """``config`` restricted to one model (what one Triton model's processes open)."""
    return config.model_copy(update={"models": [config.model(model)]})


def _stamp(path: str) -> list[int]:
    return [x for f in (KEY_FILE, VECTOR_FILE) for x in _size_mtime(Path(path) / f)]


def _size_mtime(f: Path) -> tuple[int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns


def _state_base(config: PSConfig) -> Path | None:
    """Where the lock and the import record live: beside L3, else beside the ps.json."""
    if config.persistent_db.type != "disabled":
        return Path(config.persistent_db.path)
    if config.volatile_db.type not in LOCAL_L2 | {"disabled"}:
        return Path(config.source).with_suffix("")
    return None


@contextmanager
def _locked(base: Path) -> Iterator[None]:
    lock = base.with_name(base.name + ".hps-import.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def writer_lock(config: PSConfig) -> Iterator[None]:
    """The lock :func:`prepare_tables` imports under; other L3/L2 writers (hps admin) take it."""
    base = _state_base(config)
    if base is None:
        yield
        return
    with _locked(base):
        yield


def prepare_tables(
    config: PSConfig, models: list[str] | None = None, *, progress: bool = False
) -> dict[str, int]:
    """Import new or changed sparse files into L3 and a shared L2; rows imported per table."""
    base = _state_base(config)
    if base is None:
        return {}
    from hps.build import build_session

    record_file = base.with_name(base.name + ".hps-import.json")
    l3_path = config.persistent_db.path if config.persistent_db.type != "disabled" else None
    imported: dict[str, int] = {}
    with _locked(base):
        record = json.loads(record_file.read_text()) if record_file.exists() else {}
        fresh = l3_path is not None and not Path(l3_path).exists()
        todo = [
            (spec, path)
            for m in config.models
            if models is None or m.model in models
            for spec, path in zip(m.tables, m.sparse_files, strict=False)
            if fresh or record.get(spec.name) != [path, *_stamp(path)]
        ]
        if config.volatile_db.type in LOCAL_L2:  # another process's L2: not ours to fill
            vdb = config.volatile_db.model_copy(update={"type": "disabled"})
            config = config.model_copy(update={"volatile_db": vdb})
        unknown = [(s, p) for s, p in todo if s.name not in record]
        if unknown and l3_path is not None and not fresh:
            held = _already_imported(config, unknown)  # e.g. by `hps import`
            todo = [t for t in todo if t not in held]
            record.update({spec.name: [path, *_stamp(path)] for spec, path in held})
            record_file.write_text(json.dumps(record, indent=1))
        if not todo and not fresh:
            return {}  # L3 may have a writer of its own (hps consume): open it only to import
        writer = build_session(config, with_cache=False, persistent_mode="read_write")
        try:
            for spec, path in todo:
                log.info("%s: importing %s", spec.name, path)
                imported[spec.name] = _import(writer, spec, path, config, progress)
                record[spec.name] = [path, *_stamp(path)]
                record_file.write_text(json.dumps(record, indent=1))
        finally:
            writer.close()
    return imported


def _already_imported(
    config: PSConfig, tables: list[tuple[TableSpec, str]]
) -> list[tuple[TableSpec, str]]:
    """The tables L3 holds already (their files' first and last keys), read-only."""
    from hps.build import build_session
    from hps.io.importer import l3_holds

    vdb = config.volatile_db.model_copy(update={"type": "disabled"})
    config = config.model_copy(update={"volatile_db": vdb})
    reader = build_session(config, with_cache=False, persistent_mode="read_only")
    try:
        return [(spec, path) for spec, path in tables if l3_holds(reader, spec, path)]
    finally:
        reader.close()


def _l2_share(config: PSConfig, has_l3: bool) -> float:
    return config.volatile_db.initial_cache_rate if has_l3 else 1.0


def _import(
    session: LookupSession, spec: TableSpec, path: str, config: PSConfig, progress: bool
) -> int:
    """All rows to L3; L2 gets the first ``initial_cache_rate`` share and loses the rest.

    A node-local shared L2 (``multi_process_hash_map``) in front of L3 only loses the
    table's keys (its serving processes refill it, see :func:`fill_l2`): whatever it held
    of the previous version is stale.
    """
    from hps.io.progress import Progress

    rows = sparse_model_rows(path, spec.dim)
    has_l3 = session.persistent is not None
    invalidate_only = has_l3 and config.volatile_db.type in PER_NODE_L2
    to_l2 = 0 if invalidate_only else int(round(_l2_share(config, has_l3) * rows))
    bar = Progress(f"import {spec.name}", rows, enabled=progress)
    done = 0
    for keys, vectors in read_sparse_model(path, spec.dim):
        if session.persistent is not None:
            session.persistent.insert(spec.name, keys, vectors)
        if session.volatile is not None:
            n = max(0, min(keys.size, to_l2 - done))
            if n:
                session.volatile.insert(spec.name, keys[:n], vectors[:n])
            if n < keys.size:
                session.volatile.remove(spec.name, keys[n:])
        done += keys.size
        bar.advance(keys.size)
    return done


def fill_l2(session: LookupSession, config: PSConfig, model: ModelConfig) -> int:
    """Fill an L2 that belongs to this process or node from the sparse files; rows inserted.

    An in-process L2 is filled by every process; a ``multi_process_hash_map`` by the first
    process of the node that finds a table empty in it. Redis is filled at import.
    """
    vtype = config.volatile_db.type
    if session.volatile is None or vtype not in LOCAL_L2 | PER_NODE_L2 or not model.sparse_files:
        return 0
    share = _l2_share(config, session.persistent is not None)
    if vtype in LOCAL_L2:
        return _fill(session, model, share, lambda spec: True)
    base = _state_base(config)
    assert base is not None  # a shared L2 always has one
    l2 = session.volatile
    with _locked(base):
        return _fill(session, model, share, lambda spec: l2.size(spec.name) == 0)


def _fill(
    session: LookupSession, model: ModelConfig, share: float, wanted: Callable[[TableSpec], bool]
) -> int:
    """From L3 when there is one (it holds imports and deletes made since the sparse files)."""
    assert session.volatile is not None
    l3 = session.persistent
    total = 0
    for spec, path in zip(model.tables, model.sparse_files, strict=True):
        if not wanted(spec):
            continue
        if l3 is not None and hasattr(l3, "dump"):
            # size() scans the keys: only count when a share is wanted
            left = int(round(share * l3.size(spec.name))) if share < 1 else 1 << 62
            chunks = l3.dump(spec.name)
        else:
            left = int(round(share * sparse_model_rows(path, spec.dim)))
            chunks = read_sparse_model(path, spec.dim)
        for keys, vectors in chunks:
            if left <= 0:
                break
            n = min(keys.size, left)
            session.volatile.insert(spec.name, keys[:n], vectors[:n])
            left -= n
            total += n
    return total
