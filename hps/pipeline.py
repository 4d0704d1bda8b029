"""The one lookup pipeline: every lookup, of one table or of a whole Triton request.

:meth:`LookupPipeline.run` takes validated keys (what :class:`hps.LookupSession` checked at
its boundary) and the keys per table, and answers into one output buffer::

    keys of tables t0 .. tn, counts per table
      │ one float32 buffer: each table's rows at its slice, in request order
      ├─► L1 probe of every cached table, written straight into its slice (probe_l1):
      │     one compiled call for all tables (hps.cache.many) where the caches allow,
      │     else each cache's query_into (its compiled kernel, or the NumPy reference);
      │     the probe does L1's bookkeeping and counts distinct hits
      ├─► per table, the keys L1 missed (every key of a table without L1), de-duplicated
      ├─► Tiers.fetch: L2, then L3 for what L2 missed: stored rows (the table's format)
      ├─► backfill: L3 hits into L2 (cache_missed_embeddings, in the background); rows
      │     found into L1 (before returning below hit_rate_threshold, else in the background),
      │     both as stored, never re-encoded
      ├─► decoded into the buffer (``spec.fmt.decode``; float32 rows as they are); the
      │     table's float32 default for keys found nowhere
      ▼
    the buffer

Rows below the buffer are a table's stored rows (:mod:`hps.rowformat`): L1 answers float32
into the buffer itself (its kernels dequantize in the same pass as the gather), rows from
L2/L3 are decoded here, and whatever goes into L1 or L2 is the stored rows as fetched.

A single table's lookup is the same call with one table. Contract: vectors in request
order, one row per key (duplicates included); a key found nowhere gets its table's default;
a key that L2 or L3 holds never gets the default, unless the table opted into HugeCTR's
behaviour for asynchronous misses (``hps_cache.default_on_async_miss``). Counters are the
distinct keys found per level.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from types import MappingProxyType
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hps.cache.gpu_request import Fill
from hps.cache.many import answer_buffer, fill_on_gpu, one_gpu, probe_tables
from hps.config import ModelConfig
from hps.dedup import unique_inverse
from hps.errors import CircuitOpenError
from hps.rowformat import Stored
from hps.throttle import Throttled
from hps.tiers import IN_L2, IN_L3, Tiers
from hps.types import Array, Keys, Mask, TableSpec, Vectors

log = logging.getLogger(__name__)

LEVELS = ("l1", "l2", "l3", "default")
COUNTERS = ("lookups", "keys", *LEVELS)
# Bytes of the arrays that background fills wait with. Past it a new fill is dropped (it is
# only a cache: the next lookup of those keys reads L2/L3 again), so a worker that falls
# behind costs hit rate, not memory. A fill larger than the budget still runs when nothing
# waits.
MAX_BACKGROUND_BYTES = 64 << 20


class L1Cache(Protocol):
    """What the pipeline needs of an L1 cache (hps.cache.EmbeddingCache implements it).

    ``query_into`` writes float32 (dequantized) rows; ``insert``, ``update`` and ``pin``
    take the table's stored rows (:mod:`hps.rowformat`).
    """

    @property
    def version(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def query_into(self, keys: Keys, out: Vectors) -> tuple[npt.NDArray[np.int64], int]: ...
    def insert(
        self, keys: Keys, values: Stored, *, since: int | None = None, force: bool = False
    ) -> None: ...
    def update(self, keys: Keys, values: Stored, *, since: int | None = None) -> Mask: ...
    def evict(self, keys: Keys) -> None: ...
    def resident(self, keys: Keys) -> Mask: ...
    def resident_keys(self) -> Keys: ...
    def barrier(self) -> None: ...
    def pin(self, keys: Keys, values: Stored) -> None: ...
    def hold(self, keys: Keys) -> int: ...
    def release(self, hold: int) -> None: ...


# (spec, cache, first key, keys, first value) of a table probed in L1
Probed = tuple[TableSpec, L1Cache, int, int, int]


def probe_l1(
    probed: Sequence[Probed], keys: Keys, out: Array, *, out_on_device: bool = False
) -> list[tuple[npt.NDArray[np.int64], int]]:
    """L1 of every table in ``probed``, its rows written into ``out`` in request order
    (misses as zeros): one compiled call for all tables where the caches allow
    (:func:`hps.cache.many.query_tables_into`), else one ``query_into`` per cache.
    ``out_on_device``: ``out`` is on the GPU the caches share (:func:`hps.cache.many.one_gpu`).

    Returns per table the positions it missed (within its keys) and its distinct hits.
    """
    if not probed:
        return []
    bounds = np.array([(k, k + n) for _, _, k, n, _ in probed], dtype=np.int64)
    offsets = np.array([v for *_, v in probed], dtype=np.int64)
    caches, dims = [c for _, c, *_ in probed], [s.dim for s, *_ in probed]
    return probe_tables(caches, dims, keys, bounds, out, offsets, out_on_device=out_on_device)


class LookupPipeline:
    """L1 → L2 → L3 → default for the tables of ``models``, with backfill; see the module.

    Holds the caches (fixed when built), the tiers, the per-table counters and the one
    background worker that L1 and L2 backfills run on.
    """

    def __init__(
        self,
        models: Sequence[ModelConfig],
        tiers: Tiers,
        caches: Mapping[str, L1Cache],
        *,
        backfill_l2: bool = False,
    ) -> None:
        self.tiers = tiers
        self.caches: Mapping[str, L1Cache] = MappingProxyType(dict(caches))
        self.backfill_l2 = backfill_l2 and tiers.volatile is not None
        # per table: (hit_rate_threshold, default_on_async_miss) of its model
        self._async = {
            t.name: (m.hit_rate_threshold, m.hps_cache.default_on_async_miss)
            for m in models
            for t in m.tables
        }
        self.counts = {name: dict.fromkeys(COUNTERS, 0) for name in self._async}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-l1")
        self._queue_lock = threading.Lock()
        self._queued_bytes = 0
        self.dropped = 0  # background fills dropped: the worker was behind
        self._failures = Throttled(log, logging.WARNING)  # each request may repeat one

    def run(
        self, specs: Sequence[TableSpec], keys: Keys, counts: Sequence[int], *, on_gpu: bool = False
    ) -> Array:
        """Flat vectors of ``keys`` (``counts[i]`` keys for ``specs[i]``), validated.

        ``on_gpu``: when the request's tables with L1 have it on one GPU
        (:func:`hps.cache.many.one_gpu`), the vectors are answered in a buffer of that GPU
        (a CuPy array) and L1's rows never cross to the host: L1 writes them there, and the
        rows found below L1 (and those of tables without L1) go in with one copy for the
        whole request. Otherwise, and by default, a host (NumPy) buffer: where those caches
        share a GPU, its device's pinned response buffer, which L1's rows reach in one copy
        (:meth:`hps.cache.device.Device.response`).
        """
        out_size = sum(n * s.dim for s, n in zip(specs, counts, strict=True))
        probed: list[Probed] = []
        below: list[tuple[TableSpec, int, int, int]] = []  # tables without L1: (spec, k, n, v)
        k = v = 0
        for spec, n in zip(specs, counts, strict=True):
            if n:
                cache = self.caches.get(spec.name)
                if cache is None:
                    below.append((spec, k, n, v))
                else:
                    probed.append((spec, cache, k, n, v))
            k += n
            v += n * spec.dim
        gpu = one_gpu([self.caches[s.name] for s in specs if s.name in self.caches])
        out = answer_buffer(gpu, out_size, on_device=on_gpu)  # host: pinned where L1 is a GPU's
        lead = gpu if on_gpu else None
        fills: list[Fill] = []

        def place(v: int, n: int, dim: int, at: Keys | None, rows: Vectors, inv: Keys) -> None:
            """Rows ``rows[inv]`` of a table's output (``n`` rows of ``dim`` from ``v``) at
            positions ``at`` (``None``: all of them, in order)."""
            if lead is not None:
                at = np.arange(n, dtype=np.int64) if at is None else at
                fills.append(Fill(v, n, dim, at, rows[inv]))
                return
            view = out[v : v + n * dim].reshape(n, dim)
            if at is None:
                np.take(rows, inv, axis=0, out=view)
            else:
                view[at] = rows[inv]

        for spec, k, n, v in below:
            tally = self.counts[spec.name]
            tally["lookups"] += 1
            tally["keys"] += n
            uniq, inverse = unique_inverse(keys[k : k + n])
            place(v, n, spec.dim, None, self.below_l1(spec, uniq), inverse)
        answers = probe_l1(probed, keys, out, out_on_device=lead is not None)
        for (spec, cache, k, n, v), (miss_pos, n_hit) in zip(probed, answers, strict=True):
            tally = self.counts[spec.name]
            tally["lookups"] += 1
            tally["keys"] += n
            tally["l1"] += n_hit
            if miss_pos.size:
                missed, inverse = unique_inverse(keys[k : k + n][miss_pos])
                rows = self._l1_misses(spec, cache, missed, n_hit)
                place(v, n, spec.dim, miss_pos, rows, inverse)
        if lead is not None:
            fill_on_gpu(lead, out, fills)
        return out

    def _l1_misses(self, spec: TableSpec, cache: L1Cache, missed: Keys, n_hit: int) -> Vectors:
        """Rows of the distinct keys L1 missed (``n_hit`` distinct keys hit), and L1's share.

        At or above the model's ``hit_rate_threshold`` L1 takes the rows in the background
        (with ``default_on_async_miss``: the defaults are served and the keys prefetched);
        below it, before the request returns.
        """
        threshold, default_on_async = self._async[spec.name]
        above = n_hit / (n_hit + missed.size) >= threshold
        if above and default_on_async:
            self.counts[spec.name]["default"] += missed.size
            self.background("L1 prefetch", self.prefetch, spec, missed)
            return spec.default_vectors(missed.size)
        since = cache.version  # a write to L1 after this (a Kafka update) wins over our rows
        stored, found = self.fetch_rows(spec, missed)
        if found.any():
            rows_in, rows = missed[found], stored[found]  # copies: safe to hand over
            if above:
                self.background("L1 fill", partial(cache.insert, since=since), rows_in, rows)
            else:
                cache.insert(rows_in, rows, since=since)
        return self.decode(spec, stored, found)

    def fetch_rows(
        self,
        spec: TableSpec,
        keys: Keys,
        before_l3: Callable[[], None] | None = None,
        *,
        counted: bool = True,
        unread_out: Mask | None = None,
    ) -> tuple[Stored, Mask]:
        """Stored rows of distinct ``keys`` from L2, then L3, and where each was found,
        counted unless ``counted`` is False (a warm-up, a prefetch, a refresh: not a request's
        keys, which the hit rates are of); keys found nowhere count as defaults, their rows
        unspecified. L3 hits go to L2 as they are, in the background (``backfill_l2``),
        except keys this process wrote to L2 after the read (:meth:`hps.tiers.Tiers.backfill`).
        ``before_l3``: see :meth:`hps.tiers.Tiers.fetch`; ``unread_out`` marks the keys no
        tier could say anything of (:attr:`hps.tiers.Fetched.unread`)."""
        # a write to L2 by this process after this (an update, a delete) wins over our rows
        l2_since = self.tiers.l2_token() if self.backfill_l2 else None
        got = self.tiers.fetch(spec, keys, before_l3=before_l3)
        if unread_out is not None:
            unread_out[:] = got.unread
        stored, level = got.values, got.level
        in_l3 = level == IN_L3
        found = got.found
        if counted:
            tally = self.counts[spec.name]
            tally["l2"] += int(np.count_nonzero(level == IN_L2))
            tally["l3"] += int(np.count_nonzero(in_l3))
            tally["default"] += int(keys.size - np.count_nonzero(found))
        if self.backfill_l2 and in_l3.any():
            self.background(
                "L2 backfill",
                partial(self.tiers.backfill, since=l2_since),
                spec.name,
                keys[in_l3],
                stored[in_l3],
            )
        return stored, found

    @staticmethod
    def decode(spec: TableSpec, stored: Stored, found: Mask) -> Vectors:
        """float32 rows of ``stored`` (the same array for a float32 table), the table's
        default where not ``found``."""
        values = spec.fmt.decode(stored, spec.dim)
        values[~found] = spec.default_value
        return values

    def below_l1(
        self,
        spec: TableSpec,
        keys: Keys,
        found_out: Mask | None = None,
        before_l3: Callable[[], None] | None = None,
    ) -> Vectors:
        """float32 rows of distinct ``keys`` from L2, then L3, else the table's default
        (:meth:`fetch_rows`, decoded); ``found_out`` marks L2/L3 hits."""
        stored, found = self.fetch_rows(spec, keys, before_l3)
        if found_out is not None:
            found_out[:] = found
        return self.decode(spec, stored, found)

    def prefetch(self, spec: TableSpec, keys: Keys) -> int:
        """Load the distinct ``keys`` that L1 does not hold from L2/L3; how many were loaded."""
        cache = self.caches.get(spec.name)
        if cache is None:
            return 0
        keys = keys[~cache.resident(keys)]
        since = cache.version
        stored, found = self.fetch_rows(spec, keys, counted=False)
        # force: keys asked for ahead of use must not be turned away by admission.
        cache.insert(keys[found], stored[found], since=since, force=True)
        return int(found.sum())

    def background(
        self, what: str, fn: Callable[..., object], *args: object
    ) -> Future[object] | None:
        """Run ``fn(*args)`` (``what``: its name in a failure's warning) on the one
        background worker (L1 inserts, backfills), unless the fills already waiting hold
        ``MAX_BACKGROUND_BYTES`` (then None: dropped)."""
        size = sum(a.nbytes for a in args if isinstance(a, np.ndarray))
        with self._queue_lock:
            if self._queued_bytes and self._queued_bytes + size > MAX_BACKGROUND_BYTES:
                self.dropped += 1
                return None
            self._queued_bytes += size
        future = self._worker.submit(fn, *args)
        future.add_done_callback(partial(self._done, what, size))
        return future

    def _done(self, what: str, size: int, future: Future[object]) -> None:
        with self._queue_lock:
            self._queued_bytes -= size
        exc = future.exception()
        if exc is not None and not isinstance(exc, CircuitOpenError):
            self._failures(what, "background %s failed: %s", what, exc)

    def drain(self) -> None:
        """Wait for the background work submitted so far."""
        self._worker.submit(lambda: None).result()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
