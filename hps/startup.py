"""What a process does to a new LookupSession before it serves: warm L1 up, plan refreshes,
and keep a node's shared L2 whole.

Warm-up (which keys, from :func:`hps.cache.warmup.plan_warm_up`) loads vectors through
``session.warm_up``, so L1 starts consistent with L2/L3; refreshers re-read resident keys
every ``refresh_interval`` (:class:`hps.cache.refresh.Refresher`).

:class:`SharedL2Watch` keeps a process on the ``multi_process_hash_map`` segment its name
points at (:func:`watch_shared_l2` builds one where L2 is one): when the segment held is
removed or replaced, the store moves to the current one and the watch refills it from L3,
re-reads L1's resident keys and reports not-ready (:meth:`SharedL2Watch.problem`) until
that is done. Who refills: the process that applies updates to L3 (``hps consume``,
``fill="overwrite"``, in its loop between batches, so no update can come between the rows
it reads from L3 and the ones it writes); with no such process (no Kafka) the serving
processes, the first to find a table empty (``fill="if_empty"``, under the node's import
lock, as the start-up fill). A finished fill is recorded in the segment; every watch
re-reads its L1's resident keys when it sees a new one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from hps.cache.refresh import Refresher
from hps.cache.warmup import WARMUP_CHUNK, plan_warm_up, prefill_wanted
from hps.config import ModelConfig, PSConfig
from hps.errors import HPSError
from hps.io.sparse_model import table_rows
from hps.lookup import LookupSession
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.tiers import RowStore, Tiers
from hps.topology import topology
from hps.types import Keys, TableSpec

log = logging.getLogger(__name__)


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


def refreshers_for(session: LookupSession, config: PSConfig) -> list[Refresher]:
    """One (unstarted) Refresher per model with a cache and ``refresh_interval`` > 0."""
    out = []
    for model in config.models:
        caches = {t.name: session.caches[t.name] for t in model.tables if t.name in session.caches}
        r = Refresher(
            caches,
            session.refresh,
            interval=model.refresh_interval,
            delay=model.refresh_delay,
            percentage=model.cache_refresh_percentage_per_iteration,
            before_pass=session.tiers.catch_up,
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

    from hps.io.keyset import read_keyset

    loaded: dict[str, int] = {}
    if not files_json:
        return loaded
    for table, path in json.loads(files_json).items():
        name = f"{model}.{table}"
        keys = read_keyset(path)
        loaded[name] = sum(session.warm_up(name, c) for c in _chunks(keys, WARMUP_CHUNK))
        log.info("L1 %s: warmed up %d rows from %s", name, loaded[name], path)
    return loaded


FillMode = Literal["overwrite", "if_empty", "none"]
"""How a :class:`SharedL2Watch` refills a new segment: every table from L3 (the process that
writes L3), the tables it finds empty (serving processes where nothing else writes), none
(serving processes while ``hps consume`` refills)."""

WATCH_INTERVAL_S = 1.0
"""How often a watch checks the segment's identity (an ``os.stat``, an 8-byte read)."""


class SharedL2Watch:
    """Keeps one process on its node's current shared-memory L2 (see the module docstring).

    :meth:`check` is cheap and may be called on every pass of a loop (it acts at most every
    ``interval_s``); :meth:`start` runs it in a daemon thread instead.
    """

    def __init__(
        self,
        store: SharedHashMapStore,
        tiers: Tiers,
        tables: Sequence[TableSpec],
        *,
        fill: FillMode,
        share: float = 1.0,
        session: LookupSession | None = None,
        lock_dir: Path | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.store = store
        self.tiers = tiers
        self.tables = list(tables)
        self.fill = fill
        self.share = share
        self.session = session
        self.lock_dir = lock_dir
        self.interval_s = interval_s
        self.recoveries = 0  # refills finished after a move
        self._generation = store.generation
        self._filled = store.filled()
        self._failure: str | None = None
        self._last = time.monotonic()
        self._busy = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def problem(self) -> str | None:
        """None while this process serves the current segment, refilled; else why not."""
        if self._failure is not None:
            return self._failure
        if self.store.generation != self._generation:
            return f"shared L2 {self.store.path} was replaced: refilling it from L3"
        return None

    def check(self, *, force: bool = False) -> bool:
        """Follow the segment's name, refill and re-read L1 where needed (at most every
        ``interval_s`` unless ``force``); True if this call recovered from a move."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return False
        if not self._busy.acquire(blocking=False):
            return False  # another thread of this process is at it
        try:
            self._last = now
            self.store.follow()
            if self.store.generation != self._generation or self._failure is not None:
                return self._recover()
            filled = self.store.filled()
            if filled != self._filled:  # another process refilled: L1 may hold what it fixed
                self._filled = filled
                self._refresh_l1()
            return False
        finally:
            self._busy.release()

    def _recover(self) -> bool:
        generation = self.store.generation
        try:
            rows = self._fill()
            self._refresh_l1()
        except HPSError as exc:
            self._failure = f"shared L2 {self.store.path} was replaced; refilling failed: {exc}"
            log.warning("%s (retrying in %g s)", self._failure, self.interval_s)
            return False
        self._generation = generation
        self._filled = self.store.filled()
        self._failure = None
        self.recoveries += 1
        log.warning(
            "shared L2 %s: back on the current segment (%d rows refilled here)",
            self.store.path,
            rows,
        )
        return True

    def _fill(self) -> int:
        if self.fill == "none" or self.tiers.persistent is None:
            return 0
        if self.fill == "overwrite":
            rows = sum(self.tiers.fill_l2_from_l3(s.name, self.share) for s in self.tables)
            self.store.mark_filled()
            return rows
        rows = 0
        from hps.loading.imports import import_lock

        lock = import_lock(self.lock_dir) if self.lock_dir else contextlib.nullcontext()
        with lock:
            empty = [s for s in self.tables if self.store.size(s.name) == 0]
            if empty:
                self.tiers.catch_up()
                rows = sum(self.tiers.fill_l2_from_l3(s.name, self.share) for s in empty)
                self.store.mark_filled()
        return rows

    def _refresh_l1(self) -> None:
        """Re-read every resident L1 row from L2/L3 (L3 caught up once first)."""
        session = self.session
        if session is None or not session.caches:
            return
        before = self.tiers.catch_up_once()
        for name, cache in session.caches.items():
            resident = getattr(cache, "resident_keys", None)  # hps.cache.refresh.Refreshable
            if resident is None:
                continue
            for keys in _chunks(resident(), WARMUP_CHUNK):
                session.refresh(name, keys, before_l3=before)

    def start(self) -> SharedL2Watch:
        """Run :meth:`check` every ``interval_s`` in a daemon thread."""

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check(force=True)
                except Exception:  # a watch that dies would hide the next fault
                    log.exception("shared L2 watch of %s", self.store.path)

        self._thread = threading.Thread(target=loop, name="hps-shared-l2-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def watch_shared_l2(
    session: LookupSession, config: PSConfig, *, role: Literal["consumer", "serving"]
) -> SharedL2Watch | None:
    """A watch over ``session``'s L2 when it is a ``multi_process_hash_map`` (else None).

    ``role``: ``consumer`` for ``hps consume`` (it refills every table from the L3 it
    writes), ``serving`` for a serving process (it refills only where no consumer does).
    """
    volatile = session.tiers.volatile
    store = getattr(volatile, "_store", None)  # RowStore keeps its backend private
    if not isinstance(store, SharedHashMapStore):
        return None
    topo = topology(config)
    fill: FillMode = (
        "overwrite" if role == "consumer" else "none" if topo.updates == "consumer" else "if_empty"
    )
    return SharedL2Watch(
        store,
        session.tiers,
        list(session.tables.values()),
        fill=fill,
        share=config.volatile_db.initial_cache_rate,
        session=session,
        lock_dir=topo.state_dir,
    )
