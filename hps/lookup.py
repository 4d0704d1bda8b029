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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hps.config import ModelConfig
from hps.dedup import unique_inverse
from hps.errors import BatchTooLargeError, CircuitOpenError, ShapeError, UnknownTableError
from hps.tiers import IN_L2, IN_L3, Tiers
from hps.types import Keys, Mask, TableSpec, Vectors
from hps.validate import as_keys, as_rows, table_or_raise

log = logging.getLogger(__name__)


class L1Cache(Protocol):
    """What the session needs of an L1 cache (hps.cache.EmbeddingCache implements it)."""

    @property
    def version(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def query(
        self, keys: Keys, inverse: npt.NDArray[np.intp] | None = None
    ) -> tuple[Vectors, Mask]: ...
    def insert(
        self, keys: Keys, values: Vectors, *, since: int | None = None, force: bool = False
    ) -> None: ...
    def update(self, keys: Keys, values: Vectors, *, since: int | None = None) -> Mask: ...
    def evict(self, keys: Keys) -> None: ...
    def resident(self, keys: Keys) -> Mask: ...
    def pin(self, keys: Keys, values: Vectors) -> None: ...
    def query_into(self, keys: Keys, out: Vectors) -> tuple[np.ndarray, int]: ...


class RequestLookup(Protocol):
    """A whole-request lookup installed by build_session (hps.fused.FusedLookup)."""

    def lookup(self, specs: Sequence[TableSpec], keys: Keys, counts: list[int]) -> Vectors: ...


LEVELS = ("l1", "l2", "l3", "default")


class LookupSession:
    """Looks up, inserts and refreshes embeddings of the configured models' tables."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        tiers: Tiers,
        *,
        caches: Mapping[str, L1Cache] | None = None,
        cache_missed_embeddings: bool = False,
    ) -> None:
        self.models = {m.model: m for m in models}
        self.tables: dict[str, TableSpec] = {t.name: t for m in models for t in m.tables}
        self._model_of = {t.name: m for m in models for t in m.tables}
        self._specs = {m.model: m.tables for m in models}  # ModelConfig.tables builds anew
        self._limits = {  # keys per request of each table of a model (0: unlimited)
            name: np.array([t.max_keys_per_request for t in specs], dtype=np.int64)
            for name, specs in self._specs.items()
        }
        self.tiers = tiers
        self.caches: dict[str, L1Cache] = dict(caches or {})
        self.cache_missed_embeddings = cache_missed_embeddings and tiers.volatile is not None
        tiers.open_tables(self.tables.values())
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-l1")
        self._lock = threading.Lock()
        self._counts = {
            name: dict.fromkeys(("lookups", "keys", *LEVELS), 0) for name in self.tables
        }
        self._latency_s = 0.0
        self._requests = 0
        # ps.json fuse_embedding_table: build_session installs hps.fused.FusedLookup.
        self.fused: RequestLookup | None = None

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, table: str, keys: npt.ArrayLike) -> Vectors:
        """Vectors of ``keys`` in request order, shape ``(len(keys), dim)``."""
        spec = table_or_raise(self.tables, table)
        keys = as_keys(keys)
        self._check_batch(spec, keys.size)
        start = time.perf_counter()
        out = self._lookup(spec, keys)
        with self._lock:
            self._latency_s += time.perf_counter() - start
            self._requests += 1
        return out

    def lookup_request(self, model: str, keys: npt.ArrayLike, num_keys: npt.ArrayLike) -> Vectors:
        """HugeCTR's request shape: flat keys of all tables + keys per table → flat vectors."""
        cfg = self._model(model)
        specs = self._specs[cfg.model]
        keys = as_keys(keys)
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
        limits = self._limits[cfg.model]
        over = (limits > 0) & (counts > limits)
        if over.any():
            i = int(np.argmax(over))
            self._check_batch(specs[i], int(counts[i]))
        start = time.perf_counter()
        sizes = counts.tolist()
        if self.fused is not None:
            out = self.fused.lookup(specs, keys, sizes)
        else:
            out = self._lookup_tables(specs, keys, sizes)
        with self._lock:
            self._latency_s += time.perf_counter() - start
            self._requests += 1
        return out

    def _lookup_tables(self, specs: Sequence[TableSpec], keys: Keys, counts: list[int]) -> Vectors:
        """The reference path of lookup_request: one table at a time."""
        sizes = [n * s.dim for s, n in zip(specs, counts, strict=True)]
        out = np.empty(sum(sizes), dtype=np.float32)
        k_off = v_off = 0
        for spec, n, size in zip(specs, counts, sizes, strict=True):
            out[v_off : v_off + size] = self._lookup(spec, keys[k_off : k_off + n]).ravel()
            k_off += n
            v_off += size
        return out

    def _model(self, model: str) -> ModelConfig:
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
        self, spec: TableSpec, cache: L1Cache, uniq: Keys, inverse: npt.NDArray[np.intp]
    ) -> Vectors:
        """Rows in request order: L1 gathers the hits straight into place (one gather)."""
        values, hit = cache.query(uniq, inverse)
        n_hit = int(hit.sum())
        self._counts[spec.name]["l1"] += n_hit
        if n_hit == uniq.size:
            return values
        miss = np.flatnonzero(~hit)
        slot = np.full(uniq.size, -1, dtype=np.int64)  # unique key -> its row among the misses
        slot[miss] = np.arange(miss.size)
        at = slot[inverse]
        where = np.flatnonzero(at >= 0)  # request positions of missed keys
        values[where] = self.miss_rows(spec, cache, uniq[miss], n_hit)[at[where]]
        return values

    def miss_rows(
        self, spec: TableSpec, cache: L1Cache | None, missed: Keys, n_hit: int
    ) -> Vectors:
        """Rows of the distinct keys L1 missed (``n_hit`` distinct keys hit): L2 → L3 → default.

        At or above the model's ``hit_rate_threshold`` L1 takes the rows in the background
        (with ``default_on_async_miss``: the defaults are served and the keys prefetched);
        below it, before the request returns. Both lookup paths (per table and fused) use it.
        """
        if cache is None:
            return self._fetch_lower(spec, missed)
        model = self._model_of[spec.name]
        above = n_hit / (n_hit + missed.size) >= model.hit_rate_threshold
        if above and model.hps_cache.default_on_async_miss:
            self._counts[spec.name]["default"] += missed.size
            self._background(self.prefetch, spec.name, missed)
            return spec.default_vectors(missed.size)
        # A write to L1 after this version (a Kafka update) wins over what we read below.
        since = cache.version
        found = np.zeros(missed.size, dtype=bool)
        fetched = self._fetch_lower(spec, missed, found)
        if found.any():
            keys, rows = missed[found], fetched[found]
            if above:
                self._background(partial(cache.insert, since=since), keys, rows)
            else:
                cache.insert(keys, rows, since=since)
        return fetched

    def count(self, table: str, **increments: int) -> None:
        """Add to a table's counters: ``lookups``, ``keys``, ``l1``, ``l2``, ``l3``, ``default``."""
        tally = self._counts[table]
        for name, n in increments.items():
            tally[name] += n

    def _fetch_lower(
        self,
        spec: TableSpec,
        keys: Keys,
        found_out: Mask | None = None,
        before_l3: Callable[[], None] | None = None,
    ) -> Vectors:
        """L2, then L3 for what L2 missed, then defaults; ``found_out`` marks L2/L3 hits."""
        counts = self._counts[spec.name]
        got = self.tiers.fetch(spec, keys, before_l3=before_l3)
        values, level = got.values, got.level
        in_l3 = level == IN_L3
        counts["l2"] += int(np.count_nonzero(level == IN_L2))
        counts["l3"] += int(np.count_nonzero(in_l3))
        found = got.found
        values[~found] = spec.default_value
        counts["default"] += int(keys.size - np.count_nonzero(found))
        if self.cache_missed_embeddings and in_l3.any():
            self._background(self.tiers.backfill, spec.name, keys[in_l3], values[in_l3])
        if found_out is not None:
            found_out[:] = found
        return values


    # -- writes and L1 maintenance -------------------------------------------------------

    def insert(
        self, table: str, keys: npt.ArrayLike, values: npt.ArrayLike, *, durable: bool = False
    ) -> None:
        """Upsert into L3 then L2, and update the rows L1 holds."""
        spec = table_or_raise(self.tables, table)
        keys, values = as_rows(spec, keys, values)
        self.tiers.write(table, keys, values, durable=durable)
        cache = self.caches.get(table)
        if cache is not None:
            cache.update(keys, values)

    def remove(self, table: str, keys: npt.ArrayLike) -> None:
        """Delete keys from every level."""
        table_or_raise(self.tables, table)
        keys = as_keys(keys)
        self.tiers.remove(table, keys)
        cache = self.caches.get(table)
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
        """Bring the L1 rows of ``keys`` up to date: with ``values``, or re-read from L2/L3
        (``before_l3``: see :meth:`hps.tiers.Tiers.fetch`).

        Only resident keys change; keys no lower level holds any more leave L1.
        """
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return
        if values is not None:
            cache.update(*as_rows(spec, keys, values))  # the cache keeps a key's last row
            return
        keys = np.unique(as_keys(keys))
        keys = keys[cache.resident(keys)]
        since = cache.version
        found = np.zeros(keys.size, dtype=bool)
        fresh = self._fetch_lower(spec, keys, found, before_l3)
        cache.update(keys[found], fresh[found], since=since)
        cache.evict(keys[~found])

    def prefetch(self, table: str, keys: npt.ArrayLike) -> int:
        """Load keys that are not resident from L2/L3 into L1; returns how many were loaded."""
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return 0
        keys = np.unique(as_keys(keys))
        keys = keys[~cache.resident(keys)]
        since = cache.version
        found = np.zeros(keys.size, dtype=bool)
        values = self._fetch_lower(spec, keys, found)
        # force: keys asked for ahead of use must not be turned away by admission.
        cache.insert(keys[found], values[found], since=since, force=True)
        return int(found.sum())

    def warm_up(self, table: str, keys: npt.ArrayLike, *, pin: bool = False) -> int:
        """Fill L1 with ``keys`` (the hottest first); ``pin`` makes them the static hot set."""
        if not pin:
            return self.prefetch(table, keys)
        spec = table_or_raise(self.tables, table)
        cache = self.caches.get(table)
        if cache is None:
            return 0
        keys = np.unique(as_keys(keys))
        found = np.zeros(keys.size, dtype=bool)
        values = self._fetch_lower(spec, keys, found)
        cache.pin(keys[found], values[found])
        return int(found.sum())

    def _background(self, fn: Callable[..., object], *args: object) -> Future[object]:
        future = self._worker.submit(fn, *args)
        future.add_done_callback(_log_failure)
        return future

    def drain(self) -> None:
        """Wait for the background L1 work submitted so far (tests, shutdown)."""
        self._worker.submit(lambda: None).result()

    # -- introspection -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:  # JSON-shaped counters
        """Cumulative counters: per table lookups, keys and unique keys found per level."""
        with self._lock:
            return {
                "requests": self._requests,
                "latency_s_total": self._latency_s,
                "tables": {name: dict(c) for name, c in self._counts.items()},
            }

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.tiers.close()


def _log_failure(future: Future[object]) -> None:
    exc = future.exception()
    if exc is not None and not isinstance(exc, CircuitOpenError):
        log.warning("background L1 work failed: %s", exc)
