"""One ``hps serve`` per state dir: a second one is refused, naming the first one's PID."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hps.errors import ConfigError
from hps.triton.supervisor.serve_lock import LOCK_FILE, hold_state_dir


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    state = tmp_path / "state"  # created on the way
    with hold_state_dir(state) as held:
        assert held == state / LOCK_FILE and held.read_text() == f"{os.getpid()}\n"
        with (
            pytest.raises(ConfigError, match=rf"another hps serve \(pid {os.getpid()}\) serves"),
            hold_state_dir(state),
        ):
            pass
        assert held.read_text() == f"{os.getpid()}\n"  # the refused one wrote nothing
    with hold_state_dir(state) as again:  # released: the next one takes it
        assert again == held


def test_a_folder_that_cannot_be_written_holds_no_lock(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with hold_state_dir(tmp_path / "file" / "state") as held:
        assert held is None
