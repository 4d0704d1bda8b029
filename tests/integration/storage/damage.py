"""A real RocksDB L3 with one damaged data block (tests of faults reported: docs/reliability.md).

:func:`damaged_l3` writes a table through :class:`hps.storage.rocks_db.RocksDBStore`,
flushes and compacts it into one SST file (rocksdict), then flips bytes in the middle of
one data block. Which keys the block held is found by reading each key alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import rocksdict as rd

from hps.storage.rocks_db import RocksDBStore
from hps.types import TableSpec


def write_table(path: Path, spec: TableSpec, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` random float32 rows of keys 0..rows-1 (incompressible: ~4 KB blocks),
    flushed and compacted into SST files; the vectors."""
    vectors = np.random.default_rng(seed).standard_normal((rows, spec.dim)).astype(np.float32)
    store = RocksDBStore(str(path))
    store.open_table(spec)
    store.insert(spec.name, np.arange(rows, dtype=np.int64), vectors)
    store.close()
    opts = rd.Options(raw_mode=True)
    cfs = {cf: rd.Options(raw_mode=True) for cf in rd.Rdict.list_cf(str(path), opts)}
    db = rd.Rdict(str(path), opts, column_families=cfs)
    cf = db.get_column_family(spec.name)
    db.flush()
    cf.flush()
    cf.compact_range(None, None)
    db.close()
    return vectors


def damage(path: Path, spec: TableSpec, rows: int) -> np.ndarray:
    """Flip 16 bytes at 40% of the table's largest SST file (in its data blocks); the keys
    that can no longer be read, each read alone."""
    ssts = sorted(path.glob("*.sst"), key=lambda p: p.stat().st_size)
    target = ssts[-1]
    at = int(target.stat().st_size * 0.4)
    with open(target, "r+b") as fh:
        fh.seek(at)
        raw = fh.read(16)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in raw))
        fh.flush()
        os.fsync(fh.fileno())
    return unreadable(path, spec, rows)


def unreadable(path: Path, spec: TableSpec, rows: int) -> np.ndarray:
    """The keys of 0..rows-1 whose lone read fails."""
    opts = rd.Options(raw_mode=True)
    cfs = {cf: rd.Options(raw_mode=True) for cf in rd.Rdict.list_cf(str(path), opts)}
    db = rd.Rdict(str(path), opts, column_families=cfs, access_type=rd.AccessType.read_only())
    cf = db.get_column_family(spec.name)
    bad = []
    try:
        for key in range(rows):
            try:
                cf.get(int(key).to_bytes(8, "little"))
            except Exception:
                bad.append(key)
    finally:
        db.close()
    return np.array(bad, dtype=np.int64)
