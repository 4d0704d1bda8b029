"""Files replaced whole (hps.io.durable): the new content or the old, and errors that name
the file asked for, not the hidden temporary beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.cli import os_error_text
from hps.io.durable import replace_durably, replacing


def test_the_content_is_replaced_and_no_temporary_is_left(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old")
    replace_durably(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_failed_block_leaves_the_old_content(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as (f,):
        f.write(b"half")
        raise RuntimeError("stopped")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_missing_folder_is_named_by_the_path_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "nodir" / "keys.npy"
    with pytest.raises(FileNotFoundError) as err, replacing(path):
        pass
    assert os_error_text(err.value) == f"{path}: No such file or directory"
