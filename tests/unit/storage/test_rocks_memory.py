"""rocks_db's memory is bounded for the whole database, not per table: one memtable budget
(``hps_write_buffer_mb``) and one block cache for every column family, and a WAL kept under
twice the budget (a secondary re-reads it on each catch-up)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np

from hps.storage.rocks_db import RocksDBStore
from hps.types import TableSpec


def _bytes(path: Path, suffix: str) -> tuple[int, int]:
    """Files and bytes; background flushes delete WAL files while we look."""
    count = size = 0
    for f in path.iterdir():
        if f.name.endswith(suffix):
            with contextlib.suppress(FileNotFoundError):
                size += f.stat().st_size
                count += 1
    return count, size


def test_memtables_of_all_tables_share_one_budget(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksDBStore(str(path), write_buffer_mb=1, block_cache_mb=1)
    specs = [TableSpec("m", f"t{i}", 16) for i in range(26)]
    for spec in specs:
        store.open_table(spec)
    rng = np.random.default_rng(0)
    for _ in range(8):  # about 19 MB of rows over 26 tables: 0.7 MB each, < 64 MB apiece
        for spec in specs:
            keys = rng.choice(1 << 40, 1000, replace=False)
            values = rng.standard_normal((1000, 16), np.float32)
            store.insert(spec.name, keys, values)
    # RocksDB's defaults (64 MiB per table) would flush nothing and keep all 19 MB in the WAL.
    # Flushes run in the background: on a busy machine they may still be running, so wait
    # for them (a hang guard; they take milliseconds on an idle one).
    deadline = time.monotonic() + 60
    while True:
        ssts, _ = _bytes(path, ".sst")
        _, wal = _bytes(path, ".log")
        if (ssts > 0 and wal < 8 << 20) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ssts > 0 and wal < 8 << 20, (ssts, wal)
    got, found = store.fetch(specs[-1].name, keys)  # flushed or not, every row reads back
    assert found.all()
    np.testing.assert_array_equal(got, values)
    store.close()
