"""The segment's lock files on their own: the last user is the one that may remove them."""

from __future__ import annotations

import fcntl
from pathlib import Path

from hps.storage._shm_locks import SegmentLocks


def test_the_last_user_may_remove_the_files(tmp_path: Path) -> None:
    path = str(tmp_path / "segment")
    Path(path).touch()
    a, b = SegmentLocks(path), SegmentLocks(path)
    with a.held(fcntl.LOCK_EX):
        assert not a.only_user()  # b is attached
    b.close()
    with a.held(fcntl.LOCK_EX):
        assert a.only_user()
        a.remove_files()
    a.close()
    assert not any(Path(p).exists() for p in a.paths)
    assert not a.forked
