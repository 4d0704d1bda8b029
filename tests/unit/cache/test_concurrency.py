"""Concurrent use of one cache, and the ``since`` guard against stale background writes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from hps.cache import EmbeddingCache, embedding_cache
from hps.rowformat import FLOAT32, RowFormat

DIM = 4


def rows_for(keys: np.ndarray, version: float, fmt: RowFormat = FLOAT32) -> np.ndarray:
    """Stored rows ``[key, version, version, version]``: the version (the row's minimum
    here, int8's offset) comes back exactly in every format."""
    out = np.empty((keys.size, DIM), dtype=np.float32)
    out[:, 0] = keys
    out[:, 1:] = version
    return fmt.encode(out)


def test_an_older_read_never_overwrites_a_newer_write(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(DIM, 16, xp=xp, fmt=fmt)

    keys = np.array([5, 6], dtype=np.int64)
    token = cache.version  # taken before reading L2/L3 for a background insert
    cache.update(np.array([5], dtype=np.int64), rows_for(np.array([5]), 2.0, fmt))  # not resident
    cache.insert(keys, rows_for(keys, 1.0, fmt), since=token)  # the stale background insert
    assert cache.resident(keys).tolist() == [False, True]
    cache.insert(keys, rows_for(keys, 2.0, fmt), since=cache.version)
    values, hit = cache.query(keys)
    assert hit.all() and (values[:, 1] == 2.0).all()
    token = cache.version
    cache.update(keys[:1], rows_for(keys[:1], 3.0, fmt))
    mask = cache.update(keys, rows_for(keys, 1.5, fmt), since=token)
    assert mask.tolist() == [False, True]
    values, _ = cache.query(keys)
    assert values[:, 1].tolist() == [3.0, 1.5]


def test_a_token_older_than_the_write_log_drops_the_whole_insert(xp: ModuleType) -> None:
    cache = EmbeddingCache(DIM, 8, xp=xp)
    token = cache.version
    many = np.arange(1000, 1000 + (1 << 16) + 10, dtype=np.int64)
    for chunk in np.array_split(many, 4):
        cache.update(chunk, rows_for(chunk, 1.0))  # logged, none resident
    cache.insert(np.array([1], dtype=np.int64), rows_for(np.array([1]), 1.0), since=token)
    assert len(cache) == 0
    cache.insert(np.array([1], dtype=np.int64), rows_for(np.array([1]), 1.0))
    assert len(cache) == 1
    token = cache.version
    cache.clear()
    cache.insert(np.array([2], dtype=np.int64), rows_for(np.array([2]), 1.0), since=token)
    assert len(cache) == 0


def _churn(cache: EmbeddingCache) -> list[str]:
    """Two writers and two readers on one cache; returns what the readers saw go wrong."""
    errors: list[str] = []
    stop = threading.Event()

    def stored(keys: np.ndarray, version: float) -> np.ndarray:
        if cache.fmt is FLOAT32:
            return rows_for(keys, version)
        constant = np.repeat(keys.astype(np.float32)[:, None], DIM, axis=1)  # exact in all
        return cache.fmt.encode(constant)

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        version = 0.0
        while not stop.is_set():
            version += 1
            keys = np.unique(rng.integers(0, 200, 40)).astype(np.int64)
            op = rng.integers(0, 4)
            if op == 0:
                cache.insert(keys, stored(keys, version), force=bool(rng.integers(0, 2)))
            elif op == 1:
                cache.update(keys, stored(keys, version))
            elif op == 2:
                cache.evict(keys[:5])
            else:
                cache.pin(keys[:3], stored(keys[:3], version))

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            request = rng.integers(0, 200, 64).astype(np.int64)
            uniq, inverse = np.unique(request, return_inverse=True)
            values, hit = cache.query(uniq, inverse)
            want = np.where(hit[inverse], request, 0).astype(np.float32)
            if not np.array_equal(values[:, 0], want):
                errors.append(f"{cache.policy.name}: wrong rows {values[:, 0]} for {request}")
                return
            if len(cache) > cache.capacity:
                errors.append("over capacity")
                return

    writers = [threading.Thread(target=writer, args=(s,)) for s in (1, 2)]
    readers = [threading.Thread(target=reader, args=(s,)) for s in (3, 4)]
    for t in writers + readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    return errors


def test_readers_never_see_a_wrong_row_while_writers_churn(xp: ModuleType, fmt: RowFormat) -> None:
    for policy in ("lru", "lfu", "frequency"):
        cache = EmbeddingCache(DIM, 64, xp=xp, policy=policy, frequency_window=100, fmt=fmt)
        errors = _churn(cache)
        assert not errors, errors[0]
        keys, stored = cache.dump()
        assert stored.dtype == fmt.dtype
        np.testing.assert_array_equal(fmt.decode(stored, DIM)[:, 0], keys.astype(np.float32))


def test_held_keys_are_not_filled_until_released(xp: ModuleType) -> None:
    cache = EmbeddingCache(DIM, 16, xp=xp)
    resident = np.array([1], dtype=np.int64)
    cache.insert(resident, rows_for(resident, 1.0))
    keys = np.array([1, 2, 3], dtype=np.int64)
    hold = cache.hold(keys[1:])
    assert cache.held == 2
    cache.insert(keys, rows_for(keys, 1.0), since=cache.version)  # a fill read from L2
    assert cache.resident(keys).tolist() == [True, False, False]
    cache.update(keys, rows_for(keys, 2.0))  # pass 1 still reaches resident keys
    assert cache.query(keys[:1])[0][0, 1] == 2.0
    token = cache.version  # a fill that read L2 before the release
    cache.release(hold)
    cache.release(hold)  # twice: ignored
    assert cache.held == 0
    cache.insert(keys, rows_for(keys, 1.0), since=token)
    assert cache.resident(keys).tolist() == [True, False, False]
    cache.insert(keys, rows_for(keys, 2.0), since=cache.version)
    assert cache.resident(keys).all()


def test_holds_past_the_log_limit_release_the_oldest(xp: ModuleType) -> None:
    cache = EmbeddingCache(DIM, 8, xp=xp)
    limit = 1 << 16  # the write log's limit for a small cache
    first = cache.hold(np.arange(10, 10 + limit, dtype=np.int64))
    second = cache.hold(np.array([5], dtype=np.int64))
    assert cache.held == 1  # the first hold went
    cache.release(first)  # already gone: ignored
    keys = np.array([10, 5], dtype=np.int64)
    cache.insert(keys, rows_for(keys, 1.0), since=cache.version)
    assert cache.resident(keys).tolist() == [True, False]
    cache.release(second)
    assert cache.held == 0


class _CountingLock:
    """The cache's lock, counting its holds and running ``between`` after each one ends."""

    def __init__(self, lock: object, between: Callable[[], None]) -> None:
        self.lock, self.between, self.holds = lock, between, 0

    def __enter__(self) -> None:
        self.lock.__enter__()  # type: ignore[attr-defined]
        self.holds += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)  # type: ignore[attr-defined]
        self.between()


def test_resident_keys_takes_the_lock_per_chunk_of_the_arena(
    xp: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of rows per hold, so writers interleave; a key resident throughout the call
    is in its answer, one written meanwhile may or may not be."""
    monkeypatch.setattr(embedding_cache, "RESIDENT_CHUNK", 16)
    cache = EmbeddingCache(DIM, 64, xp=xp)
    keys = np.arange(100, 164, dtype=np.int64)
    cache.insert(keys, rows_for(keys, 1.0))
    lock = cache._lock
    churn = iter([(158, 1000), (159, 1001), (160, 1002)])

    def write_between() -> None:  # another thread's write, between two chunks
        old, new = next(churn, (0, 0))
        cache._lock = lock  # type: ignore[assignment]
        if new:
            cache.evict(np.array([old], dtype=np.int64))
            cache.insert(np.array([new], dtype=np.int64), rows_for(np.array([new]), 1.0))
        cache._lock = counting  # type: ignore[assignment]

    counting = _CountingLock(lock, write_between)
    cache._lock = counting  # type: ignore[assignment]
    got = cache.resident_keys()
    cache._lock = lock  # type: ignore[assignment]
    assert counting.holds == 4  # 64 rows, 16 a hold
    throughout = set(keys.tolist()) - {158, 159, 160}
    assert throughout <= set(got.tolist()) <= set(keys.tolist()) | {1000, 1001, 1002}
    assert len(set(got.tolist())) == got.size
