"""Placement: where an L1 cache writes keys, and which of its rows stay pinned.

A resident key is overwritten in its row; an absent one takes a free row, and past those the
place of a victim: an evictable row (neither pinned nor just upserted) of lowest policy
priority, chosen with one ``argpartition``. A full cache chooses among a window of the arena,
not all of it: ``max(SCAN_PER_VICTIM x victims, MIN_SCAN_ROWS)`` rows from a hand that then
moves past them, so that an insert costs what it inserts, not what the cache holds (a whole
scan of a 1 M-row arena took 42 ms for any batch). Every row comes up once per sweep of the
hand, and the victims are the lowest ``1 / SCAN_PER_VICTIM`` of their window. A window that
would cover the arena, or holds too few evictable rows, is the whole arena (exact).

With the policy's ``admission`` (``frequency``) newcomers compete with those rows, and the
ones that lose are turned away. The pinned hot set is re-chosen at the end of each frequency
window among the rows used in it. :class:`hps.cache.EmbeddingCache` calls this under its lock.
"""

from __future__ import annotations

from hps.cache.policies import Policy
from hps.cache.rows import RowStore
from hps.types import Array, ArrayModule

SCAN_PER_VICTIM = 16
MIN_SCAN_ROWS = 8192
EVICTABLE_SHARE = 16  # at least 1 / 16 of the rows (1 at least) are never pinned


def pinned_rows(static_fraction: float, capacity: int) -> int:
    """Most rows a cache pins: ``static_fraction x capacity``, but always leaving
    ``max(1, capacity // EVICTABLE_SHARE)`` rows evictable. (With every row pinned, as
    ``static_fraction: 1.0`` did once a frequency window re-chose the pinned set among the
    rows it used, every insert, forced ones too, was turned away until the next window.)"""
    return max(
        0, min(int(static_fraction * capacity), capacity - max(1, capacity // EVICTABLE_SHARE))
    )


class Placement:
    """Makes room in ``store`` by ``policy``; counts into the cache's ``stats``."""

    def __init__(
        self, store: RowStore, policy: Policy, xp: ArrayModule, max_pinned: int,
        stats: dict[str, int],
    ) -> None:  # fmt: skip
        self.store = store
        self.policy = policy
        self.xp = xp
        self.max_pinned = max_pinned
        self.stats = stats
        self.window_tick = 0  # the tick at which the pinned set was last chosen
        self.hand = 0  # the first row of the next eviction window

    def upsert(self, keys: Array, values: Array, ok: Array, force: bool, tick: int) -> Array:
        """Write the rows of ``keys[ok]`` (unique ``xp`` keys): resident ones in place,
        absent ones placed; returns the row now holding each key (-1: not written)."""
        xp, store = self.xp, self.store
        out = xp.full(keys.size, -1, dtype=xp.int64)
        rows = store.overwrite(keys, values, ok, tick)  # resident keys: written in place
        present = ok & (rows >= 0)
        fresh = xp.flatnonzero(ok & (rows < 0))
        out[present] = rows[present]
        if fresh.size:
            out[fresh] = self._place(_pick(keys, fresh), _pick(values, fresh), rows, force, tick)
        return out

    def _place(self, keys: Array, values: Array, current: Array, force: bool, tick: int) -> Array:
        """Put absent keys into free or evicted rows; returns their rows (-1: turned away).

        ``current``: the rows of this batch's keys before it (those upserted stay)."""
        xp, store = self.xp, self.store
        m = int(keys.size)
        admit = xp.ones(m, dtype=bool)
        need = m - store.n_free
        if need > 0:
            cand = self._candidates(need, current[current >= 0])
            victims, admit = self._choose_victims(keys, cand, need, force, tick)
            self.evict_rows(victims)
        idx = xp.flatnonzero(admit)[: store.n_free]
        out = xp.full(m, -1, dtype=xp.int64)
        n = int(idx.size)
        self.stats["inserts"] += n
        self.stats["rejected"] += m - n
        if n:
            keys = _pick(keys, idx)
            rows = store.place(keys, _pick(values, idx), tick)
            self.policy.on_insert(keys, rows)
            out[idx] = rows
        return out

    def _candidates(self, need: int, upserted: Array) -> Array:
        """Evictable rows to choose ``need`` victims from: those of the window at the hand
        (which moves past it), or of the whole arena. ``upserted``: rows this batch wrote,
        which stay."""
        xp, store = self.xp, self.store
        c, w = store.capacity, max(SCAN_PER_VICTIM * need, MIN_SCAN_ROWS)
        if w < c:
            rows = (self.hand + xp.arange(w, dtype=xp.int64)) % c
            ok = store.occupied(rows) & ~store.pinned[rows]
            at = (upserted - self.hand) % c
            ok[at[at < w]] = False
            cand = rows[ok]
            if int(cand.size) >= need:
                self.hand = (self.hand + w) % c
                return cand
        evictable = store.occupied() & ~store.pinned
        evictable[upserted] = False
        return xp.flatnonzero(evictable)

    def _choose_victims(
        self, keys: Array, cand: Array, need: int, force: bool, tick: int
    ) -> tuple[Array, Array]:
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
        both = xp.concatenate([prio, self.policy.newcomer_priority(keys, tick)])
        drop = xp.argpartition(both, need - 1)[:need]
        admit[drop[drop >= e] - e] = False
        return cand[drop[drop < e]], admit

    def evict_rows(self, rows: Array) -> None:
        if rows.size == 0:
            return
        self.policy.on_evict(self.store.row_keys[rows], rows)
        self.store.release(rows)
        self.stats["evictions"] += int(rows.size)

    def pin(self, rows: Array) -> None:
        """Add ``rows`` (-1: not admitted) to the pinned set, in order, while there is room."""
        rows = rows[rows >= 0]
        pinned = self.store.pinned
        room = max(0, self.max_pinned - int(pinned.sum()))
        pinned[rows[~pinned[rows]][:room]] = True

    def new_window(self, tick: int) -> None:
        """A frequency window ended: the policy ages its counts and the pinned hot set is
        re-chosen: the most frequent rows used since the last choice.

        A hot set that moved on leaves the pinned set at once, not after its counts decayed.
        """
        self.policy.age()
        if not self.policy.adaptive_pinning or self.max_pinned == 0:
            return
        store = self.store
        rows = self.xp.flatnonzero(store.occupied() & (store.ticks > self.window_tick))
        self.window_tick = tick
        store.pinned.fill(False)
        if rows.size > self.max_pinned:
            k = rows.size - self.max_pinned
            rows = rows[self.xp.argpartition(self.policy.priority(rows), k - 1)[k:]]
        store.pinned[rows] = True


def _pick(a: Array, idx: Array) -> Array:
    """``a[idx]`` for ascending, unique ``idx``: ``a`` itself when that is all of it (a batch
    of new rows is not copied once more before it is stored)."""
    return a if int(idx.size) == len(a) else a[idx]
