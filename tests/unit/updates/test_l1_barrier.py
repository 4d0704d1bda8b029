"""A background L1 fill whose L2/L3 read came before a change that names no keys (a whole
table journalled, a journal resync, a replaced shared L2) and that lands after the listing
of the resident keys is dropped (``EmbeddingCache.barrier``), not kept for good."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.cache import EmbeddingCache
from hps.lookup import LookupSession
from hps.startup import reread_l1
from hps.updates.journal import Journal
from hps.updates.journal_follower import JournalFollower
from tests.helpers import make_config, rows

T = "demo.t0"
KEYS = np.arange(10, 20, dtype=np.int64)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[LookupSession]:
    model = {"model": "demo", "embedding_table_names": ["t0"], "embedding_vecsize_per_table": [4],
             "max_batch_size": 16, "gpucache": True, "hit_rate_threshold": 0.0,
             "hps_cache": {"device": "numpy", "capacity": 64}}  # fmt: skip
    s = build_session(make_config(tmp_path, models=[model]))
    yield s
    s.close()


def _fill_lands_after(s: LookupSession, change: Callable[[], None]) -> None:
    """Old rows read by a lookup whose L1 fill waits; the rows change in L2/L3 and
    ``change`` tells the session; then the fill lands."""
    s.tiers.write(T, KEYS, rows(KEYS, 4))
    gate = threading.Event()
    s.pipeline.background("test", gate.wait)
    np.testing.assert_array_equal(s.lookup(T, KEYS), rows(KEYS, 4))  # fill queued
    s.tiers.write(T, KEYS, rows(KEYS, 4, seed=1))  # the control plane, L2 and L3
    change()
    gate.set()
    s.drain()


def _served_now(s: LookupSession) -> None:
    for _ in range(2):  # the second from L1 where the first filled it
        np.testing.assert_array_equal(s.lookup(T, KEYS), rows(KEYS, 4, seed=1))
        s.drain()


@pytest.mark.parametrize("how", ["whole_table", "resync"])
def test_a_fill_read_before_a_keyless_journal_change_is_dropped(
    session: LookupSession, tmp_path: Path, how: str
) -> None:
    journal = Journal(tmp_path / "journal")
    follower = JournalFollower(journal, "reader", "demo")
    follower.attach(session, own_l2=True, shared_backfill=False)

    def change() -> None:
        if how == "whole_table":
            journal.append("upsert", T, None)  # an import: every key of the table
            follower.poll()
        else:
            follower._resync(session)

    _fill_lands_after(session, change)
    _served_now(session)
    follower.stop()


def test_a_fill_read_before_the_shared_l2_was_replaced_is_dropped(session: LookupSession) -> None:
    _fill_lands_after(session, lambda: reread_l1(session))
    _served_now(session)


def test_barrier_drops_earlier_tokens_and_keeps_rows() -> None:
    cache = EmbeddingCache(4, 16, policy="lru")
    keys = np.arange(4, dtype=np.int64)
    cache.insert(keys[:2], rows(keys[:2], 4))
    token = cache.version
    cache.barrier()
    cache.insert(keys[2:], rows(keys[2:], 4), since=token)  # read before: dropped
    assert cache.resident(keys).tolist() == [True, True, False, False]
    cache.insert(keys[2:], rows(keys[2:], 4), since=cache.version)
    assert cache.resident(keys).all()
