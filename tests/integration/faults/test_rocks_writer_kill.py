"""The RocksDB writer SIGKILLed mid-stream: nothing it reported as applied is lost.

A child process applies a deterministic stream of upserts and deletes through the real
Applier into RocksDB and prints each batch once ``apply`` has returned. It is SIGKILLed
at random points (mid-write included); after each kill the database, reopened, must hold
every reported batch (the batch in flight may be there in part), and a restart from the
first unreported batch (a replay, as Kafka would redeliver) ends in the exact state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from hps.storage.rocks_db import RocksDBStore
from tests.integration.faults.rocks_writer import KEYS, SPEC, batch, expected

pytestmark = pytest.mark.integration

KILLS = 6
TOTAL = 600  # batches in the stream (at least)
ENDLESS = 10**6  # the stream of a writer that is to be killed
WRITER = Path(__file__).with_name("rocks_writer.py")


def _start(db: Path, start: int, end: int = TOTAL) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(db), str(start), str(end)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def _read_all(db: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    store = RocksDBStore(str(db), mode="read_only")
    try:
        store.open_table(SPEC)
        keys = np.arange(KEYS, dtype=np.int64)
        values, found = store.fetch(SPEC.name, keys)
        return keys, values, found
    finally:
        store.close()


def _check(db: Path, acked: int) -> None:
    """Every batch < acked is in; batch ``acked`` (in flight at the kill) may be, per key."""
    keys, values, found = _read_all(db)
    before, after = expected(acked), expected(acked + 1)
    inflight = set(batch(acked).keys.tolist())
    for k in keys.tolist():
        options = [before.get(k)] + ([after.get(k)] if k in inflight else [])
        got = values[k] if found[k] else None
        assert any(
            (o is None and got is None) or (o is not None and got is not None
                                            and np.array_equal(o, got))
            for o in options
        ), f"key {k} after {acked} acknowledged batches: {got} not in {options}"  # fmt: skip


def test_sigkilled_rocksdb_writer_loses_no_applied_update(tmp_path: Path) -> None:
    db = tmp_path / "rocks"
    rng = np.random.default_rng(11)
    acked, kills = 0, []
    for _ in range(KILLS):
        proc = _start(db, acked, ENDLESS)  # it cannot finish before its kill, however slow we are
        # Killed after a random number of acknowledged batches, plus a random delay, so the
        # kill lands mid-stream however fast the machine is (often mid-write).
        after = int(rng.integers(5, 60))
        killer = threading.Timer(rng.uniform(0.0, 0.05), proc.send_signal, (signal.SIGKILL,))
        assert proc.stdout is not None
        last = acked - 1
        for line in proc.stdout:  # every line it printed before dying was applied
            last = int(line.split()[1])
            if last - acked + 1 == after:
                killer.start()
        assert proc.wait(10) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
        killer.join()
        acked = last + 1
        kills.append(acked)
        _check(db, acked)
    total = max(TOTAL, acked)
    proc = _start(db, acked, total)  # the replay from the first unacknowledged batch
    assert proc.wait(120) == 0
    keys, values, found = _read_all(db)
    final = expected(total)
    assert found.sum() == len(final)
    np.testing.assert_array_equal(values[found], np.stack([final[k] for k in keys[found].tolist()]))
    print(f"\nRocksDB writer SIGKILLed {KILLS} times after batches {kills}: nothing lost")
