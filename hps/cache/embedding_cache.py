"""EmbeddingCache: the L1 cache of one table on one device, written once against ``xp``.

Its rows live in a :class:`hps.cache.rows.RowStore` (an open-addressing index sized for all
``capacity`` keys over a ``capacity x width`` arena); this class adds the eviction policy, the
static hot set, the lock and the write log. Every operation takes a whole batch: keys cross
host→device once, vectors device→host once, and everything else runs as a few array
operations.

Because the index holds all ``capacity`` keys, a cache at least as large as the working set
holds all of it: a 100% hit rate, which HugeCTR's set-associative cache could not reach
(HugeCTR issue 278).

Rows are kept in the table's :class:`hps.rowformat.RowFormat` (``fmt``): :meth:`insert`,
:meth:`update` and :meth:`pin` take stored rows (``(n, fmt.width(dim))`` of ``fmt.dtype``,
anything else is refused) and :meth:`dump` returns them; :meth:`query` and :meth:`query_into`
answer float32 ``(n, dim)`` rows, dequantized by the kernel as it gathers
(:mod:`hps.cache.kernels`) or, on the NumPy reference path, by ``fmt.decode``.

Thread safety: one lock around each operation. A lookup on the request thread and inserts,
updates or refreshes on a background worker never see a half-written row.

Staleness: a background insert carries vectors read from L2/L3 some time ago. Pass
``since=cache.version`` (read before that L2/L3 read) to :meth:`insert` / :meth:`update`, and
keys written by any other operation after that version are skipped, so an older read never
overwrites a newer write (:mod:`hps.cache.writelog`). Keys under :meth:`hold` (an update
seen before L2/L3 hold it) count as just written until :meth:`release`.
"""

from __future__ import annotations

import threading

import numpy as np
import numpy.typing as npt

from hps.cache import kernels
from hps.cache.gpu_rows import RowKernels
from hps.cache.kernels_cupy import GpuProbe
from hps.cache.placement import Placement, pinned_rows
from hps.cache.policies import WINDOW_PER_ROW, Policy, make_policy, policy_nbytes
from hps.cache.rows import RowStore, rows_nbytes
from hps.cache.writelog import WriteLog, log_limit, writelog_nbytes
from hps.cache.xp import device_scope, to_host, to_xp
from hps.dedup import unique_inverse
from hps.errors import DTypeError, ShapeError
from hps.index import TOMBSTONE
from hps.rowformat import FLOAT32, RowFormat, Stored
from hps.types import Array, ArrayModule, Keys, Mask, Vectors

RESIDENT_CHUNK = 1 << 16  # arena rows :meth:`EmbeddingCache.resident_keys` reads per lock hold


def cache_nbytes(capacity: int, dim: int, policy: str = "lru", fmt: RowFormat = FLOAT32) -> int:
    """Exact bytes an EmbeddingCache of this shape allocates (``hps plan`` uses it): rows,
    index, policy state and the write log's rings (held keys aside)."""
    return (
        rows_nbytes(capacity, dim, fmt)
        + policy_nbytes(policy, capacity)
        + writelog_nbytes(log_limit(capacity))
    )


def _host_keys(keys: npt.ArrayLike) -> Keys:
    arr = np.asarray(keys)
    if arr.dtype != np.int64:
        raise DTypeError(f"L1 cache: keys must be int64, got {arr.dtype}")
    return arr.reshape(-1)


class EmbeddingCache:
    """int64 keys → rows stored as ``fmt`` (float32[dim] by default), answered as float32,
    at most ``capacity`` of them, evicted by ``policy``."""

    def __init__(
        self,
        dim: int,
        capacity: int,
        *,
        xp: ArrayModule = np,
        policy: str = "lru",
        static_fraction: float = 0.5,
        frequency_window: int | None = None,
        name: str = "",
        device_id: int | None = None,
        fmt: RowFormat = FLOAT32,
    ) -> None:
        if capacity < 1 or dim < 1:
            raise ValueError(f"L1 cache needs capacity >= 1 and dim >= 1, got {capacity}, {dim}")
        self.name = name
        self.dim = dim
        self.fmt = fmt
        self.width = fmt.width(dim)  # stored elements per row
        self.capacity = capacity
        self.xp = xp
        self.max_pinned = pinned_rows(static_fraction, capacity)
        self.device_id = device_id
        self._scope = device_scope(xp, device_id)
        self._stats = dict.fromkeys(
            ("queries", "hits", "misses", "inserts", "evictions", "rejected", "updates"), 0
        )
        window = WINDOW_PER_ROW * capacity if frequency_window is None else frequency_window
        with self._scope:  # every array of the cache on its GPU, whichever one is current
            self._rows = RowStore(capacity, dim, xp, fmt)
            self.policy: Policy = make_policy(policy, capacity, self._rows.ticks, xp, window)
            self._log = WriteLog(xp, log_limit(capacity))
            self._no_keys = xp.zeros(0, dtype=xp.int64)
        self._placement = Placement(self._rows, self.policy, xp, self.max_pinned, self._stats)
        self._tick = 0
        self._lock = threading.RLock()
        self._kernel = kernels.kernel_for(xp, device_id)
        if isinstance(self._kernel, GpuProbe):  # lookups and writes as kernels too
            self._rows.ops = RowKernels(self._kernel.device)
        self._desc = kernels.CacheDescriptor()

    def _count(self, hits: int, misses: int) -> None:
        self._stats["queries"] += 1
        self._stats["hits"] += hits
        self._stats["misses"] += misses

    # -- introspection -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        """Bytes allocated: rows, index, policy state, write log (:func:`cache_nbytes`)."""
        return self._rows.nbytes + self.policy.nbytes + self._log.nbytes

    @property
    def version(self) -> int:
        """Increases with every write; pass it back as ``since`` (see the module docstring)."""
        return self._log.version

    @property
    def n_pinned(self) -> int:
        with self._lock, self._scope:
            return int(self._rows.pinned.sum())

    def stats(self) -> dict[str, int | str]:
        with self._lock, self._scope:
            return {
                **self._stats,
                "size": len(self),
                "capacity": self.capacity,
                "pinned": int(self._rows.pinned.sum()),
                "policy": self.policy.name,
                "row_dtype": self.fmt.name,
                "device": self.xp.__name__,
                "nbytes": self.nbytes,
            }

    # -- reads ---------------------------------------------------------------------------

    def query(
        self, keys: Keys, inverse: Array | None = None, *, counts: Array | None = None
    ) -> tuple[Vectors, Mask]:
        """Rows of unique ``keys`` and their hit mask (host arrays); missed rows are zeros.

        With ``inverse`` (``np.unique``'s, mapping request positions to ``keys``) the rows
        come back already in request order, ``len(inverse)`` of them, in one gather; the
        hit mask still describes ``keys``. ``lfu`` and ``frequency`` count every access of
        the request: from ``inverse``, or from ``counts`` (accesses per key) when the rows
        are wanted per unique key.
        """
        keys = _host_keys(keys)
        if counts is not None and np.shape(counts) != keys.shape:
            raise ShapeError(f"L1 {self.name}: {np.shape(counts)} counts for {keys.size} keys")
        xp = self.xp
        with self._lock, self._scope:
            kd = to_xp(xp, keys)
            rows = self._rows.lookup(kd)
            hit = rows >= 0
            n_hit = int(xp.count_nonzero(hit))
            all_hit = n_hit == keys.size
            idx = rows if all_hit else xp.where(hit, rows, 0)
            inv = None if inverse is None else to_xp(xp, np.asarray(inverse).reshape(-1))
            if inv is not None:
                idx = idx[inv]
            out = self._rows.values.take(idx, axis=0)  # stored rows
            if not all_hit:
                out[~(hit if inv is None else hit[inv])] = 0  # all-zero bytes decode to 0.0
            self._tick += 1
            self._rows.ticks[rows if all_hit else rows[hit]] = self._tick
            if not self.policy.counts_accesses:
                counts = None
            elif counts is not None:
                counts = to_xp(xp, np.asarray(counts).reshape(-1))
            elif inv is not None:
                counts = xp.bincount(inv, minlength=keys.size)
            if self.policy.on_query(kd, rows, hit, counts):
                self._placement.new_window(self._tick)
            self._count(n_hit, keys.size - n_hit)
            return self.fmt.decode(to_host(out), self.dim), to_host(hit)

    def query_into(self, keys: Keys, out: np.ndarray) -> tuple[np.ndarray, int]:
        """Rows of ``keys`` (duplicates allowed) written into ``out[len(keys), dim]`` in order
        (float32, C-contiguous).

        Returns the positions of the misses (their rows are zeros) and the number of
        distinct keys hit. The cache ends up exactly as after ``query(uniq, inverse)`` of the
        de-duplicated keys (ticks, counts, sketch, window, stats). With a compiled kernel
        (:mod:`hps.cache.kernels`) it is one pass over the keys; without, it is that query.
        """
        keys = np.ascontiguousarray(_host_keys(keys))
        if out.shape != (keys.size, self.dim) or out.dtype != np.float32:
            raise ShapeError(f"L1 {self.name}: output {out.shape} {out.dtype} for {keys.size} keys")
        if not out.flags.c_contiguous:  # the GPU copies the rows into it as one block
            raise ShapeError(f"L1 {self.name}: the output must be C-contiguous")
        if self._kernel is None:
            uniq, inverse = unique_inverse(keys)
            values, hit = self.query(uniq, inverse)
            out[...] = values
            return np.flatnonzero(~hit[inverse]), int(hit.sum())
        with self._lock, self._scope:
            self._tick += 1
            access = self.policy.access_counts()
            counts, cap = access if access is not None else (None, 0)
            miss_pos, n_hit = self._kernel(self._rows, keys, out, self._tick, counts, cap)
            self._after_probe(keys, miss_pos, n_hit)
            return miss_pos, n_hit

    @property
    def takes_descriptor(self) -> bool:
        """Whether :func:`hps.cache.many.query_tables_into` can probe it (compiled: the
        CPU kernel on NumPy, the GPU kernel on a device)."""
        return self._kernel is not None and (self.xp is np or isinstance(self._kernel, GpuProbe))

    def _descriptor(self) -> np.ndarray:
        """This cache's row for the many-table kernel, for a new query's tick (the caller
        holds the lock until the kernel has run)."""
        access = self.policy.access_counts()
        counts, cap = access if access is not None else (None, kernels.COUNT_CAP_NONE)
        self._tick += 1
        return self._desc.row(self._rows, counts, cap, self._tick)

    def _after_probe(self, keys: np.ndarray, miss_pos: np.ndarray, n_hit: int) -> None:
        """The policy and the counters after a compiled probe of ``keys`` (lock held)."""
        missed, times = self._no_keys, self._no_keys
        if miss_pos.size:
            unique_missed, n_times = np.unique(keys[miss_pos], return_counts=True)
            missed, times = to_xp(self.xp, unique_missed), to_xp(self.xp, n_times)
        if self.policy.on_misses(missed, times, keys.size):
            self._placement.new_window(self._tick)
        self._count(n_hit, int(missed.size))

    def resident(self, keys: Keys) -> Mask:
        keys = _host_keys(keys)
        with self._lock, self._scope:
            return to_host(self._rows.lookup(to_xp(self.xp, keys)) >= 0)

    def resident_keys(self) -> Keys:
        """The resident keys, ``RESIDENT_CHUNK`` rows of the arena per lock hold (the whole
        arena at once held the lock 25.6 ms at 8 M rows).

        Not one atomic snapshot: a key resident throughout the call is in it (a key keeps
        its row while resident); one written or evicted meanwhile may or may not be. For an
        atomic "drop everything" there is :meth:`clear`."""
        out = np.empty(self.capacity, dtype=np.int64)
        n = 0
        for lo in range(0, self.capacity, RESIDENT_CHUNK):
            with self._lock, self._scope:
                n += self._rows.resident_into(lo, lo + RESIDENT_CHUNK, out[n:])
        return out[:n]

    def pinned_keys(self) -> Keys:
        with self._lock, self._scope:
            return to_host(self._rows.row_keys[self._rows.pinned])

    def dump(self) -> tuple[Keys, Stored]:
        """All resident keys and their stored rows (host arrays, the cache's format)."""
        with self._lock, self._scope:
            rows = self.xp.flatnonzero(self._rows.occupied())
            return to_host(self._rows.row_keys[rows]), to_host(self._rows.values[rows])

    # -- writes --------------------------------------------------------------------------

    def insert(
        self, keys: Keys, values: Stored, *, since: int | None = None, force: bool = False
    ) -> None:
        """Upsert stored rows; evicts by policy when full, never a pinned row.

        With more new keys than there is room for, what fits is kept by policy; the
        ``frequency`` policy also turns away keys asked for less often than the rows they
        would evict, unless ``force`` (prefetch, warm-up). Reserved keys (the two smallest
        int64 values) are not cacheable and are skipped.
        """
        keys, values = self._batch(keys, values)
        with self._lock, self._scope:
            self._insert(keys, values, since=since, force=force)

    def _insert(self, keys: Keys, values: Stored, *, since: int | None, force: bool) -> Array:
        """Insert under the lock; returns the rows now holding ``keys`` (-1: not admitted)."""
        kd = to_xp(self.xp, keys)
        ok = kd > TOMBSTONE
        if since is not None:
            ok &= ~self._log.since(kd, since)
        self._tick += 1
        rows = self._placement.upsert(kd, to_xp(self.xp, values), ok, force, self._tick)
        self._log.record(kd[rows >= 0])
        return rows

    def update(self, keys: Keys, values: Stored, *, since: int | None = None) -> Mask:
        """Overwrite the stored rows of keys already resident; returns which were updated."""
        keys, values = self._batch(keys, values)
        xp = self.xp
        with self._lock, self._scope:
            kd = to_xp(xp, keys)
            allow = None if since is None else ~self._log.since(kd, since)
            rows = self._rows.overwrite(kd, to_xp(xp, values), allow, None)
            hit = rows >= 0 if allow is None else allow & (rows >= 0)
            self._log.record(kd)
            self._stats["updates"] += int(hit.sum())
            return to_host(hit)

    def evict(self, keys: Keys) -> None:
        """Drop keys (pinned ones too: this is an explicit removal, not a policy choice)."""
        keys = np.unique(_host_keys(keys))
        with self._lock, self._scope:
            kd = to_xp(self.xp, keys)
            rows = self._rows.lookup(kd)
            self._placement.evict_rows(rows[rows >= 0])
            self._log.record(kd)

    def hold(self, keys: Keys) -> int:
        """Keep ``keys`` out of ``since`` writes (fills from L2/L3) until :meth:`release`:
        for an update this process has seen before L2/L3 hold it (see the module docstring).
        Resident keys stay resident and take writes without ``since``."""
        keys = _host_keys(keys)
        with self._lock, self._scope:
            return self._log.hold(to_xp(self.xp, keys))

    def release(self, hold: int) -> None:
        """End a :meth:`hold`: L2/L3 hold the update; fills that read them earlier still
        lose."""
        with self._lock, self._scope:
            self._log.release(hold)

    @property
    def held(self) -> int:
        """Keys under :meth:`hold` now."""
        with self._lock:
            return self._log.held

    def pin(self, keys: Keys, values: Stored) -> None:
        """Upsert ``keys`` (stored rows) and add them to the static hot set, hottest first.

        The pinned set holds at most ``max_pinned`` rows (``static_fraction x capacity``,
        a sixteenth of the rows always left out: :func:`hps.cache.placement.pinned_rows`);
        keys past that are inserted as ordinary rows. Pinned rows are never evicted by policy.
        """
        keys, values = self._batch(keys, values)
        with self._lock, self._scope:
            self._placement.pin(self._insert(keys, values, since=None, force=True))

    def barrier(self) -> None:
        """Drop every later ``since`` write (insert or update) whose token was read before
        this call, whatever its keys; resident rows stay. For a change that names no keys (a
        whole table re-imported, a journal resync): call it once L2/L3 hold the change and
        before listing the resident keys to re-read or evict, so that a fill whose read came
        before the change, and which lands after the listing, is not kept."""
        with self._lock, self._scope:
            self._log.clear()

    def clear(self) -> None:
        with self._lock, self._scope:
            self._rows.clear()
            self.policy.clear()
            self._log.clear()

    # -- internals -----------------------------------------------------------------------

    def _batch(self, keys: npt.ArrayLike, values: npt.ArrayLike) -> tuple[Keys, Stored]:
        """Unique keys with their stored rows (the last of a duplicate), checked: rows of
        another dtype or width are refused, never converted (they would be another format)."""
        from hps.dedup import last_occurrence

        keys = _host_keys(keys)
        vals = np.asarray(values)
        fmt = self.fmt
        if vals.dtype != fmt.dtype:
            raise DTypeError(
                f"L1 cache {self.name}: {fmt.name} rows are stored as {fmt.dtype} "
                f"({keys.size}, {self.width}), got {vals.dtype} (encode with the table's "
                "RowFormat)"
            )
        if vals.ndim != 2 or vals.shape != (keys.size, self.width):
            raise ShapeError(
                f"L1 cache {self.name}: expected {fmt.name} rows ({keys.size}, {self.width}) "
                f"of {fmt.dtype} (dim {self.dim}), got {vals.shape}"
            )
        return last_occurrence(keys, vals)
