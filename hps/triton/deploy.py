"""What a serving process does with a ps.json before it answers requests.

- :func:`serving_config` reads the ps.json as served: relative paths resolved against the
  directory ``hps serve`` started in, and ``multi_process_hash_map`` as the L2 when a model
  runs several instances and the file names no volatile_db type (one L2 per node, not one
  per Triton process).
- :func:`prepare_tables` brings L3 (and a shared L2) up to date with the tables named by
  ``sparse_files``, as HugeCTR did at start-up: a table is imported when L3 does not hold
  it yet or when its files changed since the last import (size or mtime), which is how a
  reload through Triton's model-control API picks up retrained tables. A file lock makes
  the processes of one node take turns; the first does the work, the others find it done.
- :func:`fill_local_l2` fills an in-process L2 (``hash_map``) of one serving process per
  ``initial_cache_rate`` (every row when there is no L3), since such an L2 is per process.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hps.config import ModelConfig, PSConfig, load_config
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model, sparse_model_rows
from hps.lookup import LookupSession
from hps.types import TableSpec

log = logging.getLogger(__name__)

LOCAL_L2 = {"hash_map", "parallel_hash_map"}
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
    """Where the lock and the import record live: beside L3, else beside a shared L2's ps.json."""
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


def prepare_tables(
    config: PSConfig, models: list[str] | None = None, *, progress: bool = False
) -> dict[str, int]:
    """Import new or changed sparse files into L3 and a shared L2; rows imported per table."""
    base = _state_base(config)
    chosen = [m for m in config.models if m.sparse_files and (models is None or m.model in models)]
    if base is None or not chosen:
        return {}
    from hps.build import build_session
    from hps.io.importer import l3_holds

    record_file = base.with_name(base.name + ".hps-import.json")
    imported: dict[str, int] = {}
    with _locked(base):
        record = json.loads(record_file.read_text()) if record_file.exists() else {}
        if config.volatile_db.type in LOCAL_L2:  # another process's L2: not ours to fill
            vdb = config.volatile_db.model_copy(update={"type": "disabled"})
            config = config.model_copy(update={"volatile_db": vdb})
        writer = build_session(config, with_cache=False, persistent_mode="read_write")
        try:
            for model in chosen:
                for spec, path in zip(model.tables, model.sparse_files, strict=True):
                    stamp = [path, *_stamp(path)]
                    held = writer.persistent is None or l3_holds(writer, spec, path)
                    if record.get(spec.name) == stamp and held:
                        continue
                    log.info("%s: importing %s", spec.name, path)
                    imported[spec.name] = _import(writer, spec, path, config, progress)
                    record[spec.name] = stamp
                    record_file.write_text(json.dumps(record, indent=1))
        finally:
            writer.close()
    return imported


def _import(
    session: LookupSession, spec: TableSpec, path: str, config: PSConfig, progress: bool
) -> int:
    """All rows to L3; the first ``initial_cache_rate`` share to L2, the rest out of L2."""
    from hps.io.progress import Progress

    rows = sparse_model_rows(path, spec.dim)
    rate = config.volatile_db.initial_cache_rate if session.persistent is not None else 1.0
    to_l2 = int(round(rate * rows))
    bar = Progress(f"import {spec.name}", rows, enabled=progress)
    done = 0
    for keys, vectors in read_sparse_model(path, spec.dim):
        if session.persistent is not None:
            session.persistent.insert(spec.name, keys, vectors)
        if session.volatile is not None:
            n = max(0, min(keys.size, to_l2 - done))
            if n:
                session.volatile.insert(spec.name, keys[:n], vectors[:n])
            if n < keys.size:  # rows a previous import may have left in L2 are stale now
                session.volatile.remove(spec.name, keys[n:])
        done += keys.size
        bar.advance(keys.size)
    return done


def fill_local_l2(session: LookupSession, config: PSConfig, model: ModelConfig) -> int:
    """Fill this process's in-process L2 from the sparse files; rows inserted."""
    if session.volatile is None or config.volatile_db.type not in LOCAL_L2:
        return 0
    rate = config.volatile_db.initial_cache_rate if session.persistent is not None else 1.0
    total = 0
    for spec, path in zip(model.tables, model.sparse_files, strict=False):
        left = int(round(rate * sparse_model_rows(path, spec.dim)))
        for keys, vectors in read_sparse_model(path, spec.dim):
            if left <= 0:
                break
            n = min(keys.size, left)
            session.volatile.insert(spec.name, keys[:n], vectors[:n])
            left -= n
            total += n
    return total
