"""The L1 cache driven through random operations against a plain dict model.

Properties, for every policy, array module and row format: a hit never returns a wrong
vector (always the last stored row written for the key, decoded; ``dump`` gives the stored
rows back unchanged), the cache never holds more than its capacity, pinned keys
are never evicted by an insert, and a cache at least as large as the key universe never
evicts anything (the 100% hit rate HugeCTR's set-associative cache could not reach). Each
runs twice: victims chosen among the whole arena (these caches are smaller than the eviction
window) and among a window of it (two rows a victim, at least one).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hps.cache import EmbeddingCache, placement
from hps.cache.xp import available_xps
from hps.rowformat import FORMATS, RowFormat

DIM = 3
UNIVERSE = 40
keys_st = st.lists(st.integers(0, UNIVERSE - 1), min_size=0, max_size=24)
unique_keys_st = st.lists(st.integers(0, UNIVERSE - 1), min_size=0, max_size=24, unique=True)


class CacheMachine(RuleBasedStateMachine):
    xp: ModuleType
    fmt: RowFormat

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, np.ndarray] = {}  # key -> its stored row
        self.version = 0.0

    @initialize(
        policy=st.sampled_from(["lru", "lfu", "frequency"]),
        capacity=st.sampled_from([1, 5, 12, UNIVERSE]),
        static_fraction=st.sampled_from([0.0, 0.5, 1.0]),
        window=st.sampled_from([0, 7, 50]),
    )
    def make(self, policy: str, capacity: int, static_fraction: float, window: int) -> None:
        self.cache = EmbeddingCache(
            DIM,
            capacity,
            xp=self.xp,
            policy=policy,
            static_fraction=static_fraction,
            frequency_window=window,
            fmt=self.fmt,
        )
        self.never_full = capacity >= UNIVERSE

    def _vectors(self, keys: np.ndarray) -> np.ndarray:
        """Distinct stored rows for every write: key, write number, and position."""
        self.version += 1
        out = np.empty((keys.size, DIM), dtype=np.float32)
        out[:, 0] = keys
        out[:, 1] = self.version
        out[:, 2] = np.arange(keys.size)
        return self.fmt.encode(out)

    def _decoded(self, key: int) -> np.ndarray:
        return self.fmt.decode(self.model[key][None], DIM)[0]

    def _resident(self) -> set[int]:
        return set(self.cache.resident_keys().tolist())

    def _forget_non_resident(self) -> None:
        resident = self._resident()
        for k in list(self.model):
            if k not in resident:
                del self.model[k]

    @rule(raw=keys_st, force=st.booleans())
    def insert(self, raw: list[int], force: bool) -> None:
        keys = np.array(raw, dtype=np.int64)
        values = self._vectors(keys)
        pinned_before = set(self.cache.pinned_keys().tolist())
        self.cache.insert(keys, values, force=force)
        resident = self._resident()
        assert pinned_before <= resident, "an insert evicted a pinned key"
        for i, k in enumerate(raw):  # the last occurrence of a duplicate wins
            if k in resident:
                self.model[k] = values[i]
        self._forget_non_resident()
        if self.never_full or force:
            room = self.cache.capacity - len(pinned_before - set(raw))
            if len(set(raw)) <= room:
                assert set(raw) <= resident, "a forced insert that fits must keep every key"

    @rule(raw=unique_keys_st)
    def update(self, raw: list[int]) -> None:
        keys = np.array(raw, dtype=np.int64)
        before = self._resident()
        values = self._vectors(keys)
        mask = self.cache.update(keys, values)
        assert mask.tolist() == [k in before for k in raw]
        for i, k in enumerate(raw):
            if mask[i]:
                self.model[k] = values[i]
        assert self._resident() == before

    @rule(raw=keys_st)
    def evict(self, raw: list[int]) -> None:
        self.cache.evict(np.array(raw, dtype=np.int64))
        assert not (set(raw) & self._resident())
        for k in raw:
            self.model.pop(k, None)

    @rule(raw=unique_keys_st, with_inverse=st.booleans())
    def query(self, raw: list[int], with_inverse: bool) -> None:
        keys = np.unique(np.array(raw, dtype=np.int64))
        resident = self._resident()
        if with_inverse:
            request = np.array(raw + raw[:3], dtype=np.int64)
            keys, inverse = np.unique(request, return_inverse=True)
            values, hit = self.cache.query(keys, inverse)
            assert values.shape == (request.size, DIM)
            for got, k in zip(values, request.tolist(), strict=True):
                if k in resident:
                    np.testing.assert_array_equal(got, self._decoded(k))
                else:
                    assert not got.any()
        else:
            values, hit = self.cache.query(keys)
            assert values.shape == (keys.size, DIM)
            for got, k, h in zip(values, keys.tolist(), hit.tolist(), strict=True):
                if h:
                    np.testing.assert_array_equal(got, self._decoded(k))
                else:
                    assert not got.any()
        assert hit.tolist() == [int(k) in resident for k in keys]
        # A query may end a frequency window, which can re-choose the pinned set but never
        # evicts: residency is unchanged.
        assert self._resident() == resident

    @rule(raw=unique_keys_st)
    def pin(self, raw: list[int]) -> None:
        keys = np.array(raw, dtype=np.int64)
        values = self._vectors(keys)
        pinned_before = set(self.cache.pinned_keys().tolist())
        self.cache.pin(keys, values)
        resident = self._resident()
        assert pinned_before <= resident
        for i, k in enumerate(raw):
            if k in resident:
                self.model[k] = values[i]
        self._forget_non_resident()

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        keys, values = self.cache.dump()
        assert values.dtype == self.fmt.dtype
        assert len(self.cache) == keys.size <= self.cache.capacity
        assert len(set(keys.tolist())) == keys.size
        assert set(keys.tolist()) == set(self.model)
        for k, v in zip(keys.tolist(), values, strict=True):
            np.testing.assert_array_equal(v, self.model[k])
        assert self.cache.n_pinned <= self.cache.max_pinned
        assert set(self.cache.pinned_keys().tolist()) <= set(keys.tolist())


XPS = available_xps()


@pytest.mark.parametrize("window", [False, True], ids=["arena", "window"])
@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
@pytest.mark.parametrize("xp", XPS, ids=[m.__name__ for m in XPS])
def test_cache_against_a_dict(
    xp: ModuleType, fmt: RowFormat, window: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if window:
        monkeypatch.setattr(placement, "SCAN_PER_VICTIM", 2)
        monkeypatch.setattr(placement, "MIN_SCAN_ROWS", 1)
    machine = type("Machine", (CacheMachine,), {"xp": xp, "fmt": fmt})
    runner = machine.TestCase
    runner.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
    runner().runTest()
