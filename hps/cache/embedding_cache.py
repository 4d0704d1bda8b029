"""EmbeddingCache: the L1 cache of one table on one device, written once against ``xp``.

Its rows live in a :class:`hps.cache.rows.RowStore` (an open-addressing index sized for all
``capacity`` keys over a ``capacity x dim`` arena); this class adds the eviction policy, the
static hot set, the lock and the write log. Every operation takes a whole batch: keys cross
host→device once, vectors device→host once, and everything else runs as a few array
operations.

Because the index holds all ``capacity`` keys, a cache at least as large as the working set
holds all of it: a 100% hit rate, which HugeCTR's set-associative cache could not reach
(HugeCTR issue 278).

Thread safety: one lock around each operation. A lookup on the request thread and inserts,
updates or refreshes on a background worker never see a half-written row.

Staleness: a background insert carries vectors read from L2/L3 some time ago. Pass
``since=cache.version`` (read before that L2/L3 read) to :meth:`insert` / :meth:`update`, and
keys written by any other operation after that version are skipped, so an older read never
overwrites a newer write (:mod:`hps.cache.writelog`).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import numpy as np

from hps.cache import kernels
from hps.cache.policies import WINDOW_PER_ROW, Policy, make_policy, policy_nbytes
from hps.cache.rows import RowStore, rows_nbytes
from hps.cache.writelog import WriteLog
from hps.cache.xp import device_scope, to_host, to_xp
from hps.dedup import unique_inverse
from hps.errors import DTypeError, ShapeError
from hps.index import TOMBSTONE
from hps.types import Keys, Mask, Vectors


def cache_nbytes(capacity: int, dim: int, policy: str = "lru") -> int:
    """Exact bytes an EmbeddingCache of this shape allocates (``hps plan`` uses it)."""
    return rows_nbytes(capacity, dim) + policy_nbytes(policy, capacity)


def _host_keys(keys: Any) -> Keys:
    arr = np.asarray(keys)
    if arr.dtype != np.int64:
        raise DTypeError(f"L1 cache: keys must be int64, got {arr.dtype}")
    return arr.reshape(-1)


class EmbeddingCache:
    """int64 keys → float32[dim] rows, at most ``capacity`` of them, evicted by ``policy``."""

    def __init__(
        self,
        dim: int,
        capacity: int,
        *,
        xp: ModuleType = np,
        policy: str = "lru",
        static_fraction: float = 0.5,
        frequency_window: int | None = None,
        name: str = "",
        device_id: int | None = None,
    ) -> None:
        if capacity < 1 or dim < 1:
            raise ValueError(f"L1 cache needs capacity >= 1 and dim >= 1, got {capacity}, {dim}")
        self.name = name
        self.dim = dim
        self.capacity = capacity
        self.xp = xp
        self.max_pinned = int(static_fraction * capacity)
        self.device_id = device_id
        self._scope = device_scope(xp, device_id)
        with self._scope:
            self._alloc(policy, frequency_window)
        self._lock = threading.RLock()
        self._log = WriteLog(xp, max(1 << 16, capacity))
        self._stats = dict.fromkeys(
            ("queries", "hits", "misses", "inserts", "evictions", "rejected", "updates"), 0
        )
        self._kernel = kernels.kernel_for(xp)
        self._no_keys = xp.zeros(0, dtype=xp.int64)
        self._desc = np.zeros(len(kernels.DESCRIPTOR), dtype=np.int64)
        self._desc_arrays: tuple[Any, ...] = ()
        self._desc_ids: tuple[int, ...] = ()

    def _alloc(self, policy: str, frequency_window: int | None) -> None:
        capacity = self.capacity
        self._rows = RowStore(capacity, self.dim, self.xp)
        window = WINDOW_PER_ROW * capacity if frequency_window is None else frequency_window
        self.policy: Policy = make_policy(policy, capacity, self._rows.ticks, self.xp, window)
        self._tick = 0
        self._window_tick = 0

    # -- introspection -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes + self.policy.nbytes

    @property
    def version(self) -> int:
        """Increases with every write; pass it back as ``since`` (see the module docstring)."""
        return self._log.version

    @property
    def n_pinned(self) -> int:
        with self._lock, self._scope:
            return int(self._rows.pinned.sum())

    def stats(self) -> dict[str, Any]:
        with self._lock, self._scope:
            return {
                **self._stats,
                "size": len(self),
                "capacity": self.capacity,
                "pinned": int(self._rows.pinned.sum()),
                "policy": self.policy.name,
                "device": self.xp.__name__,
                "nbytes": self.nbytes,
            }

    # -- reads ---------------------------------------------------------------------------

    def query(self, keys: Keys, inverse: Any = None, *, counts: Any = None) -> tuple[Vectors, Mask]:
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
            out = self._rows.values.take(idx, axis=0)
            if not all_hit:
                out[~(hit if inv is None else hit[inv])] = 0.0
            self._tick += 1
            self._rows.ticks[rows if all_hit else rows[hit]] = self._tick
            if not self.policy.counts_accesses:
                counts = None
            elif counts is not None:
                counts = to_xp(xp, np.asarray(counts).reshape(-1))
            elif inv is not None:
                counts = xp.bincount(inv, minlength=keys.size)
            if self.policy.on_query(kd, rows, hit, counts):
                self.policy.age()
                self._repin()
            self._stats["queries"] += 1
            self._stats["hits"] += n_hit
            self._stats["misses"] += keys.size - n_hit
            return to_host(out), to_host(hit)

    def query_into(self, keys: Keys, out: np.ndarray) -> tuple[np.ndarray, int]:
        """Rows of ``keys`` (duplicates allowed) written into ``out[len(keys), dim]`` in order.

        Returns the positions of the misses (their rows are zeros) and the number of
        distinct keys hit. The cache ends up exactly as after ``query(uniq, inverse)`` of the
        de-duplicated keys (ticks, counts, sketch, window, stats). With a compiled kernel
        (:mod:`hps.cache.kernels`) it is one pass over the keys; without, it is that query.
        """
        keys = np.ascontiguousarray(_host_keys(keys))
        if out.shape != (keys.size, self.dim) or out.dtype != np.float32:
            raise ShapeError(f"L1 {self.name}: output {out.shape} {out.dtype} for {keys.size} keys")
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
        """Whether :func:`hps.cache.many.query_tables_into` can probe it (compiled, on CPU)."""
        return self._kernel is not None and self.xp is np

    def _descriptor(self) -> np.ndarray:
        """This cache's row for the many-table kernel, for a new query's tick (the caller
        holds the lock until the kernel has run): the addresses of its arrays, rebuilt only
        when one of them was replaced (kept referenced, so an address is never reused)."""
        rows, access = self._rows, self.policy.access_counts()
        counts, cap = access if access is not None else (None, kernels.COUNT_CAP_NONE)
        arrays = (rows.index.slot_keys, rows.index.slot_rows, rows.values, rows.ticks, counts)
        if tuple(map(id, arrays)) != self._desc_ids:
            slot_keys, slot_rows, values, ticks, _ = arrays
            self._desc = np.array(
                [slot_keys.ctypes.data, slot_rows.ctypes.data, slot_keys.size, 0,
                 values.ctypes.data, self.dim, values.shape[0], ticks.ctypes.data, 0,
                 0 if counts is None else counts.ctypes.data, cap],
                dtype=np.int64,
            )  # fmt: skip
            self._desc_arrays = arrays  # referenced: their ids and addresses stay theirs
            self._desc_ids = tuple(map(id, arrays))
        self._tick += 1
        desc = self._desc
        desc[3] = rows.index.gmask
        desc[8] = self._tick
        desc[10] = cap
        return desc

    def _after_probe(self, keys: np.ndarray, miss_pos: np.ndarray, n_hit: int) -> None:
        """The policy and the counters after a compiled probe of ``keys`` (lock held)."""
        n_missed = 0
        if miss_pos.size:
            missed, times = np.unique(keys[miss_pos], return_counts=True)
            n_missed = missed.size
            if self.policy.on_misses(to_xp(self.xp, missed), to_xp(self.xp, times), keys.size):
                self.policy.age()
                self._repin()
        elif self.policy.on_misses(self._no_keys, self._no_keys, keys.size):
            self.policy.age()
            self._repin()
        stats = self._stats
        stats["queries"] += 1
        stats["hits"] += n_hit
        stats["misses"] += n_missed

    def resident(self, keys: Keys) -> Mask:
        keys = _host_keys(keys)
        with self._lock, self._scope:
            return to_host(self._rows.lookup(to_xp(self.xp, keys)) >= 0)

    def resident_keys(self) -> Keys:
        with self._lock, self._scope:
            return to_host(self._rows.row_keys[self._rows.occupied()])

    def pinned_keys(self) -> Keys:
        with self._lock, self._scope:
            return to_host(self._rows.row_keys[self._rows.pinned])

    def dump(self) -> tuple[Keys, Vectors]:
        """All resident keys and their vectors (host arrays)."""
        with self._lock, self._scope:
            rows = self.xp.flatnonzero(self._rows.occupied())
            return to_host(self._rows.row_keys[rows]), to_host(self._rows.values[rows])

    # -- writes --------------------------------------------------------------------------

    def insert(
        self, keys: Keys, values: Vectors, *, since: int | None = None, force: bool = False
    ) -> None:
        """Upsert; evicts by policy when full, never a pinned row.

        With more new keys than there is room for, what fits is kept by policy; the
        ``frequency`` policy also turns away keys asked for less often than the rows they
        would evict, unless ``force`` (prefetch, warm-up). Reserved keys (the two smallest
        int64 values) are not cacheable and are skipped.
        """
        keys, values = self._batch(keys, values)
        with self._lock, self._scope:
            self._insert(keys, values, since=since, force=force)

    def _insert(self, keys: Keys, values: Vectors, *, since: int | None, force: bool) -> Any:
        """Insert under the lock; returns the rows now holding ``keys`` (-1: not admitted)."""
        xp = self.xp
        rows_out = xp.full(keys.size, -1, dtype=xp.int64)
        kd = to_xp(xp, keys)
        ok = kd > TOMBSTONE
        if since is not None:
            ok &= ~self._log.since(kd, since)
        self._tick += 1
        rows = self._rows.lookup(kd)
        present = ok & (rows >= 0)
        fresh = xp.flatnonzero(ok & (rows < 0))
        vd = to_xp(xp, values)
        if bool(present.any()):
            prow = rows[present]
            self._rows.values[prow] = vd[present]
            self._rows.ticks[prow] = self._tick
            rows_out[present] = prow
        if fresh.size:
            rows_out[fresh] = self._place(kd[fresh], vd[fresh], rows, force)
        written = rows_out >= 0
        self._log.record(kd[written])
        return rows_out

    def _place(self, keys: Any, values: Any, current: Any, force: bool) -> Any:
        """Put absent keys into free or evicted rows; returns their rows (-1: turned away)."""
        xp, store = self.xp, self._rows
        m = int(keys.size)
        admit = xp.ones(m, dtype=bool)
        need = m - store.n_free
        if need > 0:
            evictable = store.occupied() & ~store.pinned
            evictable[current[current >= 0]] = False  # rows this batch just upserted stay
            cand = xp.flatnonzero(evictable)
            victims, admit = self._choose_victims(keys, cand, need, force)
            self._evict_rows(victims)
        idx = xp.flatnonzero(admit)[: store.n_free]
        out = xp.full(m, -1, dtype=xp.int64)
        n = int(idx.size)
        self._stats["inserts"] += n
        self._stats["rejected"] += m - n
        if n:
            rows = store.place(keys[idx], values[idx], self._tick)
            self.policy.on_insert(keys[idx], rows)
            out[idx] = rows
        return out

    def _choose_victims(self, keys: Any, cand: Any, need: int, force: bool) -> tuple[Any, Any]:
        """Rows to evict so that ``need`` more keys fit, and which newcomers to admit."""
        xp = self.xp
        m, e = int(keys.size), int(cand.size)
        admit = xp.ones(m, dtype=bool)
        if e == 0:
            return cand, admit
        prio = self.policy.priority(cand)
        if not self.policy.admission or force:
            if need >= e:
                return cand, admit
            return cand[xp.argpartition(prio, need - 1)[:need]], admit
        # Newcomers compete with the evictable rows: the `need` lowest of both go.
        both = xp.concatenate([prio, self.policy.newcomer_priority(keys, self._tick)])
        drop = xp.argpartition(both, need - 1)[:need]
        admit[drop[drop >= e] - e] = False
        return cand[drop[drop < e]], admit

    def _evict_rows(self, rows: Any) -> None:
        if rows.size == 0:
            return
        self.policy.on_evict(self._rows.row_keys[rows], rows)
        self._rows.release(rows)
        self._stats["evictions"] += int(rows.size)

    def update(self, keys: Keys, values: Vectors, *, since: int | None = None) -> Mask:
        """Overwrite the rows of keys already resident; returns which were updated."""
        keys, values = self._batch(keys, values)
        xp = self.xp
        with self._lock, self._scope:
            kd = to_xp(xp, keys)
            rows = self._rows.lookup(kd)
            hit = rows >= 0
            if since is not None:
                hit &= ~self._log.since(kd, since)
            self._rows.values[rows[hit]] = to_xp(xp, values)[hit]
            self._log.record(kd)
            self._stats["updates"] += int(hit.sum())
            return to_host(hit)

    def evict(self, keys: Keys) -> None:
        """Drop keys (pinned ones too: this is an explicit removal, not a policy choice)."""
        keys = np.unique(_host_keys(keys))
        with self._lock, self._scope:
            kd = to_xp(self.xp, keys)
            rows = self._rows.lookup(kd)
            self._evict_rows(rows[rows >= 0])
            self._log.record(kd)

    def pin(self, keys: Keys, values: Vectors) -> None:
        """Upsert ``keys`` and add them to the static hot set, hottest first.

        The pinned set holds at most ``static_fraction x capacity`` rows; keys past that are
        inserted as ordinary rows. Pinned rows are never evicted by policy.
        """
        keys, values = self._batch(keys, values)
        with self._lock, self._scope:
            rows = self._insert(keys, values, since=None, force=True)
            rows = rows[rows >= 0]
            pinned = self._rows.pinned
            room = max(0, self.max_pinned - int(pinned.sum()))
            pinned[rows[~pinned[rows]][:room]] = True

    def clear(self) -> None:
        with self._lock, self._scope:
            self._rows.clear()
            self.policy.clear()
            self._log.clear()

    # -- internals -----------------------------------------------------------------------

    def _batch(self, keys: Any, values: Any) -> tuple[Keys, Vectors]:
        from hps.dedup import last_occurrence

        keys = _host_keys(keys)
        vals = np.asarray(values, dtype=np.float32)
        if vals.ndim != 2 or vals.shape != (keys.size, self.dim):
            raise ShapeError(
                f"L1 cache {self.name}: expected vectors ({keys.size}, {self.dim}), "
                f"got {vals.shape}"
            )
        return last_occurrence(keys, vals)

    def _repin(self) -> None:
        """Re-choose the pinned hot set: the most frequent rows used since the last choice.

        A hot set that moved on leaves the pinned set at once, not after its counts decayed.
        """
        if not self.policy.adaptive_pinning or self.max_pinned == 0:
            return
        store = self._rows
        rows = self.xp.flatnonzero(store.occupied() & (store.ticks > self._window_tick))
        self._window_tick = self._tick
        store.pinned.fill(False)
        if rows.size > self.max_pinned:
            k = rows.size - self.max_pinned
            rows = rows[self.xp.argpartition(self.policy.priority(rows), k - 1)[k:]]
        store.pinned[rows] = True
