"""Bulk import of whole tables into L3 (and L2 per ``initial_cache_rate``), streamed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hps.config import ModelConfig
from hps.io.progress import Progress
from hps.io.sparse_model import read_sparse_model, sparse_model_rows
from hps.lookup import LookupSession
from hps.types import Keys, TableSpec, Vectors

log = logging.getLogger(__name__)


def import_chunks(
    session: LookupSession,
    spec: TableSpec,
    chunks: Iterable[tuple[Keys, Vectors]],
    total_rows: int,
    *,
    initial_cache_rate: float = 1.0,
    progress: bool = True,
    process_local_l2: bool = False,
) -> int:
    """Write chunks to L3 and the first ``initial_cache_rate`` share of rows to L2.

    Without L3 every row goes to L2. A process-local L2 (the in-process hash map) is
    skipped unless ``process_local_l2`` is set: it would die with an import command; the
    serving process fills its own with :func:`preload_volatile`. Returns the rows imported.
    """
    volatile = session.volatile
    if volatile is not None and getattr(volatile, "process_local", False) and not process_local_l2:
        volatile = None
    to_l2 = int(round(initial_cache_rate * total_rows)) if session.persistent else total_rows
    bar = Progress(f"import {spec.name}", total_rows, enabled=progress)
    done = 0
    for keys, vectors in chunks:
        if session.persistent is not None:
            session.persistent.insert(spec.name, keys, vectors)
        if volatile is not None and done < to_l2:
            n = min(keys.size, to_l2 - done)
            volatile.insert(spec.name, keys[:n], vectors[:n])
        done += keys.size
        bar.advance(keys.size)
    return done


def import_sparse_model(
    session: LookupSession, spec: TableSpec, path: str | Path, **kw: object
) -> int:
    rows = sparse_model_rows(path, spec.dim)  # validates before anything is written
    return import_chunks(session, spec, read_sparse_model(path, spec.dim), rows, **kw)  # type: ignore[arg-type]


def l3_holds(session: LookupSession, spec: TableSpec, path: str | Path) -> bool:
    """Whether L3 already holds the sparse model at ``path`` (its first and last keys)."""
    rows = sparse_model_rows(path, spec.dim)
    if session.persistent is None or rows == 0:
        return False
    key_file = Path(path) / "key"
    first = np.fromfile(key_file, dtype="<i8", count=1)
    last = np.fromfile(key_file, dtype="<i8", count=1, offset=(rows - 1) * 8)
    keys = np.concatenate([first, last]).astype(np.int64)
    _, found = session.persistent.fetch(spec.name, keys)
    return bool(found.all())


def import_model(
    session: LookupSession,
    model: ModelConfig,
    *,
    initial_cache_rate: float = 1.0,
    only_missing: bool = True,
    progress: bool = True,
) -> dict[str, int]:
    """Load the tables named by ``model.sparse_files`` (as HugeCTR did at start-up)."""
    imported: dict[str, int] = {}
    for spec, path in zip(model.tables, model.sparse_files, strict=False):
        if only_missing and l3_holds(session, spec, path):
            log.info("%s: L3 already holds %s, not importing", spec.name, path)
            continue
        imported[spec.name] = import_sparse_model(
            session, spec, path, initial_cache_rate=initial_cache_rate, progress=progress
        )
    return imported


def preload_volatile(session: LookupSession, initial_cache_rate: float) -> dict[str, int]:
    """Fill an empty L2 from L3 with ``initial_cache_rate`` of each table's rows.

    This is how a serving process fills its process-local L2 at start-up.
    """
    loaded: dict[str, int] = {}
    store = session.persistent
    if session.volatile is None or store is None or initial_cache_rate <= 0:
        return loaded
    for name, spec in session.tables.items():
        if session.volatile.size(name):
            continue
        budget = int(round(initial_cache_rate * store.size(name)))
        done = 0
        for keys, vectors in store.dump(name):  # type: ignore[attr-defined]
            if done >= budget:
                break
            n = min(keys.size, budget - done)
            session.volatile.insert(spec.name, keys[:n], vectors[:n])
            done += n
        loaded[name] = done
    return loaded
