"""The write log against a plain record of every write: ``since`` answers which keys were
written after a version, held keys included, and "all of them" once the log lost track."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.cache.writelog import WriteLog

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


@settings(max_examples=200, deadline=None)
@given(ops=ops_st, limit=st.sampled_from([1, 4, 1000]), query=keys_st)
def test_since_matches_every_write_recorded(
    ops: list[tuple[str, list[int] | int]], limit: int, query: list[int]
) -> None:
    wlog = WriteLog(np, limit)
    writes: list[tuple[int, set[int]]] = []  # (version, keys) of every write
    holds: dict[int, set[int]] = {}
    cleared_at = 0
    for op, arg in ops:
        if op == "record" and isinstance(arg, list):
            wlog.record(np.array(arg, dtype=np.int64))
            writes.append((wlog.version, set(arg)))
        elif op == "hold" and isinstance(arg, list):
            before = wlog.version
            holds[wlog.hold(np.array(arg, dtype=np.int64))] = set(arg)
            # Past ``limit`` held keys the oldest holds were released: one write each.
            dropped = [h for h in holds if h not in wlog._holds and holds[h]]
            for i, h in enumerate(dropped):
                writes.append((before + 1 + i, holds.pop(h)))
        elif op == "release" and isinstance(arg, int) and holds:
            handle = sorted(holds)[arg % len(holds)]
            wlog.release(handle)
            released = holds.pop(handle)
            if released:
                writes.append((wlog.version, released))
        elif op == "clear":
            wlog.clear()
            cleared_at = wlog.version
    held = set().union(*holds.values())
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
