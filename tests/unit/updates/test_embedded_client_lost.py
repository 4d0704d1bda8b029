"""The embedded applier outlives a Kafka client's fatal error: it makes a new client, which
reads the topics again (hps.updates.embedded; a stand-in message source)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hps.build import build_session
from hps.errors import BackendUnavailable, ClientLost
from hps.updates import embedded
from hps.updates.embedded import start_background_applier
from tests.helpers import make_config


class Source:
    """A message source whose first client is lost at its first poll."""

    made: list[Source] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.closed = False
        self.polls = 0
        self.lost = not Source.made
        Source.made.append(self)
        self.polled = threading.Event()

    def poll(self, timeout_s: float) -> None:
        self.polls += 1
        self.polled.set()
        if self.lost:
            raise ClientLost("kafka: fatal consumer error: _FENCED: fenced by another member")
        threading.Event().wait(min(timeout_s, 0.01))

    def close(self) -> None:
        self.closed = True


def test_a_lost_client_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "MessageSource", Source)
    monkeypatch.setattr("hps.updates.runtime.RETRY_S", 0.01)
    Source.made = []
    config = make_config(
        tmp_path, update_source={"type": "kafka_message_queue", "brokers": "127.0.0.1:1"}
    )
    session = build_session(config, with_cache=False)
    thread = start_background_applier(session, config)
    try:
        assert Source.made[0].polled.wait(10)
        for _ in range(6000):  # a hang guard: a busy machine may take seconds
            if len(Source.made) == 2 and Source.made[1].polled.is_set():
                break
            threading.Event().wait(0.01)
        assert len(Source.made) == 2, f"{len(Source.made)} clients made"
        first, second = Source.made
        assert first.closed and first.polls == 1  # never polled again once lost
        assert second.polled.is_set() and not second.closed
        assert isinstance(thread.error, ClientLost) and thread.errors == 1
    finally:
        thread.stop()
        session.close()
    assert Source.made[1].closed  # the thread closes the client it holds at its end


class FailingOnce(Source):
    """The first client is lost; making its replacement fails once (the broker away)."""

    attempts = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        FailingOnce.attempts += 1
        if FailingOnce.attempts == 2:
            raise BackendUnavailable("kafka: creating topics: _TRANSPORT: broker down")
        super().__init__(*args, **kwargs)


def test_a_replacement_that_cannot_be_made_yet_is_made_at_a_later_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost client is never polled again, whatever the making of the next one says."""
    monkeypatch.setattr(embedded, "MessageSource", FailingOnce)
    monkeypatch.setattr("hps.updates.runtime.RETRY_S", 0.01)
    Source.made, FailingOnce.attempts = [], 0
    config = make_config(
        tmp_path, update_source={"type": "kafka_message_queue", "brokers": "127.0.0.1:1"}
    )
    session = build_session(config, with_cache=False)
    thread = start_background_applier(session, config)
    try:
        for _ in range(6000):
            if len(Source.made) == 2 and Source.made[1].polled.is_set():
                break
            threading.Event().wait(0.01)
        assert len(Source.made) == 2, f"{len(Source.made)} clients made"
        first, second = Source.made
        assert FailingOnce.attempts == 3
        assert first.closed and first.polls == 1
        assert second.polled.is_set() and not second.closed
    finally:
        thread.stop()
        session.close()
