"""LookupSession: one lookup path through L1 → L2 → L3 → default, with backfill.

Contract of :meth:`LookupSession.lookup`: vectors come back in request order, one row per
key (duplicates included); a key found nowhere gets its table's default vector; a key that
L2 or L3 holds never gets the default, unless the table opted into HugeCTR's behaviour for
asynchronous misses (``hps_cache.default_on_async_miss``). Bad input raises a
:class:`hps.errors.RequestError` before anything is read or written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

import numpy as np

from hps.config import ModelConfig
from hps.dedup import unique_inverse
from hps.errors import BackendUnavailable, BatchTooLargeError, CircuitOpenError, ShapeError
from hps.storage._checks import check_insert, check_keys_arg, last_occurrence, table_or_raise
from hps.storage.base import EmbeddingStore
from hps.types import Keys, Mask, TableSpec, Vectors

log = logging.getLogger(__name__)


class L1Cache(Protocol):
    """What the session needs of an L1 cache (hps.cache.EmbeddingCache implements it)."""

    @property
    def version(self) -> int: ...
    def query(self, keys: Keys, inverse: Any = None) -> tuple[Vectors, Mask]: ...
    def insert(
        self, keys: Keys, values: Vectors, *, since: int | None = None, force: bool = False
    ) -> None: ...
    def update(self, keys: Keys, values: Vectors, *, since: int | None = None) -> Mask: ...
    def evict(self, keys: Keys) -> None: ...
    def resident(self, keys: Keys) -> Mask: ...
    def pin(self, keys: Keys, values: Vectors) -> None: ...


LEVELS = ("l1", "l2", "l3", "default")


class LookupSession:
    """Looks up, inserts and refreshes embeddings of the configured models' tables."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        volatile: EmbeddingStore | None,
        persistent: EmbeddingStore | None,
        *,
        caches: Mapping[str, L1Cache] | None = None,
        cache_missed_embeddings: bool = False,
    ) -> None:
        self.models = {m.model: m for m in models}
        self.tables: dict[str, TableSpec] = {t.name: t for m in models for t in m.tables}
        self._model_of = {t.name: m for m in models for t in m.tables}
        self.volatile = volatile
        self.persistent = persistent
        self.caches: dict[str, L1Cache] = dict(caches or {})
        self.cache_missed_embeddings = cache_missed_embeddings and volatile is not None
        for spec in self.tables.values():
            for store in (volatile, persistent):
                if store is not None:
                    store.open_table(spec)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-l1")
        self._lock = threading.Lock()
        self._counts = {
            name: dict.fromkeys(("lookups", "keys", *LEVELS), 0) for name in self.tables
        }
        self._latency_s = 0.0
        self._requests = 0

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, table: str, keys: Any) -> Vectors:
        """Vectors of ``keys`` in request order, shape ``(len(keys), dim)``."""
        spec = table_or_raise(self.tables, table)
        keys = check_keys_arg(keys)
        self._check_batch(spec, keys.size)
        start = time.perf_counter()
        out = self._lookup(spec, keys)
        with self._lock:
            self._latency_s += time.perf_counter() - start
            self._requests += 1
        return out

    def lookup_request(self, model: str, keys: Any, num_keys: Any) -> Vectors:
        """HugeCTR's request shape: flat keys of all tables + keys per table → flat vectors."""
        cfg = self._model(model)
        specs = cfg.tables
        keys = check_keys_arg(keys)
        counts = np.asarray(num_keys).reshape(-1)
        if counts.dtype.kind not in "iu":
            raise ShapeError(f"{model}: keys per table must be integers, got {counts.dtype}")
        if counts.size != len(specs):
            raise ShapeError(f"{model}: {counts.size} key counts for {len(specs)} tables")
        if (counts < 0).any():
            raise ShapeError(f"{model}: negative key count in {counts.tolist()}")
        if int(counts.sum()) != keys.size:
            raise ShapeError(
                f"{model}: key counts add up to {int(counts.sum())} but {keys.size} keys were sent"
            )
        for spec, n in zip(specs, counts.tolist(), strict=True):
            self._check_batch(spec, n)
        start = time.perf_counter()
        sizes = [int(n) * s.dim for s, n in zip(specs, counts, strict=True)]
        out = np.empty(sum(sizes), dtype=np.float32)
        k_off = v_off = 0
        for spec, n, size in zip(specs, counts.tolist(), sizes, strict=True):
            out[v_off : v_off + size] = self._lookup(spec, keys[k_off : k_off + n]).ravel()
            k_off += n
            v_off += size
        with self._lock:
            self._latency_s += time.perf_counter() - start
            self._requests += 1
        return out

    def _model(self, model: str) -> ModelConfig:
        from hps.errors import UnknownTableError

        try:
            return self.models[model]
        except KeyError:
            raise UnknownTableError(
                f"unknown model {model!r}; configured: {sorted(self.models)}"
            ) from None

    @staticmethod
    def _check_batch(spec: TableSpec, n: int) -> None:
        if spec.max_keys_per_request and n > spec.max_keys_per_request:
            raise BatchTooLargeError(
                f"{spec.name}: {n} keys exceed the limit of {spec.max_keys_per_request} "
                "(max_batch_size x maxnum_catfeature_query_per_table_per_sample)"
            )

    def _lookup(self, spec: TableSpec, keys: Keys) -> Vectors:
        if keys.size == 0:
            return np.empty((0, spec.dim), dtype=np.float32)
        uniq, inverse = unique_inverse(keys)
        counts = self._counts[spec.name]
        counts["lookups"] += 1
        counts["keys"] += keys.size
        cache = self.caches.get(spec.name)
        if cache is None:
            return self._fetch_lower(spec, uniq)[inverse]
        return self._lookup_cached(spec, cache, uniq, inverse)

    def _lookup_cached(
        self, spec: TableSpec, cache: L1Cache, uniq: Keys, inverse: np.ndarray
    ) -> Vectors:
        """Rows in request order: L1 gathers the hits straight into place (one gather)."""
        values, hit = cache.query(uniq, inverse)
        n_hit = int(hit.sum())
        self._counts[spec.name]["l1"] += n_hit
        if n_hit == uniq.size:
            return values
        miss = np.flatnonzero(~hit)
        missed = uniq[miss]
        slot = np.full(uniq.size, -1, dtype=np.int64)  # unique key -> its row among the misses
        slot[miss] = np.arange(miss.size)
        at = slot[inverse]
        where = np.flatnonzero(at >= 0)  # request positions of missed keys
        model = self._model_of[spec.name]
        above = n_hit / uniq.size >= model.hit_rate_threshold
        if above and model.hps_cache.default_on_async_miss:
            values[where] = spec.default_value
            self._counts[spec.name]["default"] += miss.size
            self._background(self.prefetch, spec.name, missed)
            return values
        # A write to L1 after this version (a Kafka update) wins over what we read below.
        since = cache.version
        found = np.zeros(miss.size, dtype=bool)
        fetched = self._fetch_lower(spec, missed, found)
        values[where] = fetched[at[where]]
        if found.any():
            keys, rows = missed[found], fetched[found]
            if above:
                self._background(partial(cache.insert, since=since), keys, rows)
            else:
                cache.insert(keys, rows, since=since)
        return values

    def _fetch_lower(self, spec: TableSpec, keys: Keys, found_out: Mask | None = None) -> Vectors:
        """L2, then L3 for what L2 missed, then defaults; ``found_out`` marks L2/L3 hits."""
        counts = self._counts[spec.name]
        values: Vectors | None = None
        found = np.zeros(keys.size, dtype=bool)
        if self.volatile is not None:
            try:
                values, found = self.volatile.fetch(spec.name, keys)
            except CircuitOpenError:
                pass  # L2 failed moments ago and is skipped for a while (hps.storage.breaker)
            except BackendUnavailable as exc:
                log.warning("L2 unavailable, reading L3: %s", exc)
        if values is None:
            values = np.empty((keys.size, spec.dim), dtype=np.float32)
        counts["l2"] += int(found.sum())
        rest = np.flatnonzero(~found)
        if rest.size and self.persistent is not None:
            v3, f3 = self.persistent.fetch(spec.name, keys[rest])
            hit3 = rest[f3]
            values[hit3] = v3[f3]
            found[hit3] = True
            counts["l3"] += hit3.size
            if self.cache_missed_embeddings and hit3.size:
                self._background(self._backfill, spec.name, keys[hit3], v3[f3])
            rest = rest[~f3]
        values[rest] = spec.default_value
        counts["default"] += rest.size
        if found_out is not None:
            found_out[:] = found
        return values

    def _backfill(self, table: str, keys: Keys, values: Vectors) -> None:
        assert self.volatile is not None
        self.volatile.insert(table, keys, values)

    # -- writes and L1 maintenance -------------------------------------------------------

    def insert(self, table: str, keys: Any, values: Any, *, durable: bool = False) -> None:
        """Upsert into L3 then L2, and update the rows L1 holds."""
        spec = table_or_raise(self.tables, table)
        keys, values = check_insert(spec, keys, values)
        if self.persistent is not None:
            kw = {"durable": True} if durable else {}
            self.persistent.insert(table, keys, values, **kw)
        if self.volatile is not None:
            self.volatile.insert(table, keys, values)
        cache = self.caches.get(table)
        if cache is not None:
            cache.update(keys, values)

    def remove(self, table: str, keys: Any) -> None:
        """Delete keys from every level."""
        table_or_raise(self.tables, table)
        keys = check_keys_arg(keys)
        if self.persistent is not None:
            self.persistent.remove(table, keys)
        if self.volatile is not None:
            self.volatile.remove(table, keys)
        cache = self.caches.get(table)
        if cache is not None:
            cache.evict(keys)

    def refresh(self, table: str, keys: Any, values: Any | None = None) -> None:
        """Bring the L1 rows of ``keys`` up to date: with ``values``, or re-read from L2/L3.

        Only resident keys change; keys no lower level holds any more leave L1.
        """
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return
        if values is not None:
            keys, values = last_occurrence(*check_insert(spec, keys, values))
            cache.update(keys, values)
            return
        keys = np.unique(check_keys_arg(keys))
        keys = keys[cache.resident(keys)]
        since = cache.version
        found = np.zeros(keys.size, dtype=bool)
        fresh = self._fetch_lower(spec, keys, found)
        cache.update(keys[found], fresh[found], since=since)
        cache.evict(keys[~found])

    def catch_up(self) -> None:
        """Let a secondary L3 replay what its writer wrote since (a no-op otherwise)."""
        catch_up = getattr(self.persistent, "catch_up", None)
        if catch_up is not None:
            catch_up()

    def prefetch(self, table: str, keys: Any) -> int:
        """Load keys that are not resident from L2/L3 into L1; returns how many were loaded."""
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return 0
        keys = np.unique(check_keys_arg(keys))
        keys = keys[~cache.resident(keys)]
        since = cache.version
        found = np.zeros(keys.size, dtype=bool)
        values = self._fetch_lower(spec, keys, found)
        # force: keys asked for ahead of use must not be turned away by admission.
        cache.insert(keys[found], values[found], since=since, force=True)
        return int(found.sum())

    def warm_up(self, table: str, keys: Any, *, pin: bool = False) -> int:
        """Fill L1 with ``keys`` (the hottest first); ``pin`` makes them the static hot set."""
        if not pin:
            return self.prefetch(table, keys)
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return 0
        keys = np.unique(check_keys_arg(keys))
        found = np.zeros(keys.size, dtype=bool)
        values = self._fetch_lower(spec, keys, found)
        cache.pin(keys[found], values[found])
        return int(found.sum())

    def _background(self, fn: Any, *args: Any) -> Future[Any]:
        future = self._worker.submit(fn, *args)
        future.add_done_callback(_log_failure)
        return future

    def drain(self) -> None:
        """Wait for the background L1 work submitted so far (tests, shutdown)."""
        self._worker.submit(lambda: None).result()

    # -- introspection -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Cumulative counters: per table lookups, keys and unique keys found per level."""
        with self._lock:
            return {
                "requests": self._requests,
                "latency_s_total": self._latency_s,
                "tables": {name: dict(c) for name, c in self._counts.items()},
            }

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        for store in (self.volatile, self.persistent):
            if store is not None:
                store.close()


def _log_failure(future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None and not isinstance(exc, CircuitOpenError):
        log.warning("background L1 work failed: %s", exc)
