"""The write log against a plain record of every write: ``since`` answers which keys were
written after a version, held keys included, and "all of them" once the log lost track; it
keeps the writes of its last ``limit`` keys and ``limit // KEYS_PER_ENTRY`` writes, in a
fixed number of bytes, and a check costs no Python step per write."""

from __future__ import annotations

import sys
import tracemalloc
from types import FrameType
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.cache import writelog
from hps.cache.writelog import KEYS_PER_ENTRY, WriteLog, writelog_nbytes

keys_st = st.lists(st.integers(0, 30), max_size=6)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("record"), keys_st),
        st.tuples(st.just("hold"), keys_st),
        st.tuples(st.just("release"), st.integers(0, 8)),
        st.tuples(st.just("clear"), st.just([])),
    ),
    max_size=40,
)


class KeptWrites:
    """What the log must still know: the last writes that fit its keys and its entries."""

    def __init__(self, limit: int) -> None:
        self.limit, self.slots = limit, max(1, limit // KEYS_PER_ENTRY)
        self.kept: list[tuple[int, int]] = []  # (version, keys) of each kept write
        self.floor = 0

    def record(self, version: int, n: int) -> None:
        if n > self.limit:
            self.forget(version)
        elif n:
            self.kept.append((version, n))
        while len(self.kept) > self.slots or sum(k for _, k in self.kept) > self.limit:
            self.floor = self.kept.pop(0)[0]

    def forget(self, version: int) -> None:
        self.kept, self.floor = [], version


@settings(max_examples=200, deadline=None)
@given(ops=ops_st, limit=st.sampled_from([1, 4, 9, 16, 27, 1000]), query=keys_st)
def test_since_matches_every_write_recorded(
    ops: list[tuple[str, list[int] | int]], limit: int, query: list[int]
) -> None:
    wlog = WriteLog(np, limit)
    writes: list[tuple[int, set[int]]] = []  # (version, keys) of every write
    kept = KeptWrites(limit)
    holds: dict[int, list[int]] = {}
    cleared_at = 0
    for op, arg in ops:
        if op == "record" and isinstance(arg, list):
            wlog.record(np.array(arg, dtype=np.int64))
            writes.append((wlog.version, set(arg)))
            kept.record(wlog.version, len(arg))
        elif op == "hold" and isinstance(arg, list):
            before = wlog.version
            holds[wlog.hold(np.array(arg, dtype=np.int64))] = arg
            # Past ``limit`` held keys the oldest holds were released: one write each.
            dropped = [h for h in holds if h not in wlog._holds and holds[h]]
            for i, h in enumerate(dropped):
                writes.append((before + 1 + i, set(holds[h])))
                kept.record(before + 1 + i, len(holds.pop(h)))
        elif op == "release" and isinstance(arg, int) and holds:
            handle = sorted(holds)[arg % len(holds)]
            wlog.release(handle)
            released = holds.pop(handle)
            if released:
                writes.append((wlog.version, set(released)))
                kept.record(wlog.version, len(released))
        elif op == "clear":
            wlog.clear()
            cleared_at = wlog.version
            kept.forget(wlog.version)
    assert wlog._floor == kept.floor  # it forgets no write it has room for
    held = set().union(*map(set, holds.values()))
    keys = np.array(query, dtype=np.int64)
    for version in range(wlog.version + 1):
        got = wlog.since(keys, version).tolist()
        if version < max(wlog._floor, cleared_at):
            assert all(got)  # the log no longer covers it: every key counts as written
            continue
        later = set().union(*(k for v, k in writes if v > version)) | held
        assert got == [k in later for k in query]


def test_a_key_stays_held_while_any_hold_of_it_lasts() -> None:
    wlog = WriteLog(np, 1000)
    first = wlog.hold(np.array([3, 3, 5], dtype=np.int64))
    second = wlog.hold(np.array([3], dtype=np.int64))
    keys = np.array([3, 5, 7], dtype=np.int64)
    assert wlog.since(keys, wlog.version).tolist() == [True, True, False]
    wlog.release(first)
    assert wlog.since(keys, wlog.version).tolist() == [True, False, False]  # 3: second
    wlog.release(second)
    assert wlog.since(keys, wlog.version).tolist() == [False, False, False]
    assert wlog.held == 0


def test_a_long_write_is_matched_against_a_short_query() -> None:
    wlog = WriteLog(np, 1 << 20)
    token = wlog.version
    wlog.record(np.arange(100_000, dtype=np.int64) * 3)  # a whole refresh, say
    keys = np.array([9, 9, 10, 299_997, 300_000], dtype=np.int64)
    assert wlog.since(keys, token).tolist() == [True, True, False, True, False]
    assert not wlog.since(keys, wlog.version).any()


def test_a_write_larger_than_the_log_loses_track_of_older_tokens() -> None:
    wlog = WriteLog(np, 8)
    wlog.record(np.array([1], dtype=np.int64))
    before, keys = wlog.version, np.array([1, 50, 99], dtype=np.int64)
    wlog.record(np.arange(50, 59, dtype=np.int64))  # 9 keys: more than the log keeps
    assert wlog.since(keys, before).all()
    token = wlog.version
    wlog.record(np.array([99], dtype=np.int64))
    assert wlog.since(keys, token).tolist() == [False, False, True]


def _lines_run(fn: Any) -> int:
    """Python lines of :mod:`hps.cache.writelog` that ``fn()`` runs."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if frame.f_code.co_filename != writelog.__file__:
            return None
        if event == "line":
            count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def test_a_since_check_takes_no_python_step_per_write() -> None:
    """One-key writes: a check of a token 100 or 10,000 writes old runs the same lines (it
    used to walk them, 14.9 ms under the cache's lock for 65,535 writes)."""
    keys = np.arange(5, 69, dtype=np.int64)
    lines = []
    for writes in (100, 10_000):
        wlog = WriteLog(np, 1 << 16)
        wlog.record(np.array([1], dtype=np.int64))
        token = wlog.version
        written = np.arange(writes, dtype=np.int64) * 7
        for i in range(writes):
            wlog.record(written[i : i + 1])
        lines.append(_lines_run(lambda: wlog.since(keys, token)))  # noqa: B023
        assert wlog.since(keys, token).tolist() == np.isin(keys, written).tolist()
    assert lines[0] == lines[1]


def test_one_key_writes_cost_the_documented_bytes() -> None:
    """Its memory is its rings: 12 bytes a key slot, whatever the writes' sizes (a tuple and
    an array per write used to make it ~327 bytes a key with one-key writes)."""
    limit = 1 << 16
    written = np.arange(3 * limit, dtype=np.int64)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        wlog = WriteLog(np, limit)
        for i in range(70_000):
            wlog.record(written[i : i + 1])
        for lo in range(70_000, 3 * limit, 1000):  # and larger writes, wrapping the ring
            wlog.record(written[lo : lo + 1000])
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert wlog.nbytes == writelog_nbytes(limit) == 12 * limit
    assert used <= writelog_nbytes(limit) + (16 << 10)
    last = written[(3 * limit - 1) // 1000 * 1000 :]  # the last write's keys
    keys = written[-2 * last.size :]
    assert wlog.since(keys, wlog.version - 1).tolist() == np.isin(keys, last).tolist()
