"""Eviction policies of the L1 cache: per-row metadata in ``xp`` arrays, vectorised choices.

A policy ranks rows by a composite int64 *priority* (lower is evicted first); the cache picks
victims with one ``argpartition`` over the evictable rows of an eviction window
(:mod:`hps.cache.placement`), never a loop over keys. Every
priority ends in the row's last-access tick, so ties fall back to LRU order.

- ``lru``: the tick alone (HugeCTR's default). Every miss is admitted.
- ``lfu``: accesses while resident, then the tick. Every miss is admitted; no ageing.
- ``frequency``: static + dynamic (a frequency-aware cache). A pinned hot set of
  ``static_fraction x capacity`` rows (a sixteenth of the rows always left out of it:
  :func:`hps.cache.placement.pinned_rows`) is never evicted; it comes from a frequency file at
  warm-up and is re-chosen every ``frequency_window`` accesses among the rows used in that
  window, by frequency. The dynamic rest is ranked by frequency (accesses while resident,
  capped; a count-min sketch for keys that are not), and a missed key is admitted only if it
  was asked for at least as often as the row it would evict (TinyLFU's admission). All counts
  halve at the end of each window, so a drifting hot set takes over within about a window.
  The window (default ``WINDOW_PER_ROW`` x capacity accesses) trades precision on a stable
  popularity law (longer) against speed of adaptation to drift (shorter); docs/cache.md
  shows both measured.
"""

from __future__ import annotations

from hps.cache.sketch import CountMinSketch, sketch_nbytes
from hps.types import Array, ArrayModule

POLICIES = ("lru", "lfu", "frequency")
WINDOW_PER_ROW = 50  # default frequency_window: accesses per cache row
TICK_BITS = 40
_TICK_MASK = (1 << TICK_BITS) - 1
_MAX_COUNT = (1 << 22) - 1
_INT32_MAX = (1 << 31) - 1


def compose(xp: ArrayModule, counts: Array, ticks: Array) -> Array:
    """int64 priority: count in the high bits, last-access tick in the low ``TICK_BITS``."""
    c = xp.minimum(counts.astype(xp.int64), _MAX_COUNT)
    return (c << TICK_BITS) | (ticks.astype(xp.int64) & _TICK_MASK)


class Policy:
    """LRU; the base of the other policies. ``ticks`` is the cache's per-row last access."""

    name = "lru"
    admission = False  # whether missed keys must out-rank the rows they would evict
    counts_accesses = False  # whether on_query wants each key's accesses in the request
    adaptive_pinning = False

    def __init__(self, capacity: int, ticks: Array, xp: ArrayModule) -> None:
        self.capacity = capacity
        self.ticks = ticks
        self.xp = xp

    @staticmethod
    def extra_nbytes(capacity: int) -> int:
        """Bytes of metadata beyond the cache's own arrays (for ``hps plan``)."""
        return 0

    @property
    def nbytes(self) -> int:
        return 0

    def on_query(self, keys: Array, rows: Array, hit: Array, counts: Array | None) -> bool:
        """One query of unique ``keys`` (``counts``: accesses of each in the request, or None).

        Returns True when a frequency window ended: the cache then calls :meth:`age` and
        re-chooses its pinned hot set.
        """
        return False

    def on_insert(self, keys: Array, rows: Array) -> None:
        """Missed keys placed in ``rows``."""

    def on_evict(self, keys: Array, rows: Array) -> None:
        """Rows about to be freed (still holding their metadata)."""

    def on_misses(self, keys: Array, counts: Array, accesses: int) -> bool:
        """After a compiled probe (which bumped the hits' ticks and counts): the missed
        unique ``keys``, their ``counts`` and the query's ``accesses``; as :meth:`on_query`."""
        return False

    def access_counts(self) -> tuple[Array, int] | None:
        """The per-row access counts a compiled probe bumps per hit, and their cap."""
        return None

    def priority(self, rows: Array) -> Array:
        return self.ticks[rows]

    def newcomer_priority(self, keys: Array, tick: int) -> Array:
        """Priority a missed key would have once admitted (used only with ``admission``)."""
        return self.xp.full(keys.size, tick, dtype=self.xp.int64)

    def age(self) -> None:
        """End of a frequency window."""

    def clear(self) -> None:
        """Forget all metadata (the cache was cleared)."""


class LFUPolicy(Policy):
    name = "lfu"
    counts_accesses = True

    def __init__(self, capacity: int, ticks: Array, xp: ArrayModule) -> None:
        super().__init__(capacity, ticks, xp)
        self.counts = xp.zeros(capacity, dtype=xp.int32)

    @staticmethod
    def extra_nbytes(capacity: int) -> int:
        return 4 * capacity

    @property
    def nbytes(self) -> int:
        return int(self.counts.nbytes)

    def on_query(self, keys: Array, rows: Array, hit: Array, counts: Array | None) -> bool:
        xp, r = self.xp, rows[hit]  # unique rows: the keys of a query are de-duplicated
        add = 1 if counts is None else counts[hit].astype(xp.int64)
        # saturating, as the compiled kernels: a wrapped count would make the hottest row
        # the first to go (2^31 hits of one key: days at a few thousand hits a second)
        self.counts[r] = xp.minimum(self.counts[r].astype(xp.int64) + add, _INT32_MAX)
        return False

    def on_insert(self, keys: Array, rows: Array) -> None:
        self.counts[rows] = 1

    def access_counts(self) -> tuple[Array, int] | None:
        return self.counts, _INT32_MAX

    def priority(self, rows: Array) -> Array:
        return compose(self.xp, self.counts[rows], self.ticks[rows])

    def clear(self) -> None:
        self.counts.fill(0)


class FrequencyPolicy(LFUPolicy):
    name = "frequency"
    admission = True
    adaptive_pinning = True
    count_cap = 63  # bounded counts: a hot set that moved on fades within a few windows

    def __init__(self, capacity: int, ticks: Array, xp: ArrayModule, window: int) -> None:
        super().__init__(capacity, ticks, xp)
        self.sketch = CountMinSketch(capacity, xp)
        self.window = window
        self._seen = 0

    @staticmethod
    def extra_nbytes(capacity: int) -> int:
        return 4 * capacity + sketch_nbytes(capacity)

    @property
    def nbytes(self) -> int:
        return int(self.counts.nbytes) + self.sketch.nbytes

    def on_query(self, keys: Array, rows: Array, hit: Array, counts: Array | None) -> bool:
        xp, r, miss = self.xp, rows[hit], ~hit
        add = 1 if counts is None else counts[hit].astype(xp.int32)
        self.counts[r] = xp.minimum(self.counts[r] + add, self.count_cap)
        self.sketch.add(keys[miss], 1 if counts is None else counts[miss])
        return self._window_ended(int(keys.size) if counts is None else int(counts.sum()))

    def access_counts(self) -> tuple[Array, int] | None:
        return self.counts, self.count_cap

    def on_misses(self, keys: Array, counts: Array, accesses: int) -> bool:
        """The compiled probe's misses (unique keys, accesses of each) and total accesses;
        the hits' counts were bumped by the probe. Returns True when a window ended."""
        self.sketch.add(keys, counts)
        return self._window_ended(accesses)

    def _window_ended(self, accesses: int) -> bool:
        if not self.window:
            return False
        self._seen += accesses
        if self._seen < self.window:
            return False
        self._seen = 0
        return True

    def _estimate(self, keys: Array) -> Array:
        return self.xp.clip(self.sketch.estimate(keys), 1, self.count_cap)

    def on_insert(self, keys: Array, rows: Array) -> None:
        # A newcomer starts with what the sketch saw of it while it was not resident.
        self.counts[rows] = self._estimate(keys)

    def on_evict(self, keys: Array, rows: Array) -> None:
        self.sketch.raise_to(keys, self.counts[rows])

    def newcomer_priority(self, keys: Array, tick: int) -> Array:
        ticks = self.xp.full(keys.size, tick, dtype=self.xp.int64)
        return compose(self.xp, self._estimate(keys), ticks)

    def age(self) -> None:
        self.counts >>= 1
        self.sketch.age()

    def clear(self) -> None:
        super().clear()
        self.sketch.clear()
        self._seen = 0


def make_policy(name: str, capacity: int, ticks: Array, xp: ArrayModule, window: int) -> Policy:
    if name == "lru":
        return Policy(capacity, ticks, xp)
    if name == "lfu":
        return LFUPolicy(capacity, ticks, xp)
    if name == "frequency":
        return FrequencyPolicy(capacity, ticks, xp, window)
    from hps.errors import ConfigError

    raise ConfigError(f"hps_cache.policy: unknown policy {name!r}; known: {POLICIES}")


_CLASSES: dict[str, type[Policy]] = {"lru": Policy, "lfu": LFUPolicy, "frequency": FrequencyPolicy}


def policy_nbytes(name: str, capacity: int) -> int:
    return _CLASSES[name].extra_nbytes(capacity)
