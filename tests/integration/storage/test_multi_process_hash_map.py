"""multi_process_hash_map across real processes: sharing, torn rows, crashes, lifecycle."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import TableSpec
from tests.helpers import unique_name

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("shm_worker.py"))
SIZE = 16 * 1024 * 1024
SPEC = TableSpec("m", "t", 8)  # the worker's table
KEYS = np.arange(1000, dtype=np.int64)


def _rows(keys: np.ndarray, writer: int, version: int) -> np.ndarray:
    out = np.empty((keys.size, 8), dtype=np.float32)
    out[:, :3] = np.stack([keys, np.full(keys.size, writer), np.full(keys.size, version)], 1)
    out[:, 3:] = (7 * keys + 3 * writer + version)[:, None]
    return out


class Workers:
    """Starts worker processes on one segment name; kills leftovers by PID."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, role: str, *args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, WORKER, role, self.name, str(SIZE), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        return proc.stdout.readline().strip()

    def result(self, proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, int]:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out
        result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
        return result

    def run(self, role: str, *args: object) -> dict[str, int]:
        return self.result(self.start(role, *args))

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def workers() -> Iterator[Workers]:
    w = Workers(unique_name("hps_test_mp"))
    yield w
    w.kill_all()
    for suffix in ("", ".lock", ".users", ".turn"):
        path = f"/dev/shm/{w.name}{suffix}"
        if os.path.exists(path):
            os.unlink(path)


def _parent(w: Workers, **kw: object) -> SharedHashMapStore:
    store = SharedHashMapStore(w.name, SIZE, **kw)  # type: ignore[arg-type]
    store.open_table(SPEC)
    return store


def test_one_writer_many_readers(workers: Workers) -> None:
    parent = _parent(workers)
    assert workers.run("write") == {"size": 1000}
    readers = [workers.start("read") for _ in range(3)]
    for proc in readers:
        assert workers.result(proc) == {"found": 1000, "whole": 1000}
    values, found = parent.fetch(SPEC.name, KEYS)
    assert found.all()
    np.testing.assert_array_equal(values, _rows(KEYS, 0, 1))
    parent.close()


def test_concurrent_writers_and_readers_never_see_torn_rows(workers: Workers) -> None:
    parent = _parent(workers)
    procs = [workers.start("churn-write", i, 2.0) for i in (1, 2)]
    procs += [workers.start("churn-read", 0, 2.0) for _ in range(2)]
    results = [workers.result(p) for p in procs]
    assert all(r["ops"] > 0 for r in results), results
    assert sum(r["bad"] for r in results) == 0, results
    values, found = parent.fetch(SPEC.name, KEYS)
    assert 0 < found.sum() <= 1000
    check = 7 * values[:, 0] + 3 * values[:, 1] + values[:, 2]
    assert (values[found, 0] == KEYS[found]).all()
    assert (values[found, 3:] == check[found, None]).all()
    stats = parent.stats()
    table = stats["tables"][SPEC.name]
    assert table["extents"] + stats["free_extents"] == stats["extents"]
    parent.close()


def test_removing_the_lock_file_under_running_processes_tears_no_row(workers: Workers) -> None:
    """``<name>.lock`` removed again and again while three writers and two readers run:
    processes that follow or open afterwards lock a new ``.lock`` while the others still
    hold the old one; the segment's own lock keeps them apart (before: IndexErrors and
    rows of other keys)."""
    parent = _parent(workers)
    procs = [workers.start("churn-write", i, 3.0) for i in (1, 2, 3)]
    procs += [workers.start("churn-read", 0, 3.0) for _ in range(2)]
    for _ in range(12):
        time.sleep(0.25)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parent.path + ".lock")
    results = [workers.result(p, timeout=30) for p in procs]
    assert all(r["ops"] > 0 for r in results), results
    assert sum(r["bad"] for r in results) == 0, results
    parent.close()


def test_reader_killed_holding_the_lock_does_not_block_writers(workers: Workers) -> None:
    parent = _parent(workers)
    reader = workers.start("hold-read")
    assert workers.line(reader) == "locked"
    fd = os.open(parent.path + ".lock", os.O_RDWR)
    with pytest.raises(BlockingIOError):  # the reader really holds it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    os.kill(reader.pid, signal.SIGKILL)
    reader.wait()
    start = time.monotonic()
    parent.insert(SPEC.name, KEYS, _rows(KEYS, 0, 1))
    took = time.monotonic() - start
    # Hang guard: a lock left to a dead reader would block this insert for ever; it takes
    # 2 ms when the lock went with the reader.
    assert took < 5, f"{took:.2f}s"
    assert parent.fetch(SPEC.name, KEYS)[1].all()
    parent.close()


def test_writer_killed_mid_update_leaves_a_usable_segment(workers: Workers) -> None:
    parent = _parent(workers)
    parent.insert(SPEC.name, KEYS, _rows(KEYS, 0, 1))
    writer = workers.start("hold-write")
    assert workers.line(writer) == "locked"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    _, found = parent.fetch(SPEC.name, KEYS)  # the half-changed table is cleared, not trusted
    assert not found.any() and parent.size(SPEC.name) == 0
    stats = parent.stats()
    assert stats["repairs"] == 1 and stats["free_extents"] == stats["extents"]
    parent.insert(SPEC.name, KEYS, _rows(KEYS, 0, 2))
    assert workers.run("read") == {"found": 1000, "whole": 1000}
    parent.close()


def test_auto_remove_when_the_last_user_leaves(workers: Workers) -> None:
    clean, killed, leaver = (workers.start("attach") for _ in range(3))
    for proc in (clean, killed, leaver):
        assert workers.line(proc) == "attached"
    parent = _parent(workers)
    path = parent.path
    assert parent.stats()["attached"] == 4
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert leaver.stdin is not None and clean.stdin is not None
    leaver.stdin.write("exit\n")  # interpreter exit without close(): nothing unlinks
    leaver.stdin.flush()
    assert leaver.wait(timeout=30) == 0
    parent.insert(SPEC.name, KEYS, _rows(KEYS, 0, 1))
    parent.close()  # one user (clean) is still attached
    assert os.path.exists(path)
    assert workers.run("read") == {"found": 1000, "whole": 1000}
    clean.stdin.write("close\n")
    clean.stdin.flush()
    assert clean.wait(timeout=30) == 0
    assert not any(os.path.exists(path + s) for s in ("", ".lock", ".users", ".turn"))


def test_overflow_margin_evicts_for_every_process(workers: Workers) -> None:
    parent = _parent(workers, overflow_policy="evict_oldest")
    parent.insert(SPEC.name, KEYS, _rows(KEYS, 0, 1))
    assert workers.run("margin", 1500) == {"size": 1200}  # 2000 rows > 1500: down to 80%
    assert parent.size(SPEC.name) == 1200
    _, old = parent.fetch(SPEC.name, KEYS)
    _, new = parent.fetch(SPEC.name, np.arange(10_000, 11_000, dtype=np.int64))
    assert old.sum() == 200 and new.all()  # the oldest rows went
    parent.close()


def test_a_full_segment_evicts_from_the_largest_table_of_any_process(workers: Workers) -> None:
    parent = _parent(workers, overflow_policy="evict_random")
    keys = np.arange(1_000_000, 1_150_000, dtype=np.int64)
    parent.insert(SPEC.name, keys, _rows(keys, 0, 1))
    assert parent.size(SPEC.name) == keys.size
    got = workers.run("fill", 120_000)
    assert got["last"] == 10_000 and got["size"] > 60_000
    assert parent.size(SPEC.name) < keys.size  # the parent's table gave way
    values, found = parent.fetch(SPEC.name, keys)
    np.testing.assert_array_equal(values[found], _rows(keys[found], 0, 1))
    stats = parent.stats()
    assert stats["free_extents"] + stats["tables"][SPEC.name]["extents"] < stats["extents"]
    parent.close()


def test_bench_reports_every_measure() -> None:
    import argparse

    from hps.bench import shm

    parser = argparse.ArgumentParser()
    shm.add_arguments(parser)
    args = parser.parse_args(["--rows", "3000", "--dim", "4", "--batch", "256", "--repeats",
                              "2", "--seconds", "0.2"])  # fmt: skip
    rows = {r["op"]: r for r in shm.run(args)}
    assert set(rows) == {"fetch", "insert", "memory", "fetch_processes"}
    assert rows["fetch"]["keys_per_s"] > 0 and rows["fetch"]["ratio"] > 0
    assert rows["memory"]["raw_bytes_per_row"] == 24
    assert rows["fetch_processes"]["one_process_keys_per_s"] > 0
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("hps_bench_")]
