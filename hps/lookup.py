"""LookupSession: the public face of lookups, writes and L1 upkeep over the configured tables.

Its public methods are the boundary: they validate once (:mod:`hps.validate`) and raise a
:class:`hps.errors.RequestError` before anything is read or written; below them everything
runs through the one :class:`hps.pipeline.LookupPipeline` (L1 → L2 → L3 → default, with
backfill), a single table's lookup and a whole Triton request alike. The session is whole
when built: ``build_session`` hands it its tiers and caches.

Its API speaks float32: lookups answer float32 vectors, and vectors written through it are
encoded into each table's stored form (``spec.fmt.encode``, :mod:`hps.rowformat`) before
they reach L1, L2 or L3; rows moved between the levels (refresh, warm-up) stay stored rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import numpy.typing as npt

from hps.config import ModelConfig
from hps.errors import ShapeError, UnknownTableError
from hps.pipeline import LEVELS, L1Cache, LookupPipeline
from hps.rowformat import Stored
from hps.tiers import Tiers, encode_rows
from hps.types import Array, Keys, TableSpec, Vectors
from hps.validate import RequestLimits, as_keys, as_rows, check_table_keys, table_or_raise

if TYPE_CHECKING:
    from hps.cache.auto import L1Device

__all__ = ["LEVELS", "L1Cache", "LookupSession"]


class Stats(TypedDict):
    """:meth:`LookupSession.stats`: requests, their time, per table the counters
    ``lookups``, ``keys`` and the distinct keys found per level (:data:`LEVELS`), the
    keys L3 could not read (damaged blocks; answered from L2 or the default), the L2 reads
    refused (answered from L3), and the
    background fills dropped because the worker was behind
    (:data:`hps.pipeline.MAX_BACKGROUND_BYTES`)."""

    requests: int
    latency_s_total: float
    tables: dict[str, dict[str, int]]
    l3_damaged_keys: int
    l2_read_errors: int
    background_dropped: int


class LookupSession:
    """Looks up, inserts and refreshes embeddings of the configured models' tables."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        tiers: Tiers,
        *,
        caches: Mapping[str, L1Cache] | None = None,
        cache_missed_embeddings: bool = False,
        l1_devices: Mapping[str, L1Device] | None = None,
    ) -> None:
        self.models = {m.model: m for m in models}
        # per model with L1: where its caches run and why (hps.cache.auto)
        self.l1_devices: Mapping[str, L1Device] = dict(l1_devices or {})
        self.tables: dict[str, TableSpec] = {t.name: t for m in models for t in m.tables}
        self._specs = {m.model: m.tables for m in models}  # ModelConfig.tables builds anew
        self._limits = {name: RequestLimits.of(specs) for name, specs in self._specs.items()}
        self.tiers = tiers
        tiers.open_tables(self.tables.values())
        self.pipeline = LookupPipeline(
            models, tiers, caches or {}, backfill_l2=cache_missed_embeddings
        )
        self.caches = self.pipeline.caches  # fixed: L1 of each cached table
        self._lock = threading.Lock()
        self._latency_s = 0.0
        self._requests = 0

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, table: str, keys: npt.ArrayLike) -> Vectors:
        """Vectors of ``keys`` in request order, shape ``(len(keys), dim)``."""
        spec = table_or_raise(self.tables, table)
        keys = as_keys(keys)
        check_table_keys(spec, keys.size)
        start = time.perf_counter()
        out = self.pipeline.run((spec,), keys, (keys.size,)).reshape(keys.size, spec.dim)
        self._timed(start)
        return out

    def lookup_request(
        self, model: str, keys: npt.ArrayLike, num_keys: npt.ArrayLike, *, on_gpu: bool = False
    ) -> Array:
        """HugeCTR's request shape: flat keys of all tables + keys per table → flat vectors.

        ``on_gpu``: answered in a buffer of the GPU that holds the model's L1 (a CuPy array;
        :meth:`hps.pipeline.LookupPipeline.run`) where it is on one, for a consumer on that
        GPU; else, and by default, a NumPy array."""
        limits = self._limits.get(model)
        if limits is None:
            raise UnknownTableError(f"unknown model {model!r}; configured: {sorted(self.models)}")
        keys = as_keys(keys)
        counts = limits.counts(keys, num_keys)
        start = time.perf_counter()
        out = self.pipeline.run(self._specs[model], keys, counts, on_gpu=on_gpu)
        self._timed(start)
        return out

    def _timed(self, start: float) -> None:
        with self._lock:
            self._latency_s += time.perf_counter() - start
            self._requests += 1

    # -- writes and L1 upkeep --------------------------------------------------------------

    def insert(
        self, table: str, keys: npt.ArrayLike, values: npt.ArrayLike, *, durable: bool = False
    ) -> None:
        """Upsert float32 ``values`` (encoded in the table's format) into L3 then L2, and
        update the rows L1 holds. A value the format cannot hold: InvalidValueError."""
        spec = table_or_raise(self.tables, table)
        keys, values = as_rows(spec, keys, values)
        rows = encode_rows(spec, values)
        cache = self.caches.get(table)
        try:
            self.tiers.write(table, keys, rows, durable=durable)
        except BaseException:
            if cache is not None:  # whatever a tier took, L1 keeps no older row
                cache.evict(keys)
            raise
        if cache is not None:
            cache.update(keys, rows)

    def remove(self, table: str, keys: npt.ArrayLike) -> None:
        """Delete keys from every level (from L1 even when a tier fails)."""
        table_or_raise(self.tables, table)
        keys = as_keys(keys)
        cache = self.caches.get(table)
        try:
            self.tiers.remove(table, keys)
        finally:
            if cache is not None:
                cache.evict(keys)

    def refresh(
        self,
        table: str,
        keys: npt.ArrayLike,
        values: npt.ArrayLike | None = None,
        *,
        before_l3: Callable[[], None] | None = None,
    ) -> None:
        """Bring the L1 rows of ``keys`` up to date: with float32 ``values`` (encoded), or
        re-read from L2/L3 as stored (``before_l3``: see :meth:`hps.tiers.Tiers.fetch`).

        Only resident keys change; keys no lower level holds any more leave L1. A key no
        tier could answer for (L2 unreachable without an L3, a damaged L3 block) keeps its
        L1 row: L1 may be the one level still serving it.
        """
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return
        if values is not None:
            keys, values = as_rows(spec, keys, values)
            self.update_rows(table, keys, encode_rows(spec, values))
            return
        uniq = np.unique(as_keys(keys))
        uniq = uniq[cache.resident(uniq)]
        since = cache.version
        unread = np.zeros(uniq.size, dtype=bool)
        fresh, found = self.pipeline.fetch_rows(
            spec, uniq, before_l3, counted=False, unread_out=unread
        )
        cache.update(uniq[found], fresh[found], since=since)
        cache.evict(uniq[~found & ~unread])

    def update_rows(self, table: str, keys: Keys, rows: Stored) -> None:
        """Give the resident ``keys`` of L1 new rows already in the table's stored form (an
        update the applier encoded, or a message's vectors encoded); others are left out.
        The cache keeps a key's last row."""
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return
        if rows.dtype != spec.fmt.dtype or rows.shape != (keys.size, spec.width):
            raise ShapeError(
                f"{table}: stored {spec.row_dtype} rows of {keys.size} keys are "
                f"({keys.size}, {spec.width}) {spec.fmt.dtype}, got {rows.shape} {rows.dtype}"
            )
        cache.update(keys, rows)

    def prefetch(self, table: str, keys: npt.ArrayLike) -> int:
        """Load keys that are not resident from L2/L3 into L1; returns how many were loaded."""
        spec = table_or_raise(self.tables, table)
        return self.pipeline.prefetch(spec, np.unique(as_keys(keys)))

    def warm_up(self, table: str, keys: npt.ArrayLike, *, pin: bool = False) -> int:
        """Fill L1 with ``keys`` (the hottest first); ``pin`` makes them the static hot set."""
        if not pin:
            return self.prefetch(table, keys)
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return 0
        uniq = np.unique(as_keys(keys))
        rows, found = self.pipeline.fetch_rows(spec, uniq, counted=False)
        cache.pin(uniq[found], rows[found])
        return int(found.sum())

    def drain(self) -> None:
        """Wait for the background L1 work submitted so far (tests, shutdown)."""
        self.pipeline.drain()

    # -- introspection -------------------------------------------------------------------

    def stats(self) -> Stats:
        """Cumulative counters: per table lookups, keys and unique keys found per level."""
        with self._lock:
            return {
                "requests": self._requests,
                "latency_s_total": self._latency_s,
                "tables": {name: dict(c) for name, c in self.pipeline.counts.items()},
                "l3_damaged_keys": self.tiers.damaged_keys,
                "l2_read_errors": self.tiers.l2_read_errors,
                "background_dropped": self.pipeline.dropped,
            }

    def close(self) -> None:
        self.pipeline.close()
        self.tiers.close()
