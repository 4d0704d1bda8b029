"""What a reader or writer is told when L3's folder cannot be opened: not a folder, not
readable by this user (naming the path and the uid), held by another writer (its PID)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hps.errors import BackendError
from hps.storage import rocks_open
from hps.storage.rocks_db import RocksDBStore

HOLD = """
import sys
from hps.storage.rocks_db import RocksDBStore
store = RocksDBStore(sys.argv[1])
print("holding", flush=True)
sys.stdin.read()
store.close()
"""


@pytest.mark.parametrize("mode", ["read_only", "secondary", "read_write"])
def test_an_l3_path_that_is_a_file_is_not_a_folder(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "rocksdb"
    path.write_text("")
    with pytest.raises(BackendError, match="is not a folder") as err:
        RocksDBStore(str(path), mode=mode)  # type: ignore[arg-type]
    assert "run hps import" not in str(err.value)
    with pytest.raises(BackendError, match="is not a folder: a part of it is a file"):
        RocksDBStore(str(path / "inner"), mode=mode)  # type: ignore[arg-type]


def test_an_unreadable_l3_folder_says_permission_denied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rocksdb"
    RocksDBStore(str(path)).close()
    real = os.access
    monkeypatch.setattr(  # as a user other than the folder's owner (tests may run as root)
        rocks_open.os, "access", lambda p, m: False if str(p) == str(path) else real(p, m)
    )
    with pytest.raises(BackendError) as err:
        RocksDBStore(str(path), mode="read_only")
    assert f"permission denied (reading {path} as uid {os.getuid()}" in str(err.value)
    assert "run hps import" not in str(err.value)


def test_a_file_this_user_may_not_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rocksdb"
    RocksDBStore(str(path)).close()
    current = path / "CURRENT"
    real = os.access
    monkeypatch.setattr(
        rocks_open.os, "access", lambda p, m: False if str(p) == str(current) else real(p, m)
    )
    why = rocks_open._explained(str(path), "read_only", "IO error: Permission denied (os error 13)")
    assert why.startswith(f"permission denied (reading {current}, owned by uid ")
    assert why.endswith("(IO error: Permission denied (os error 13))")


def test_a_second_writer_is_told_which_process_holds_the_l3(tmp_path: Path) -> None:
    path = tmp_path / "rocksdb"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        with pytest.raises(BackendError) as err:
            RocksDBStore(str(path))
        message = str(err.value)
        assert f"the L3 is held by another writer (process {holder.pid}: " in message
        assert "hps serve, hps consume or hps import" in message
        assert rocks_open.lock_holder(str(path / "LOCK")) == holder.pid
    finally:
        holder.communicate("")
    assert rocks_open.lock_holder(str(path / "LOCK")) is None
    RocksDBStore(str(path)).close()  # released: opens again
