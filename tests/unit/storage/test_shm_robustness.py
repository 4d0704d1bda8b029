"""SharedHashMapStore where its users interleave or its file is not what it should be: the
tick readers share, a write through a handle of a dropped table, files at the segment's
path that are not (whole) segments."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.errors import BackendError
from hps.storage._shm_layout import HeaderWord
from hps.storage._shm_segment import Segment
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import TableSpec
from tests.helpers import rows, unique_name

MiB = 1024 * 1024
SPEC = TableSpec("m", "t", 4)


@pytest.fixture
def store_at(tmp_path: Path) -> Iterator[Any]:
    """Open stores on one segment under ``tmp_path``; closed after the test."""
    name = unique_name("hps_test_shm")
    opened: list[SharedHashMapStore] = []

    def open_(**kw: Any) -> SharedHashMapStore:
        s = SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path), seed=0, **kw)
        s.open_table(SPEC)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()
    assert os.listdir(tmp_path) == []


def test_reads_never_move_the_tick(store_at: Any) -> None:
    """Readers share the lock: a counter they all wrote could go backwards."""
    writer, reader = (
        store_at(overflow_policy="evict_least_used"),
        store_at(overflow_policy="evict_least_used"),
    )
    keys = np.arange(100, dtype=np.int64)
    writer.insert(SPEC.name, keys, rows(keys, 4))
    before = int(writer._seg.h[HeaderWord.TICK])
    for _ in range(5):
        reader.fetch(SPEC.name, keys)
        writer.fetch(SPEC.name, keys)
    assert int(writer._seg.h[HeaderWord.TICK]) == before
    writer.insert(SPEC.name, keys[:1], rows(keys[:1], 4))
    assert int(writer._seg.h[HeaderWord.TICK]) > before  # writers move it


def test_rows_read_since_the_last_write_survive_eviction_however_readers_interleave(
    store_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader ``a`` fetches a cold row while reader ``b`` fetches the hot rows 50 times.
    Where a reader's fetch moves the counter (a read-modify-write, under the shared lock),
    ``b``'s fetches land inside ``a``'s, and ``a`` writes back the tick it read plus one:
    the hot rows then carry ticks ahead of the counter, look 2^32 ticks old and are evicted
    first. Here no reader writes the counter, and the hot rows outlive the cold ones."""
    lru = {"overflow_policy": "evict_least_used"}
    writer = store_at(overflow_margin=1000, **lru)
    a, b = store_at(**lru), store_at(**lru)
    cold = np.arange(1000, dtype=np.int64)
    writer.insert(SPEC.name, cold, rows(cold, 4))
    hot = cold[:100]
    landed = []

    def b_reads() -> None:
        for _ in range(50):
            b.fetch(SPEC.name, hot)
        landed.append(True)

    real = Segment.next_tick

    def interleaved(seg: Segment) -> int:
        if seg is not a._seg or landed:
            return real(seg)
        seen = int(seg.h[HeaderWord.TICK])  # a reads the counter ...
        b_reads()  # ... b's fetches land meanwhile ...
        seg.h[HeaderWord.TICK] = seen + 1  # ... a writes what it read, plus one
        return seg.tick()

    monkeypatch.setattr(Segment, "next_tick", interleaved)
    a.fetch(SPEC.name, cold[500:501])
    if not landed:  # a's fetch never moved the counter: b's fetches happen all the same
        b_reads()
    monkeypatch.undo()
    new = np.arange(10_000, 10_100, dtype=np.int64)
    writer.insert(SPEC.name, new, rows(new, 4))  # past the margin: the least used go
    assert writer.size(SPEC.name) == 800
    assert writer.fetch(SPEC.name, hot)[1].all()
    assert writer.fetch(SPEC.name, new)[1].all()


def test_a_write_through_a_dropped_tables_handle_is_no_writer_death(
    store_at: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The handle is seen stale under the write lock, before anything is written: the
    segment is left clean, so nobody repairs it (repairs count writers that died)."""
    one, two = store_at(), store_at()
    keys = np.arange(10, dtype=np.int64)
    one.insert(SPEC.name, keys, rows(keys, 4))
    two.drop_table(SPEC.name)
    with caplog.at_level(logging.WARNING):
        one.insert(SPEC.name, keys, rows(keys, 4))  # opened again, then written
        assert one.fetch(SPEC.name, keys)[1].all()
    assert one.stats()["repairs"] == 0
    assert int(one._seg.h[HeaderWord.DIRTY]) == 0
    assert not [r for r in caplog.records if "writer died" in r.getMessage()]


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"x" * 100, "less than the 4096-byte header"),
        (b"\0" * 100, "less than the 4096-byte header"),
        (b"\0" * 70_000, "no finished header: too small"),
    ],
)
def test_a_small_file_at_the_path_is_refused_naming_it(
    tmp_path: Path, content: bytes, what: str
) -> None:
    path = tmp_path / "seg"
    path.write_bytes(content)
    with pytest.raises(BackendError, match=what) as err:
        SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path))
    assert str(path) in str(err.value) and "remove it" in str(err.value)
    assert path.read_bytes() == content  # left alone


def test_a_segment_cut_short_is_refused(tmp_path: Path) -> None:
    """A file shorter than the size its own header records: its users' views would reach
    past its end. The message names the file, not the configured size."""
    kept = SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path),
                              shared_memory_auto_remove=False)  # fmt: skip
    kept.close()
    os.truncate(tmp_path / "seg", 4 * MiB)
    with pytest.raises(BackendError, match="records 8388608: it was cut short") as err:
        SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path))
    assert str(tmp_path / "seg") in str(err.value)


def _blocked_flocks(paths: list[str]) -> int:
    """How many flock requests on these files wait in the kernel now (``/proc/locks``)."""
    files = set()
    for p in paths:
        st = os.stat(p)
        files.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line.split() and line.split()[-3] in files)


def _wait_until(what: str, done: Callable[[], bool]) -> None:
    for _ in range(1000):  # a hang guard, 10 s: each step takes well under a second
        if done():
            return
        time.sleep(0.01)
    pytest.fail(f"never happened: {what}")


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads /proc/locks")
def test_a_reader_that_comes_while_a_writer_waits_reads_after_it(store_at: Any) -> None:
    """flock grants a shared lock to a reader while other readers hold it, even with a
    writer waiting: readers that keep overlapping starved writers for good. Here reader
    ``late`` comes while ``early`` reads and the writer waits: it waits too, and reads
    what the writer wrote."""
    early, late, writer = store_at(), store_at(), store_at()
    key = np.array([7], dtype=np.int64)
    writer.insert(SPEC.name, key, np.zeros((1, 4), np.float32))
    seg_files = [f for s in (".lock", ".turn") if os.path.exists(f := early.path + s)]
    seen: list[np.ndarray] = []
    write = threading.Thread(
        target=lambda: writer.insert(SPEC.name, key, np.ones((1, 4), np.float32))
    )
    read = threading.Thread(target=lambda: seen.append(late.fetch(SPEC.name, key)[0]))
    with early._seg.reading():
        write.start()
        _wait_until("the writer waits", lambda: _blocked_flocks(seg_files) == 1)
        read.start()
        _wait_until("the late reader waits or has read",
                    lambda: bool(seen) or _blocked_flocks(seg_files) == 2)  # fmt: skip
    write.join(10)
    read.join(10)
    assert not write.is_alive() and not read.is_alive()
    np.testing.assert_array_equal(seen[0], np.ones((1, 4), np.float32))


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads /proc/locks")
def test_a_store_opened_after_the_lock_file_was_removed_still_waits_for_a_writer(
    store_at: Any,
) -> None:
    """A ``.lock`` removed under running stores: a store opened afterwards locks a new one
    while the others still hold the old one. The segment's own lock keeps it out while
    another store writes (before, both were in the one mapping at once)."""
    writer = store_at()
    os.unlink(writer.path + ".lock")
    late = store_at()
    held = os.fstat(writer._seg._locks.fd).st_ino
    assert os.stat(writer.path + ".lock").st_ino != held  # two .lock files in use
    key = np.array([7], dtype=np.int64)
    seen: list[np.ndarray] = []
    read = threading.Thread(target=lambda: seen.append(late.fetch(SPEC.name, key)[1]))
    with writer._seg.writing():
        read.start()
        _wait_until("the late store waits or has read",
                    lambda: bool(seen) or _blocked_flocks([writer.path]) == 1)  # fmt: skip
        assert not seen, "a store read the segment while another wrote it"
    read.join(10)
    assert not read.is_alive() and seen
