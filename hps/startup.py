"""What a process does to a new LookupSession before it serves: fill L2 from L3, warm L1
up, plan refreshes, and keep a node's shared L2 whole.

:func:`fill_table_from_l3` is the start-up fill of one table's L2 from L3
(``initial_cache_rate``): a fill that fails (a damaged L3 block, an L2 that refuses rows)
is logged with its reason and recorded (:class:`hps.loading.imports.FillRecord`) where the
control plane's ``/readyz`` reports it as degraded; the process still serves (L3 answers
what L2 lacks).

Warm-up (which keys, from :func:`hps.cache.warmup.plan_warm_up`) loads vectors through
``session.warm_up``, so L1 starts consistent with L2/L3; refreshers re-read resident keys
every ``refresh_interval`` (:class:`hps.cache.refresh.Refresher`).

:func:`watch_shared_l2` keeps a process on its node's current shared-memory L2
(:mod:`hps.tiers.shared_l2`), its L1 re-reading what a refilled segment fixed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np

from hps.cache.refresh import Refresher
from hps.cache.warmup import WARMUP_CHUNK, load_slices, plan_warm_up, prefill_wanted
from hps.config import ModelConfig, PSConfig
from hps.errors import FillError, HPSError
from hps.io.sparse_model import table_rows
from hps.loading.imports import FillRecord, import_lock
from hps.lookup import LookupSession
from hps.tiers import RowStore, Tiers
from hps.tiers.shared_l2 import FillMode, SharedL2Watch, shared_l2
from hps.topology import topology
from hps.types import Keys

log = logging.getLogger(__name__)


def fill_table_from_l3(tiers: Tiers, table: str, share: float, state: Path | None) -> int:
    """Copy the first ``share`` of a table's L3 rows into L2; rows copied. A failure is
    logged and recorded for ``/readyz`` (``state``: the node's state dir), not raised."""
    try:
        rows = tiers.fill_l2_from_l3(table, share)
    except HPSError as exc:
        rows = exc.rows if isinstance(exc, FillError) else 0
        log.error("%s; L2 is partly filled, L3 answers the rest", exc)
        if state is not None:
            FillRecord(state).note(table, rows, str(exc))
        return rows
    if state is not None:
        FillRecord(state).note(table, rows, None)
    return rows


def table_keys(model: ModelConfig, index: int, persistent: RowStore | None, n: int) -> Keys | None:
    """Up to ``n`` keys of a table: from its sparse file's ``key`` file, else L3's dump."""
    if model.sparse_files:
        key_file = Path(model.sparse_files[index]) / "key"
        if key_file.is_file():
            return np.fromfile(key_file, dtype=np.int64, count=n)
    if persistent is None:
        return None
    parts, got = [], 0
    for keys, _ in persistent.dump(model.tables[index].name):
        parts.append(keys[: n - got])
        got += parts[-1].size
        if got >= n:
            break
    return np.concatenate(parts) if parts else None


def _chunks(keys: Keys, size: int) -> Iterator[Keys]:
    for lo in range(0, keys.size, size):
        yield keys[lo : lo + size]


def warm_up_session(session: LookupSession, config: PSConfig) -> dict[str, int]:
    """Warm every cached table of ``session`` as ``config`` says; returns rows loaded per table.

    Loads in slices of ``cache_refresh_percentage_per_iteration`` x capacity rows (or
    :data:`WARMUP_CHUNK` when that is 0), so start-up memory stays bounded.
    """
    loaded: dict[str, int] = {}
    for model in config.models:
        for index, spec in enumerate(model.tables):
            cache = session.caches.get(spec.name)
            if cache is None:
                continue
            capacity = cache.capacity
            keys = None
            if prefill_wanted(model, capacity, table_rows(model, index, session.tiers.persistent)):
                keys = table_keys(model, index, session.tiers.persistent, capacity)
            plan = plan_warm_up(model, index, capacity, keys)
            pct = model.cache_refresh_percentage_per_iteration
            chunk = max(1, math.ceil(pct * capacity)) if pct > 0 else WARMUP_CHUNK
            n = sum(session.warm_up(spec.name, c, pin=True) for c in _chunks(plan.pinned, chunk))
            n += sum(session.warm_up(spec.name, c) for c in _chunks(plan.rest, chunk))
            loaded[spec.name] = n
            log.info("L1 %s: warmed up %d of %d planned rows", spec.name, n, plan.size)
    return loaded


class _PassRefresh:
    """``session.refresh`` for one Refresher: a secondary L3 catches up with its writer at
    most once a pass, and only when L2 misses a key (:meth:`hps.tiers.Tiers.catch_up_once`;
    a catch-up replays the writer's WAL and holds the GIL while it does)."""

    def __init__(self, session: LookupSession) -> None:
        self.session = session
        self.before_l3 = session.tiers.catch_up_once()

    def new_pass(self) -> None:
        self.before_l3 = self.session.tiers.catch_up_once()

    def refresh(self, table: str, keys: Keys) -> None:
        self.session.refresh(table, keys, before_l3=self.before_l3)


def refreshers_for(session: LookupSession, config: PSConfig) -> list[Refresher]:
    """One (unstarted) Refresher per model with a cache and ``refresh_interval`` > 0."""
    out = []
    for model in config.models:
        caches = {t.name: session.caches[t.name] for t in model.tables if t.name in session.caches}
        reads = _PassRefresh(session)
        r = Refresher(
            caches,
            reads.refresh,
            interval=model.refresh_interval,
            delay=model.refresh_delay,
            percentage=model.cache_refresh_percentage_per_iteration,
            before_pass=reads.new_pass,
        )
        if r.enabled:
            out.append(r)
    return out


def warm_up_keysets(session: LookupSession, model: str, files_json: str | None) -> dict[str, int]:
    """Load the keys of keyset files into L1, ``files_json`` naming one file per table.

    ``files_json`` is a JSON object ``{"<table>": "<keyset path>"}``: the control plane's
    warm-up passes it as the ``hps_warmup_keysets`` model parameter. Rows loaded per table.
    """
    import json

    from hps.io.keyset import first_keys

    loaded: dict[str, int] = {}
    if not files_json:
        return loaded
    for table, path in json.loads(files_json).items():
        name = f"{model}.{table}"
        cache = session.caches.get(name)
        if cache is None:
            continue
        keys = first_keys(path, cache.capacity, setting="hps_warmup_keysets")
        slices = load_slices(keys, cache.capacity, WARMUP_CHUNK)
        loaded[name] = sum(session.warm_up(name, c) for c in slices)
        log.info("L1 %s: warmed up %d rows from %s", name, loaded[name], path)
    return loaded


def watch_shared_l2(
    session: LookupSession, config: PSConfig, *, role: Literal["consumer", "serving"]
) -> SharedL2Watch | None:
    """A watch over ``session``'s L2 when it is a ``multi_process_hash_map`` (else None;
    :mod:`hps.tiers.shared_l2`).

    ``role``: ``consumer`` for ``hps consume`` (it refills every table from the L3 it
    writes), ``serving`` for a serving process (it refills only where no consumer does).
    """
    store = shared_l2(session.tiers)
    if store is None:
        return None
    topo = topology(config)
    fill: FillMode = (
        "overwrite" if role == "consumer" else "none" if topo.updates == "consumer" else "if_empty"
    )
    state_dir = topo.state_dir
    return SharedL2Watch(
        store,
        session.tiers,
        list(session.tables.values()),
        fill=fill,
        share=config.volatile_db.initial_cache_rate,
        refresh_l1=partial(reread_l1, session),
        lock=partial(import_lock, state_dir) if state_dir else None,
    )


def reread_l1(session: LookupSession) -> None:
    """Re-read every resident L1 row from L2/L3 (L3 caught up once first). Each cache's
    :meth:`~hps.cache.EmbeddingCache.barrier` comes first: a fill that read the L2 being
    replaced and lands after the listing of its resident keys is dropped, not kept."""
    if not session.caches:
        return
    before = session.tiers.catch_up_once()
    for name, cache in session.caches.items():
        cache.barrier()
        for keys in _chunks(cache.resident_keys(), WARMUP_CHUNK):
            session.refresh(name, keys, before_l3=before)
