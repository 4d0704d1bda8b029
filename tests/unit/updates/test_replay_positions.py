"""Catchup.run when the broker cannot say the consumer's positions: the replay waits for
the next pass (still owed), and the consumer loop that called it carries on."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from hps.errors import BackendUnavailable
from hps.updates.replay import Catchup, Rollouts


def test_unreadable_positions_leave_the_replay_owed(caplog: pytest.LogCaptureFixture) -> None:
    router = SimpleNamespace(watch=SimpleNamespace(points={}))
    rollouts = Rollouts(None)
    catchup = Catchup(
        router,  # type: ignore[arg-type]
        rollouts,
        replayer=None,  # type: ignore[arg-type]
        accept=lambda spec: True,
        max_rows=100,
        max_version_ahead_s=300.0,
    )
    rollouts.due.add(("m", 2))

    def positions() -> dict[tuple[str, int], int]:
        raise BackendUnavailable("kafka: reading committed offsets: _TIMED_OUT")

    applied: list[object] = []
    catchup.run(positions, lambda b: applied.append(b) is None, lambda: None, threading.Event())
    assert rollouts.due == {("m", 2)} and applied == []
    assert "replays wait: the consumer's positions cannot be read" in caplog.text
