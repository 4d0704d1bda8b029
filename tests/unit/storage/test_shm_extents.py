"""The segment's extents on their own: a stack of free ids, committed on first use (the
store's tests cover them through multi_process_hash_map)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hps.storage._shm_extents import Extents
from hps.storage._shm_layout import HeaderWord, NoSpace

N, EXTENT, DATA_OFF = 8, 4096, 4096


def extents(tmp_path: Path) -> Extents:
    h = np.zeros(len(HeaderWord), dtype=np.int64)
    h[HeaderWord.N_EXT], h[HeaderWord.EXTENT], h[HeaderWord.DATA_OFF] = N, EXTENT, DATA_OFF
    path = str(tmp_path / "segment")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    ext = Extents(h, np.zeros(N, dtype=np.int32), fd, path)
    ext.reset()
    return ext


def test_alloc_free_and_commit_on_first_use(tmp_path: Path) -> None:
    ext = extents(tmp_path)
    first = ext.alloc(3)
    assert first.tolist() == [0, 1, 2] and ext.n_free == N - 3
    assert os.fstat(ext.fd).st_size == DATA_OFF + 3 * EXTENT  # committed up to the last id
    assert ext.offset(first).tolist() == [DATA_OFF + i * EXTENT for i in range(3)]
    ext.free(first[1:])
    assert ext.n_free == N - 1 and sorted(ext.alloc(2).tolist()) == [1, 2]
    with pytest.raises(NoSpace):
        ext.alloc(N)


def test_keep_only_frees_everything_else(tmp_path: Path) -> None:
    ext = extents(tmp_path)
    ext.alloc(N)
    ext.keep_only(np.array([2, 5], dtype=np.int64))
    assert ext.n_free == N - 2
    assert sorted(ext.alloc(N - 2).tolist()) == [0, 1, 3, 4, 6, 7]
