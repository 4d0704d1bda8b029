"""The shared L2's files removed while two processes use it and one writes
(docs/multi_process_hash_map.md).

Real processes (``shm_follow_worker.py``) over a real segment and a real RocksDB L3: the
writer plays ``hps consume``, the reader a serving instance. After the files are removed,
both must end up on the one segment the name points at, holding L3's rows, and a process
opening the name must see all of them. Waits are hang guards, not timing assertions.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.storage._shm_segment import path_identity
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.storage.rocks_db import RocksDBStore
from tests.helpers import unique_name
from tests.integration.storage.shm_follow_worker import SPEC

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("shm_follow_worker.py"))
SIZE = 32 * 1024 * 1024
ROWS = 15_000
GUARD_S = 120  # a hang guard only


class Proc:
    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, WORKER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self) -> str:
        assert self.p.stdout is not None
        poller = select.poll()  # not select(): it refuses descriptors numbered 1024 and up
        poller.register(self.p.stdout, select.POLLIN)
        assert poller.poll(GUARD_S * 1000), "worker hung"
        return self.p.stdout.readline().strip()

    def finish(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("close\n")
        self.p.stdin.flush()
        assert self.p.wait(GUARD_S) == 0

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()


@pytest.fixture
def name() -> Iterator[str]:
    n = unique_name("hps_follow_it")
    yield n
    for suffix in ("", ".lock", ".users", ".turn"):
        path = f"/dev/shm/{n}{suffix}"
        if os.path.exists(path):
            os.unlink(path)


def test_removed_files_leave_every_process_on_one_new_segment_with_l3s_rows(
    name: str, tmp_path: Path
) -> None:
    l3 = str(tmp_path / "l3")
    writer = Proc("writer", name, str(SIZE), l3, "6")
    reader = Proc("reader", name, str(SIZE), l3, "6")
    try:
        assert writer.line() == "ready"
        assert reader.line() == "ready"
        time.sleep(1)
        path = f"/dev/shm/{name}"
        before = path_identity(path)
        for suffix in ("", ".lock", ".users", ".turn"):
            os.unlink(path + suffix)
        w, r = json.loads(writer.line()), json.loads(reader.line())
        now = path_identity(path)
        assert now is not None and now != before
        assert tuple(w["identity"]) == tuple(r["identity"]) == now
        assert w["generation"] == r["generation"] == 1 and w["recoveries"] == 1
        assert w["problem"] is None and r["problem"] is None
        # a process opening by name sees all rows, and they are L3's
        fresh = SharedHashMapStore(name, SIZE, identity_check_s=None)
        fresh.open_table(SPEC)
        keys = np.arange(ROWS, dtype=np.int64)
        got, found = fresh.fetch("m.t", keys)
        assert int(found.sum()) == ROWS
        truth = RocksDBStore(l3, mode="read_only")
        truth.open_table(SPEC)
        want, in_l3 = truth.fetch("m.t", keys)
        assert in_l3.all()
        np.testing.assert_array_equal(got, want)
        assert int(want[:, 1].max()) == w["versions"]  # updates went on after the removal
        truth.close()
        writer.finish()
        reader.finish()
        fresh.close()
    finally:
        writer.kill()
        reader.kill()
